// Memory operations exist only on BoundDevice, never on Device.
// Fix: `ctx.bind(&dev)?.alloc_zeros::<f32>(16)`.
use gpubind::Device;

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let _buf = dev.alloc_zeros::<f32>(16)?;
    Ok(())
}

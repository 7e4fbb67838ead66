// A shared view cannot be the destination of a copy; take `slice_mut` for writes.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let buf = gpu.alloc_zeros::<f32>(8)?;
    let mut view = buf.slice(0..4)?;
    gpu.htod_copy(&[1.0f32; 4], &mut view)?;
    Ok(())
}

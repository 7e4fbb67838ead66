// A view borrows its slice: it cannot outlive the memory it points into.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let view = {
        let buf = gpu.alloc_zeros::<f32>(8)?;
        buf.slice(0..4)?
    };
    let _ = gpu.dtoh(&view)?;
    Ok(())
}

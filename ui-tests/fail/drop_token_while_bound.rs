// The token cannot be dropped while a BoundDevice borrows it.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    drop(ctx);
    let _buf = gpu.alloc_zeros::<u8>(1)?;
    Ok(())
}

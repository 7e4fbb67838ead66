// Only plain data with no invalid bit patterns crosses to the device; use u8 for flags.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let _flags = gpu.alloc_zeros::<bool>(8)?;
    Ok(())
}

// A capture handle has no synchronous operations: synchronising a capturing stream would
// invalidate the capture, so `synchronize` does not exist there.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let _graph = gpu.capture(|c| c.synchronize())?;
    Ok(())
}

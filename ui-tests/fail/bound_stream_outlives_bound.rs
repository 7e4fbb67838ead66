// A BoundStream borrows the BoundDevice: it cannot outlive the binding.
// Fix: keep the `Stream` (it outlives binds) and call `gpu.on(&stream)` under each binding.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let stream = ctx.bind(&dev)?.new_stream()?;
    let s = {
        let gpu = ctx.bind(&dev)?;
        gpu.on(&stream)?
    };
    s.synchronize()?;
    Ok(())
}

// A Stream is a resource: enqueueing on it needs the binding (`gpu.on(&stream)?`).
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let stream = ctx.bind(&dev)?.new_stream()?;
    stream.synchronize()?;
    Ok(())
}

// The fix for two_bound_devices.rs: one binding per block (or per loop iteration), and
// the stream-outlives-bind fix: keep the Stream, re-borrow it under each binding.
use gpubind::{Device, Error, ThreadContext};

fn run() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let stream = {
        let gpu = ctx.bind(&dev)?;
        gpu.new_stream()?
    };
    {
        let gpu = ctx.bind(&dev)?;
        gpu.on(&stream)?.synchronize()?;
    }
    {
        let gpu = ctx.bind(&dev)?;
        gpu.on(&stream)?.synchronize()?;
    }
    Ok(())
}

fn main() {
    match run() {
        Err(Error::NoDriver) => println!("SKIPPED: no CUDA driver; compiled, nothing run"),
        other => other.unwrap(),
    }
}

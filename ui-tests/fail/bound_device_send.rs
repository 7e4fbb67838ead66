// A BoundDevice proves the binding of *this* thread; it cannot be sent elsewhere.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    std::thread::scope(|s| {
        s.spawn(move || gpu.synchronize());
    });
    Ok(())
}

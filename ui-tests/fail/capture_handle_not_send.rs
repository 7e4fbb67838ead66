// A capture is ended on the thread that began it: its handle cannot go to another thread.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let x = gpu.alloc_zeros::<u32>(8)?;
    let _graph = gpu.capture(|c| {
        std::thread::scope(|s| {
            s.spawn(|| c.memset(&x, 1u32)).join().unwrap()
        })
    })?;
    Ok(())
}

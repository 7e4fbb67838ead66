// A buffer used by a graph must outlive the graph: one made inside the capture closure
// (freed when the closure returns) cannot be captured.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let graph = gpu.capture(|c| {
        let tmp = gpu.alloc_zeros::<u32>(8)?;
        c.memset(&tmp, 1u32)
    })?;
    let _exec = graph.instantiate()?;
    Ok(())
}

// A graph borrows every buffer it uses: the buffer cannot be dropped while the graph (or
// an executable graph made from it) may still run.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let x = gpu.alloc_zeros::<u32>(8)?;
    let graph = gpu.capture(|c| c.memset(&x, 7u32))?;
    let exec = graph.instantiate()?;
    drop(x);
    exec.launch(&gpu.default_stream())?;
    Ok(())
}

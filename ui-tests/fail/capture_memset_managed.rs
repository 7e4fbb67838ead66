// A graph writes the buffers it borrows shared, ordered by their trackers at each launch;
// managed memory can be read by the host without its tracker (`as_slice`), so a captured
// memset or copy into it is refused.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let m = gpu.alloc_managed::<u32>(8)?;
    let _graph = gpu.capture(|c| c.memset(&m, 1u32))?;
    Ok(())
}

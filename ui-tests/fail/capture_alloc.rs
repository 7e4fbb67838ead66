// A capture handle cannot allocate: a (non-async) allocation is not stream-ordered and
// would not be replayed by the graph. Allocate before the capture.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let _graph = gpu.capture(|c| {
        let _tmp = c.alloc_zeros::<f32>(8)?;
        Ok(())
    })?;
    Ok(())
}

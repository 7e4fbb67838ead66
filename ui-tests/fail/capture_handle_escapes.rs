// The capture handle lives only inside the closure: it cannot be kept to enqueue into the
// graph after the capture has ended.
use gpubind::{Capture, Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let x = gpu.alloc_zeros::<u32>(8)?;
    let mut kept: Option<&mut Capture<'_, '_>> = None;
    let _graph = gpu.capture(|c| {
        kept = Some(c);
        Ok(())
    })?;
    kept.unwrap().memset(&x, 1u32)?;
    Ok(())
}

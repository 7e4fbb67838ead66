// A capture handle cannot copy to the host: a graph's work runs later, so a copy whose
// result is returned now cannot be captured.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let x = gpu.alloc_zeros::<f32>(8)?;
    let _graph = gpu.capture(|c| {
        let _host: Vec<f32> = c.dtoh(&x)?;
        Ok(())
    })?;
    Ok(())
}

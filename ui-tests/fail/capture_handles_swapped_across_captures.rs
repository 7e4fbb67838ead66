// Two captures' handles cannot be exchanged (each records into its own graph): their
// lifetimes are distinct, so `swap` does not type-check.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let _outer = gpu.capture(|a| {
        let _inner = gpu.capture(|b| {
            std::mem::swap(a, b);
            Ok(())
        })?;
        Ok(())
    })?;
    Ok(())
}

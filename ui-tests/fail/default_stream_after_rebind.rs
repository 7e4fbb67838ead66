// While a stream borrowed from one binding is alive, the token cannot bind again.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let (d0, d1) = (Device::get(0)?, Device::get(1)?);
    let mut ctx = ThreadContext::acquire()?;
    let gpu0 = ctx.bind(&d0)?;
    let s0 = gpu0.default_stream();
    let _gpu1 = ctx.bind(&d1)?;
    s0.synchronize()?;
    Ok(())
}

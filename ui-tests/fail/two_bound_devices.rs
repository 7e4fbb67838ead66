// Two live BoundDevices from one token: the second bind needs `ctx` mutably while the
// first still borrows it. Fix: end the first binding (its last use) before the next bind.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let mut ctx = ThreadContext::acquire()?;
    let (d0, d1) = (Device::get(0)?, Device::get(1)?);
    let a = ctx.bind(&d0)?;
    let b = ctx.bind(&d1)?;
    let _x = a.alloc_zeros::<f32>(4)?;
    let _y = b.alloc_zeros::<f32>(4)?;
    Ok(())
}

// A shared module is never `&mut`, so it cannot make a global view: its kernels' launches
// must not switch from reads to writes while one is being built. Look globals up on the
// `Module` before `into_shared`.
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let shared = gpu.load_ptx("")?.into_shared();
    let k = shared.kernel("k")?;
    let g = shared.global::<u32>("g")?;
    println!("{} {}", k.name(), g.name());
    Ok(())
}

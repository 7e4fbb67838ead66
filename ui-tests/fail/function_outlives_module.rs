// A Function borrows its Module: it cannot outlive it (the module would be unloaded).
use gpubind::{Device, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let f = {
        let module = gpu.load_ptx("")?;
        module.function("k")?
    };
    println!("{}", f.name());
    Ok(())
}

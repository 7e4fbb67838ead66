// Launching needs a live binding: a stream of a dropped BoundDevice cannot launch.
use gpubind::{Device, LaunchConfig, ThreadContext};

fn main() -> gpubind::Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let module = gpu.load_ptx("")?;
    let f = module.function("k")?;
    let s = gpu.default_stream();
    drop(gpu);
    unsafe { s.launch(&f, LaunchConfig::for_num_elems(1)).launch()? };
    Ok(())
}

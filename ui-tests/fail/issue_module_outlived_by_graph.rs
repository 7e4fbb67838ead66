// A step written once for a stream and a capture (`Issue`) launches kernels whose module
// the graph borrows for its lifetime: a module dropped before the graph cannot be used,
// however generic the step.
use gpubind::{DeviceSlice, Function, Issue, KernelLaunch, LaunchConfig, Result};
use gpubind::{Device, ThreadContext};

fn bump<'buf>(
    e: &mut impl Issue<'buf>,
    f: &'buf Function<'buf>,
    x: &'buf DeviceSlice<u32>,
) -> Result<()> {
    // SAFETY: (unsigned*, unsigned) matches `bump`, which stays in bounds.
    unsafe {
        e.launch(f, LaunchConfig::for_num_elems(4))
            .arg_written(x)
            .value(4u32)
            .launch()
    }
}

fn main() -> Result<()> {
    let dev = Device::get(0)?;
    let mut ctx = ThreadContext::acquire()?;
    let gpu = ctx.bind(&dev)?;
    let x = gpu.alloc_zeros::<u32>(4)?;
    let graph = {
        let module = gpu.load_ptx("")?;
        let f = module.function("bump")?;
        bump(&mut gpu.default_stream(), &f, &x)?; // eagerly: fine
        gpu.capture(|c| bump(c, &f, &x))?
    };
    let _exec = graph.instantiate()?;
    Ok(())
}

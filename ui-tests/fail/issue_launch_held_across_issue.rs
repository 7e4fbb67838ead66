// A kernel launch being built through `Issue::launch` borrows its issuer mutably (in a
// capture, the launch records into the capture when launched): nothing else is issued
// until it is launched or dropped, so the launches stay in the order they are written.
use gpubind::{DeviceSlice, Function, Issue, KernelLaunch, LaunchConfig, Result};

fn step<'buf>(
    e: &mut impl Issue<'buf>,
    f: &'buf Function<'buf>,
    x: &'buf DeviceSlice<u32>,
) -> Result<()> {
    let mut l = e.launch(f, LaunchConfig::for_num_elems(4));
    l.arg_written(x).value(4u32);
    e.memset_zeros(x)?;
    // SAFETY: (unsigned*, unsigned) matches `f`, which stays in bounds.
    unsafe { l.launch() }
}

fn main() {}

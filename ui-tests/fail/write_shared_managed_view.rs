// A shared view of managed memory comes from `&ManagedSlice`, beside which host slices
// (`as_slice`) may be held: a launch takes it by `&` only, never as written. Writing goes
// through the exclusive view of `slice_mut`, which a launch takes by `&mut`.
use gpubind::{BoundStream, Function, LaunchConfig, ManagedSlice};

fn write_view(s: &BoundStream<'_>, fill: &Function<'_>, m: &ManagedSlice<u32>) -> gpubind::Result<()> {
    let held: &[u32] = m.as_slice()?;
    let mut view = m.slice(..)?;
    let cfg = LaunchConfig::for_num_elems(1);
    // SAFETY: (unsigned*) matches `fill`, which stays in bounds.
    unsafe { s.launch(fill, cfg).arg(&mut view).launch()? };
    println!("{}", held[0]);
    Ok(())
}

fn write_view_shared(s: &BoundStream<'_>, fill: &Function<'_>, m: &ManagedSlice<u32>) -> gpubind::Result<()> {
    let view = m.slice(..)?;
    let cfg = LaunchConfig::for_num_elems(1);
    // SAFETY: as above.
    unsafe { s.launch(fill, cfg).arg_written(&view).launch() }
}

// The fix: the exclusive view, which no host slice can be held beside.
fn write_view_mut(s: &BoundStream<'_>, fill: &Function<'_>, m: &mut ManagedSlice<u32>) -> gpubind::Result<()> {
    let mut view = m.slice_mut(..)?;
    let cfg = LaunchConfig::for_num_elems(1);
    // SAFETY: as above.
    unsafe { s.launch(fill, cfg).arg(&mut view).launch() }
}

fn main() {
    let _ = (write_view, write_view_shared, write_view_mut);
}

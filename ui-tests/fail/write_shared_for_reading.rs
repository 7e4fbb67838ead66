// A buffer shared for reading with another process is read there at the same time,
// ordered by nothing: a launch takes it by `&` only, never as written. Writing it goes
// through its `unsafe` `view_mut(range)`, whose view a launch takes by `&mut`.
use gpubind::ipc::{Shared, SharedImport};
use gpubind::{BoundStream, Capture, Function, LaunchConfig};

fn write_import(
    s: &BoundStream<'_>,
    fill: &Function<'_>,
    mut shared_import: SharedImport<u32>,
) -> gpubind::Result<()> {
    let cfg = LaunchConfig::for_num_elems(1);
    // SAFETY: (unsigned*) matches `fill`, which stays in bounds.
    unsafe { s.launch(fill, cfg).arg(&mut shared_import).launch() }
}

fn write_shared(s: &BoundStream<'_>, fill: &Function<'_>, shared: Shared<u32>) -> gpubind::Result<()> {
    let cfg = LaunchConfig::for_num_elems(1);
    // SAFETY: as above.
    unsafe { s.launch(fill, cfg).arg_written(&shared).launch() }
}

fn capture_write_shared<'buf>(
    c: &mut Capture<'_, 'buf>,
    fill: &Function<'buf>,
    shared: &'buf Shared<u32>,
) -> gpubind::Result<()> {
    let cfg = LaunchConfig::for_num_elems(1);
    // SAFETY: as above.
    unsafe { c.launch(fill, cfg).arg_written(shared).launch() }
}

fn main() {
    let _ = (write_import, write_shared, capture_write_shared);
}

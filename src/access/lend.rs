//! Open reads: a read of an allocation recorded at its start and closed at its end, with
//! the tracker unlocked in between, for work that gpubind orders only when it ends (a
//! buffer lent to cudarc from a shared borrow, `BoundStream::lend_ref_to_cudarc`: cudarc
//! may read it on any of its streams, and the lend stream is made to wait for all of
//! that only when the closure returns).
//!
//! While a read is open the stream it is recorded on does not yet follow the outside
//! work, so a write ordered after that stream alone could overtake an outside read. Hence,
//! while any read is open ([`AccessState::lends`]):
//!
//! * every **write** claim of the allocation (a launch that writes it, a copy into it, a
//!   host write, a collective's write) is refused with [`Error::InvalidArgument`] naming
//!   the lend, from any thread and from inside the lend itself: never a wait that could
//!   be a deadlock;
//! * no write is admitted without the lock: the published write id is taken back at the
//!   start (under its stream's gate, so a fast-path write in flight is enqueued before the
//!   lend's start is, and the outside work follows it), and none is published meanwhile
//!   ([`AccessState::write_is_free`]);
//! * **reads** go on as usual, on any stream and from the host, from inside the lend too:
//!   reads do not conflict with reads.
//!
//! At the end the read is recorded again on its stream (which now follows the outside
//! work): a host read, or the pruning of idle readers, may have forgotten the first
//! record meanwhile, and later writes must wait for this stream.

use super::{
    Access, AccessState, AccessTracker, Grave, Published, StreamSlot, TrackedStream, fast,
};
use crate::error::{Error, Result};
use crate::sync;

/// [`Error::InvalidArgument`] for a write of an allocation with an open read.
pub(crate) fn lent_error() -> Error {
    Error::InvalidArgument(
        "the buffer is lent to cudarc (BoundStream::lend_ref_to_cudarc) and cudarc's reads \
         are not ordered yet: a gpubind write of it (a launch writing it, a copy or fill into \
         it, a host write) is refused until the lend returns; reads of it are allowed"
            .into(),
    )
}

/// A read of one allocation on one stream, recorded and still open: see the
/// [module docs](self). Closed when dropped.
#[must_use = "the read is open until this drops"]
pub(crate) struct OpenRead<'t, 's> {
    tracker: &'t AccessTracker,
    on: StreamSlot<'s>,
}

/// Opens a read of `tracker` on `on`, whose context is current or which is a gpubind
/// stream: under the tracker's lock, refuses writes from now on, makes `on` wait for the
/// pending writes, calls `start` (which enqueues the read's start on `on`) and records
/// the read. Returns the open read and what `start` returned; on failure nothing stays
/// open.
pub(crate) fn open_read<'t, 's, V>(
    on: StreamSlot<'s>,
    tracker: &'t AccessTracker,
    start: impl FnOnce() -> Result<V>,
) -> Result<(OpenRead<'t, 's>, V)> {
    let mut grave = None;
    let started = {
        let mut st = sync::lock(&tracker.state);
        open_locked(
            &mut st,
            &tracker.published,
            on.record_id(),
            |from| from.enqueue_wait(on.raw()),
            || {
                let started = start();
                // A foreign stream's end mark follows the read's start before the
                // read is recorded.
                on.after_enqueue();
                started
            },
            |_| on.to_ref(),
            &mut grave,
        )
    };
    drop(grave);
    Ok((OpenRead { tracker, on }, started?))
}

/// [`open_read`]'s step under the tracker's lock, over any stream type (the loom model
/// `fast_path_write_is_covered_by_an_open_read_or_refused` runs it): counts the lend and
/// takes back the write id first (from here on no write is admitted without the lock,
/// and one admitted before has been enqueued: the gate), then orders `on` after the
/// pending writes (`wait`), calls `start` and records the read. On failure nothing
/// stays open.
pub(crate) fn open_locked<S: TrackedStream, V>(
    st: &mut AccessState<S>,
    published: &Published,
    on: u64,
    wait: impl FnMut(&S) -> Result<()>,
    start: impl FnOnce() -> Result<V>,
    make: impl Fn(u64) -> S,
    grave: &mut Option<Grave<S>>,
) -> Result<V> {
    st.lends += 1;
    published.close_write(st);
    let started =
        fast::order_before_enqueue(st, published, on, Access::Read, wait).and_then(|()| start());
    match started {
        Ok(v) => {
            fast::record_after_enqueue(st, published, on, Access::Read, make, grave);
            Ok(v)
        }
        Err(e) => {
            st.lends -= 1;
            Err(e)
        }
    }
}

/// [`OpenRead`]'s close under the tracker's lock, over any stream type: records the
/// read again on `on` (see the module docs) and lets writes in once no read is open.
pub(crate) fn close_locked<S: TrackedStream>(
    st: &mut AccessState<S>,
    published: &Published,
    on: u64,
    make: impl Fn(u64) -> S,
    grave: &mut Option<Grave<S>>,
) {
    st.lends = st.lends.saturating_sub(1);
    // Writes were refused while the read was open, so the writers now are among those
    // the stream waited for at the start: the read is ordered after them.
    fast::record_after_enqueue(st, published, on, Access::Read, make, grave);
}

impl Drop for OpenRead<'_, '_> {
    /// Closes the read: records it again on its stream (see the module docs) and lets
    /// writes in once no read is open.
    fn drop(&mut self) {
        let mut grave: Option<Grave<_>> = None;
        {
            let mut st = sync::lock(&self.tracker.state);
            let on = self.on;
            // A foreign stream's end mark follows the read's end (the waits enqueued
            // there for the lent work) before the read is recorded again.
            on.after_enqueue();
            close_locked(
                &mut st,
                &self.tracker.published,
                on.record_id(),
                |_| on.to_ref(),
                &mut grave,
            );
        }
        drop(grave);
    }
}

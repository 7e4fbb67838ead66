//! Joining an allocation's pending uses onto one stream, for a stream-ordered free
//! (`cuMemFreeAsync`): the free is enqueued on one stream, which first waits on the device
//! (an event and `cuStreamWaitEvent`) for every other stream with a pending use, so the
//! memory goes back to its pool only after every use, and the host never waits.

use super::state::{AccessState, Grave, TrackedStream};
use super::{AccessTracker, StreamRef};
use crate::device::Device;
use crate::error::Result;
use std::sync::Arc;

/// Where a stream-ordered free goes.
pub(crate) enum FreeOn<S> {
    /// No use is pending: any stream of the device will do.
    Anywhere,
    /// This stream, which every other stream with a pending use was made to wait for.
    Stream(S),
}

impl<S: TrackedStream> AccessState<S> {
    /// The stream a free should go on: the only pending write's stream when there is one
    /// (no wait needed), else the first pending stream for which `own` holds (a stream
    /// of the allocation's device: a free may not go on another device's stream), else
    /// `None` (no pending use of the device's own streams).
    pub(crate) fn free_stream(&self, own: impl Fn(&S) -> bool) -> Option<&S> {
        self.writers.iter().chain(&self.readers).find(|s| own(s))
    }

    /// Makes `on` wait (through `wait(from)`) for every pending use on another stream,
    /// then forgets every pending use, moving the streams into `grave` (the caller drops
    /// them after enqueueing the free: `on`'s own reference keeps it alive until then).
    /// On the first failure nothing is forgotten.
    pub(crate) fn join_onto(
        &mut self,
        on: u64,
        mut wait: impl FnMut(&S) -> Result<()>,
        grave: &mut Grave<S>,
    ) -> Result<()> {
        for s in self.writers.iter().chain(&self.readers) {
            if s.id() != on {
                wait(s)?;
            }
        }
        grave.take_all(&mut self.writers);
        grave.take_all(&mut self.readers);
        self.refresh();
        Ok(())
    }
}

impl AccessTracker {
    /// The tracker of memory allocated in stream order on `on` (`cuMemAllocFromPoolAsync`):
    /// the allocation is a pending write there, so a use on another stream waits for it,
    /// and published, so the next use on `on` takes the fast path. Built in place (it is
    /// on every temporary's path): the state of [`AccessTracker::written_on`] and what
    /// [`Published::reset_mut`](super::Published::reset_mut) publishes for it
    /// ([`Published::sole_writer`](super::Published::sole_writer)).
    #[inline(always)]
    pub(crate) fn allocated_on(on: super::StreamSlot<'_>) -> Self {
        // On a foreign stream the caller recorded its end mark after the allocation (and
        // its zeroing) already (`BoundStream::alloc`'s foreign path).
        let id = on.record_id();
        AccessTracker {
            state: crate::sync::Mutex::new(AccessState::written_by_id(on.to_ref(), id)),
            // A new tracker, held by value: nothing can be using what is published.
            published: super::Published::sole_writer(id),
        }
    }

    /// The usual case of a stream-ordered free, without joining: the only pending use is
    /// a write on a stream of `device` that no capture can hold and whose handle stays
    /// valid (a gpubind stream, a stream shared with cudarc that is not capturing, or the
    /// legacy stream; not a borrowed one). Forgets it and returns that stream, where the free goes with
    /// no wait (every use of the memory is ordered before it there). `None`, changing
    /// nothing, in every other case ([`join_for_free`](Self::join_for_free) then).
    #[inline]
    pub(crate) fn take_sole_writer(&mut self, device: &Device) -> Option<StreamRef> {
        let st = match self.state.get_mut() {
            Ok(st) => st,
            Err(poisoned) => poisoned.into_inner(),
        };
        match (&st.writers[..], st.readers.is_empty()) {
            ([w], true)
                if w.device().ordinal() == device.ordinal()
                    && !w.is_borrowed()
                    && !w.may_be_capturing() => {}
            _ => return None,
        }
        let on = st.writers.pop();
        st.refresh();
        // Held `&mut`: no fast path can be using what is published; nothing is pending now.
        self.published.reset_mut(st, None);
        on
    }

    /// Joins every pending use onto one stream of `device` (the allocation's), for a
    /// stream-ordered free: see the [module docs](self). Returns the stream to free on
    /// (`FreeOn::Anywhere` when nothing is pending) and the forgotten streams, to be
    /// dropped only after the free is enqueued. `device`'s context must be current (a
    /// pending use on the legacy default stream makes the free stream wait for it).
    ///
    /// On failure (an event that cannot be recorded or waited for, a poisoned context)
    /// nothing is forgotten: the caller falls back to [`wait_all`](Self::wait_all).
    pub(crate) fn join_for_free(
        &mut self,
        device: &Arc<Device>,
    ) -> Result<(FreeOn<StreamRef>, Grave<StreamRef>)> {
        let mut grave = Grave::new();
        let st = match self.state.get_mut() {
            Ok(st) => st,
            Err(poisoned) => poisoned.into_inner(),
        };
        if st.is_idle() {
            return Ok((FreeOn::Anywhere, grave));
        }
        // A stream shared with cudarc may be under a capture begun through cudarc: an
        // event or a free enqueued there would become part of that graph. Refused, and
        // the caller waits on the host instead (which such a stream refuses too: leaked).
        if st
            .writers
            .iter()
            .chain(&st.readers)
            .any(StreamRef::may_be_capturing)
        {
            return Err(crate::error::Error::InvalidArgument(
                "a stream of the buffer's pending uses, shared with cudarc, is being captured"
                    .into(),
            ));
        }
        // A borrowed stream is never the free's: its borrow may have ended and its owner
        // destroyed it (waiting for it uses the event recorded at the end of the borrow).
        let own = |s: &StreamRef| s.device().ordinal() == device.ordinal() && !s.is_borrowed();
        // Only other devices' streams (peer work) or borrowed ones use it: then the
        // legacy stream of its own device waits for them.
        let on = st
            .free_stream(own)
            .cloned()
            .unwrap_or_else(|| StreamRef::Legacy(Arc::clone(device)));
        // The legacy stream is the current context's: make it the device's.
        let _guard = match on {
            StreamRef::Legacy(_) => Some(device.enter()?),
            StreamRef::Owned(_) => None,
        };
        st.join_onto(on.id(), |from| from.enqueue_wait(on.raw()), &mut grave)?;
        // Held `&mut`: no fast path can be using what is published; nothing is pending now.
        self.published.reset_mut(st, None);
        Ok((FreeOn::Stream(on), grave))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct S(u64);
    impl TrackedStream for S {
        fn id(&self) -> u64 {
            self.0
        }
        fn is_idle(&self) -> bool {
            false
        }
        fn under_gate(&self, f: impl FnOnce()) {
            f();
        }
    }

    /// The free goes on the only writer without a wait; with several streams pending it
    /// goes on the first of the device's own, after waiting for every other one; a failed
    /// wait forgets nothing.
    #[test]
    fn a_free_waits_for_every_other_pending_stream() {
        let own = |s: &S| s.0 < 10;
        let sole = AccessState::with_uses(vec![S(1)], vec![]);
        assert_eq!(sole.free_stream(own), Some(&S(1)));
        let mut grave = Grave::new();
        let mut st = sole;
        let mut waited = Vec::new();
        st.join_onto(
            1,
            |s| {
                waited.push(s.0);
                Ok(())
            },
            &mut grave,
        )
        .unwrap();
        assert!(waited.is_empty() && st.is_idle());

        // Writers on another device (20) and here (2), readers 3 and 2.
        let mut st = AccessState::with_uses(vec![S(20), S(2)], vec![S(3)]);
        let on = st.free_stream(own).cloned().unwrap();
        assert_eq!(on, S(2));
        let mut waited = Vec::new();
        st.join_onto(
            on.0,
            |s| {
                waited.push(s.0);
                Ok(())
            },
            &mut grave,
        )
        .unwrap();
        assert_eq!(waited, [20, 3]);
        assert!(st.is_idle());
        assert!(
            st.is_ordered_on(99, Access::Write),
            "nothing pending after a join"
        );

        // Only another device's streams: no own stream to free on.
        let st = AccessState::with_uses(vec![S(20)], vec![S(21)]);
        assert_eq!(st.free_stream(own), None);

        // A failed wait keeps every pending use (the caller then waits on the host).
        let mut st = AccessState::with_uses(vec![S(1)], vec![S(2), S(3)]);
        let failed = st.join_onto(
            1,
            |s| {
                if s.0 == 3 {
                    Err(crate::Error::InvalidArgument("no event".into()))
                } else {
                    Ok(())
                }
            },
            &mut grave,
        );
        assert!(failed.is_err());
        assert_eq!(
            (st.writers.len(), st.readers.len()),
            (1, 2),
            "nothing forgotten"
        );
    }

    /// The free without a join takes only one pending write on a stream of the buffer's
    /// own device (and no reads); it then forgets it and publishes nothing. Every other
    /// case changes nothing (the join, or the host wait, then covers every use).
    #[test]
    fn the_sole_writer_free_takes_only_one_write_of_the_device() {
        use super::super::{StreamSlot, fast::NONE};
        let dev = Arc::new(Device::unopened_for_test(0));
        let other = Arc::new(Device::unopened_for_test(1));
        let legacy = StreamSlot::Legacy(&dev);
        let nothing_published = (NONE, [NONE; super::super::fast::READ_SLOTS]);

        // Another device's stream: not this device's free.
        let mut t = AccessTracker::allocated_on(legacy);
        assert!(t.take_sole_writer(&other).is_none());
        assert_eq!(t.published.ids().0, legacy.id(), "unchanged");
        assert_eq!(t.state.get_mut().unwrap().writers.len(), 1, "unchanged");

        // A reader besides the write: joined instead.
        let mut t = AccessTracker::allocated_on(legacy);
        let peer = StreamSlot::Legacy(&other).to_ref();
        t.state.get_mut().unwrap().readers.push(peer);
        t.state.get_mut().unwrap().refresh();
        assert!(t.take_sole_writer(&dev).is_none());
        assert_eq!(t.state.get_mut().unwrap().readers.len(), 1, "unchanged");

        // Two writers: joined instead.
        let mut t = AccessTracker::written_on(legacy.to_ref());
        t.state
            .get_mut()
            .unwrap()
            .writers
            .push(StreamSlot::Legacy(&other).to_ref());
        t.state.get_mut().unwrap().refresh();
        assert!(t.take_sole_writer(&dev).is_none());
        assert_eq!(t.state.get_mut().unwrap().writers.len(), 2, "unchanged");

        // The usual temporary: its one write, on its own device's stream.
        let mut t = AccessTracker::allocated_on(legacy);
        let on = t.take_sole_writer(&dev).expect("the sole writer");
        assert_eq!(on.id(), legacy.id());
        assert!(t.state.get_mut().unwrap().is_idle(), "nothing pending");
        assert_eq!(t.published.ids(), nothing_published);
    }

    use super::super::Access;
}

//! What one capture owns and the guard that ends it: the [`Session`] (streams, events,
//! uses, fork hazards) and [`Active`].

use super::Uses;
use crate::access::AccessTracker;
use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::memory::ByteSpan;
use cudarc::driver::sys;
use std::sync::Arc;

/// What one capture owns: the streams it created, the events of its forks, and what the
/// captured work uses. Shared (through a `RefCell`) by the handles of one capture.
pub(super) struct Session<'buf> {
    pub(super) device: Arc<Device>,
    pub(super) uses: Uses<'buf>,
    /// Every stream this capture created (the origin first): destroyed after it ends.
    pub(super) streams: Vec<sys::CUstream>,
    /// Fork and join events (created for this capture, not pooled: their last records
    /// are in the capture), destroyed after it ends.
    pub(super) events: Vec<sys::CUevent>,
    /// Scratch memory that captured operations share invisibly (a cuBLAS workspace): the
    /// allocation, and the capture stream and event (one of `events`) of its last use,
    /// so that its next use on another branch is ordered after it (see
    /// [`Capture::exclusive_use`](super::Capture::exclusive_use)).
    pub(super) scratch: Vec<(*const AccessTracker, sys::CUstream, sys::CUevent)>,
    /// Forks not yet joined. While one is open, work captured on two streams may run
    /// concurrently within one launch of the graph, so each captured use is ordered
    /// after the conflicting uses captured before it on the other streams (`hazards`).
    pub(super) open_forks: usize,
    /// The uses captured while a fork was open, each with the stream it was captured on
    /// and an event recorded there right after it.
    pub(super) hazards: Vec<(Span, sys::CUstream, sys::CUevent)>,
    /// The uses of the operation being captured: `hazards` once it is enqueued
    /// ([`Capture::mark`](super::Capture::mark)).
    pub(super) pending: Vec<Span>,
    /// An error that discards the graph whatever the closure returns (an NCCL
    /// collective that failed while it was captured: part of it may be in the graph,
    /// and its communicator may have been aborted).
    pub(super) fatal: Option<Error>,
}

/// Bytes of one allocation a captured operation uses, and whether it writes them.
#[derive(Clone, Copy)]
pub(super) struct Span {
    pub(super) bytes: ByteSpan,
    pub(super) write: bool,
}

impl Span {
    /// Whether two uses of memory race if they run concurrently: one allocation,
    /// overlapping bytes, at least one write.
    pub(super) fn conflicts(&self, other: &Span) -> bool {
        (self.write || other.write) && self.bytes.overlaps(&other.bytes)
    }
}

impl Session<'_> {
    /// A new private non-blocking stream of the (current) context, destroyed with the
    /// session.
    pub(super) fn new_stream(&mut self) -> Result<sys::CUstream> {
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the bound context is current (checked by `capture`, and the binding is
        // borrowed by the closure for the whole capture).
        let raw = self
            .device
            .check(unsafe { result::stream::create(flags) })?;
        self.streams.push(raw);
        Ok(raw)
    }

    /// A new timing-disabled event of the device, destroyed with the session.
    pub(super) fn event(&mut self) -> Result<sys::CUevent> {
        let e = self.device.new_handoff_event()?;
        self.events.push(e);
        Ok(e)
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // The capture has ended (`Active` drops first): nothing refers to these streams.
        for &s in &self.streams {
            let s = s as usize;
            crate::teardown::release(
                crate::teardown::Teardown {
                    what: format_args!("a capture stream"),
                    device: &self.device,
                    waited: Ok(()),
                    call: "cuStreamDestroy_v2",
                    runs: crate::teardown::Runs::Inline,
                },
                // SAFETY: created by `new_stream` in this context, destroyed once, here.
                move || unsafe { result::stream::destroy(s as sys::CUstream) },
            );
        }
        for &e in &self.events {
            let e = e as usize;
            crate::teardown::release(
                crate::teardown::Teardown {
                    what: format_args!("a capture's fork event"),
                    device: &self.device,
                    waited: Ok(()),
                    call: "cuEventDestroy_v2",
                    runs: crate::teardown::Runs::Inline,
                },
                // SAFETY: created by `event` in this context, destroyed once, here.
                move || unsafe { result::event::destroy(e as sys::CUevent) },
            );
        }
    }
}

/// An ongoing capture on the origin stream: ended exactly once, by [`Active::end`] or
/// (on an early return or a panic) by the drop, which discards the graph.
pub(super) struct Active<'d> {
    pub(super) device: &'d Device,
    pub(super) origin: sys::CUstream,
    pub(super) ended: bool,
}

impl Active<'_> {
    pub(super) fn end(&mut self) -> Result<sys::CUgraph> {
        self.ended = true;
        // SAFETY: `origin` is capturing (begun by `capture`, on this thread: the handles
        // are !Send). A failed end returns no graph (the driver's is null).
        let graph = self
            .device
            .check(unsafe { result::stream::end_capture(self.origin) })?;
        if graph.is_null() {
            return Err(Error::InvalidArgument(
                "cuStreamEndCapture returned no graph".into(),
            ));
        }
        Ok(graph)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        if !self.ended {
            // An early return or a panic: end the capture so the thread and the stream
            // leave capture mode, and discard whatever was captured.
            let _ = self.end().map(destroy_graph);
        }
    }
}

/// Destroys a graph (null: nothing). The context needs not be current for it.
///
/// With this thread's capture mode relaxed, as every release call of a drop
/// (`teardown::faults::enter_and_call`): another capture may still run on this thread (a
/// capture begun inside another's closure) or in global mode on another, and the graph,
/// just ended, is part of none.
pub(super) fn destroy_graph(graph: sys::CUgraph) {
    if !graph.is_null() {
        let destroyed = crate::driver::with_relaxed_capture_mode(|| {
            // SAFETY: a graph returned by cuStreamEndCapture, owned here, destroyed once.
            unsafe { result::graph::destroy(graph) }
        })
        .and_then(|destroyed| destroyed);
        if let Err(e) = destroyed {
            crate::teardown::faults::report_drop(
                format_args!("a captured graph that was not kept"),
                None,
                crate::teardown::faults::RELEASE,
                &e,
                crate::teardown::faults::MAYBE_LEAKED,
            );
        }
    }
}

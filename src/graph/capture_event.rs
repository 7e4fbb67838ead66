//! User events in a capture: [`Capture::record_event`] and [`Capture::wait_event`].

use super::capture::Capture;
use crate::driver::result;
use crate::error::Result;
use crate::stream::Event;

impl<'c, 'buf> Capture<'c, 'buf> {
    /// Records `event` at this point of the graph at each launch (an event record node,
    /// `cuEventRecordWithFlags` with `CU_EVENT_RECORD_EXTERNAL`): after each launch, the
    /// event's last record is that launch's, covering the work captured before this call
    /// on this handle's stream. Another stream (eager work, or a graph launched there
    /// that [`wait_event`](Self::wait_event)s on it) can then wait for it with
    /// [`BoundStream::wait`](crate::BoundStream::wait).
    ///
    /// The event must belong to the capture's device ([`Error::WrongDevice`](crate::Error::WrongDevice)),
    /// and is borrowed for the graph's lifetime `'buf`.
    ///
    /// User events only add ordering: every launch still claims every buffer the graph
    /// uses, so safe code cannot read a buffer before the graph's writes to it finish
    /// whatever the events say (see docs/safety.md, "CUDA graphs").
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
    /// let x = gpu.alloc_zeros::<u32>(1024)?;
    /// let done = gpu.new_event(false)?;
    /// let exec = gpu
    ///     .capture(|c| {
    ///         c.memset(&x, 7u32)?;
    ///         c.record_event(&done)
    ///     })?
    ///     .instantiate()?;
    /// exec.launch(&gpu.default_stream())?;
    /// done.synchronize()?; // the memset has run
    /// # Ok(()) }
    /// ```
    ///
    /// The graph borrows the event:
    ///
    /// ```compile_fail,E0505
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
    /// let x = gpu.alloc_zeros::<u32>(4)?;
    /// let done = gpu.new_event(false)?;
    /// let graph = gpu.capture(|c| {
    ///     c.memset(&x, 1u32)?;
    ///     c.record_event(&done)
    /// })?;
    /// drop(done); // error[E0505]: each launch of the graph records `done`
    /// graph.instantiate()?;
    /// # Ok(()) }
    /// ```
    pub fn record_event(&mut self, event: &'buf Event) -> Result<()> {
        self.device.expect_same("event", event.device())?;
        // SAFETY: the event is live for 'buf (borrowed by the graph) and belongs to this
        // device; the stream is capturing in this context: the driver adds an event
        // record node that records the event at each launch. An external record leaves
        // the event out of the capture's state: eager waits on it during the capture
        // see its earlier record.
        self.device
            .check(unsafe { result::event::record_external(event.raw(), self.stream.0) })?;
        self.session.borrow_mut().uses.add_event(event);
        Ok(())
    }

    /// Makes the work captured after this call on this handle's stream wait, at each
    /// launch, for the work `event` last recorded before that launch (an event wait node,
    /// `cuStreamWaitEvent` with `CU_EVENT_WAIT_EXTERNAL`): eager work recorded with
    /// [`BoundStream::record`](crate::BoundStream::record), or another graph's
    /// [`record_event`](Self::record_event). An event never recorded is waited for at
    /// once.
    ///
    /// The event must belong to the capture's device ([`Error::WrongDevice`](crate::Error::WrongDevice);
    /// to order streams of two devices, wait eagerly with
    /// [`BoundStream::wait`](crate::BoundStream::wait) before the launch), and is
    /// borrowed for the graph's lifetime `'buf`.
    ///
    /// The wait is for ordering that gpubind does not see (memory reached through raw
    /// addresses, other libraries): the graph's own buffers are claimed at each launch
    /// whatever it waits for.
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
    /// let x = gpu.alloc_zeros::<u32>(1024)?;
    /// let ready = gpu.new_event(false)?;
    /// let exec = gpu
    ///     .capture(|c| {
    ///         c.wait_event(&ready)?;
    ///         c.memset(&x, 7u32)
    ///     })?
    ///     .instantiate()?;
    /// let (s1, s2) = (gpu.new_stream()?, gpu.new_stream()?);
    /// gpu.on(&s1)?.record(&ready)?; // after the work on s1 so far
    /// exec.launch(&gpu.on(&s2)?)?;  // the memset runs after it
    /// # Ok(()) }
    /// ```
    pub fn wait_event(&mut self, event: &'buf Event) -> Result<()> {
        self.device.expect_same("event", event.device())?;
        // SAFETY: the event is live for 'buf (borrowed by the graph) and belongs to this
        // device; the stream is capturing in this context: the driver adds an event wait
        // node. An external wait joins no other stream into the capture.
        self.device
            .check(unsafe { result::stream::wait_event_external(self.stream.0, event.raw()) })?;
        self.session.borrow_mut().uses.add_event(event);
        Ok(())
    }
}

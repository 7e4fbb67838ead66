//! Events: markers recorded on a stream (documented on [`Event`]).

use crate::device::Device;
use crate::driver::result;
use crate::error::Result;
use cudarc::driver::sys;
use std::sync::Arc;

/// A CUDA event of one device.
pub struct Event {
    pub(super) device: Arc<Device>,
    pub(super) raw: sys::CUevent,
    pub(super) flags: EventFlags,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("device", &self.device.ordinal())
            .field("flags", &self.flags)
            .finish_non_exhaustive()
    }
}

/// How [`BoundDevice::new_event_with`](crate::BoundDevice::new_event_with) creates an event. [`EventFlags::new`] (also the
/// `Default`) is what `new_event(true)` creates: timing enabled, spin-waiting
/// `synchronize`.
///
/// ```
/// use gpubind::EventFlags;
/// let f = EventFlags::new().timing(false).blocking_sync(true);
/// assert!(!f.has_timing() && f.has_blocking_sync());
/// assert_eq!(EventFlags::default(), EventFlags::new());
/// ```
///
/// [`interprocess`](Self::interprocess) makes an event another process can open
/// (`gpubind::ipc::EventHandle`, feature `ipc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventFlags {
    timing: bool,
    blocking_sync: bool,
    interprocess: bool,
}

impl Default for EventFlags {
    fn default() -> Self {
        Self::new()
    }
}

impl EventFlags {
    /// Timing enabled, spin-waiting: the driver's default (`CU_EVENT_DEFAULT`).
    pub const fn new() -> Self {
        EventFlags {
            timing: true,
            blocking_sync: false,
            interprocess: false,
        }
    }

    /// Whether the event records timestamps for [`Event::elapsed_ms`]. Off
    /// (`CU_EVENT_DISABLE_TIMING`) makes records and waits cheaper; `elapsed_ms` on such
    /// an event is then a driver error (`CUDA_ERROR_INVALID_HANDLE`).
    pub const fn timing(mut self, on: bool) -> Self {
        self.timing = on;
        self
    }

    /// Whether a host thread in [`Event::synchronize`] blocks (sleeps) until the event
    /// completes (`CU_EVENT_BLOCKING_SYNC`), instead of spinning: frees the CPU core,
    /// adds wake-up latency.
    pub const fn blocking_sync(mut self, on: bool) -> Self {
        self.blocking_sync = on;
        self
    }

    /// Whether another process may open the event (`CU_EVENT_INTERPROCESS`, with the
    /// `ipc` feature's `EventHandle`). The driver requires timing off for it: `on`
    /// turns timing off (turning it back on makes `new_event_with` a driver error).
    pub const fn interprocess(mut self, on: bool) -> Self {
        self.interprocess = on;
        if on {
            self.timing = false;
        }
        self
    }

    /// Whether the event may be opened by another process.
    pub const fn has_interprocess(self) -> bool {
        self.interprocess
    }

    /// Whether timing is enabled.
    pub const fn has_timing(self) -> bool {
        self.timing
    }

    /// Whether `synchronize` blocks instead of spinning.
    pub const fn has_blocking_sync(self) -> bool {
        self.blocking_sync
    }

    /// The `CUevent_flags` bits for `cuEventCreate`.
    pub(super) fn raw(self) -> u32 {
        use sys::CUevent_flags as F;
        let mut bits = F::CU_EVENT_DEFAULT as u32;
        if !self.timing {
            bits |= F::CU_EVENT_DISABLE_TIMING as u32;
        }
        if self.blocking_sync {
            bits |= F::CU_EVENT_BLOCKING_SYNC as u32;
        }
        if self.interprocess {
            bits |= F::CU_EVENT_INTERPROCESS as u32;
        }
        bits
    }
}

// SAFETY: as for Stream: event handles are thread-agnostic identifiers; recording needs
// a BoundStream of the event's device; queries push the event's own context.
unsafe impl Send for Event {}
// SAFETY: the driver makes event operations thread-safe.
unsafe impl Sync for Event {}

impl Event {
    /// The event's device.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The flags the event was created with.
    pub fn flags(&self) -> EventFlags {
        self.flags
    }

    /// Blocks until the work before the event's last record has finished.
    pub fn synchronize(&self) -> Result<()> {
        let _guard = self.device.enter()?;
        // SAFETY: valid event; its context is current for the call.
        self.device
            .check(unsafe { result::event::synchronize(self.raw) })
    }

    /// Whether the work before the last record has finished (non-blocking).
    pub fn is_complete(&self) -> Result<bool> {
        let _guard = self.device.enter()?;
        // SAFETY: valid event; its context is current for the call.
        self.device.check(unsafe { result::event::query(self.raw) })
    }

    /// Milliseconds between `self` and `end`, both recorded with timing enabled and
    /// complete. Events of different devices give [`Error::WrongDevice`](crate::Error::WrongDevice).
    ///
    /// Calls `cuEventElapsedTime_v2` on drivers from CUDA 12.8 and the original
    /// `cuEventElapsedTime` before (both looked up by version, see `docs/compat.md`).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.device.expect_same("end event", &end.device)?;
        let _guard = self.device.enter()?;
        // SAFETY: two valid events of the same context, current for the call.
        let ms = unsafe { crate::driver::version::event_elapsed_ms(self.raw, end.raw) };
        self.device.check(ms)
    }

    /// Wraps an event opened from another process's handle (`cuIpcOpenEventHandle` in
    /// `device`'s context); the `Event` destroys it.
    #[cfg(feature = "ipc")]
    pub(crate) fn from_opened(device: Arc<Device>, raw: sys::CUevent) -> Event {
        Event {
            device,
            raw,
            flags: EventFlags::new().interprocess(true),
        }
    }

    /// The raw handle.
    ///
    /// # Safety
    ///
    /// Valid while `self` lives; do not destroy it.
    pub unsafe fn raw(&self) -> sys::CUevent {
        self.raw
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let raw = self.raw as usize; // a handle, `Send`
        crate::teardown::release(
            crate::teardown::Teardown {
                what: format_args!("an Event"),
                device: &self.device,
                waited: Ok(()),
                call: "cuEventDestroy_v2",
                runs: crate::teardown::Runs::Inline,
            },
            // SAFETY: created by cuEventCreate (or opened by cuIpcOpenEventHandle) in this
            // context (current while this runs), destroyed once here.
            move || unsafe { result::event::destroy(raw as sys::CUevent) },
        );
    }
}

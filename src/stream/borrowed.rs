//! [`BorrowedStream`]: a foreign `CUstream` (PyTorch's current stream, a cudarc or raw
//! driver stream) lent to gpubind for a while.

use super::Stream;
use crate::access::StreamInner;
use crate::context::BoundDevice;
use crate::driver::result;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::marker::PhantomData;
use std::sync::Arc;

/// A stream gpubind did not create, lent to it by
/// [`BoundDevice::borrow_stream`]: usable exactly like a [`Stream`] (it dereferences to
/// one: `gpu.on(&borrowed)?` launches, copies and orders on it, and gpubind's trackers
/// order its uses with every other stream's), and never destroyed by gpubind.
///
/// Dropping it ends the loan: an event is recorded at the stream's end, and the trackers
/// that still remember uses on the stream ask that event from then on, so the owner may
/// destroy the stream at once. Work enqueued on it by others after that is not waited
/// for by gpubind (it is not gpubind's).
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::{Device, ThreadContext};
/// let mut ctx = ThreadContext::acquire()?;
/// let gpu = ctx.bind(&Device::get(0)?)?;
/// let theirs = gpu.new_stream()?;            // stands for a stream another library owns
/// // SAFETY: `theirs` is a stream of this device's primary context that outlives `lent`.
/// let lent = unsafe { gpu.borrow_stream(theirs.raw())? };
/// let mut buf = gpu.alloc_zeros::<f32>(8)?;
/// gpu.on(&lent)?.memset_async(&mut buf, 1.0)?;
/// drop(lent);                                 // the loan ends; `buf`'s tracker keeps order
/// assert_eq!(gpu.dtoh(&buf)?, [1.0; 8]);
/// # Ok(()) }
/// ```
pub struct BorrowedStream<'a> {
    stream: Stream,
    _loan: PhantomData<&'a ()>,
}

impl std::ops::Deref for BorrowedStream<'_> {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        &self.stream
    }
}

impl std::fmt::Debug for BorrowedStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BorrowedStream")
            .field("device", &self.stream.inner.device.ordinal())
            .field("id", &self.stream.inner.id)
            .finish()
    }
}

impl Drop for BorrowedStream<'_> {
    fn drop(&mut self) {
        self.stream.inner.retire();
    }
}

impl<'a> BoundDevice<'a> {
    /// Lends the foreign stream `raw` to gpubind for the life of the returned
    /// [`BorrowedStream`] (which cannot outlive this binding).
    ///
    /// Refused with [`Error::InvalidArgument`] for the special handles (`0`, the legacy
    /// stream: use [`default_stream`](Self::default_stream); `CU_STREAM_LEGACY`,
    /// `CU_STREAM_PER_THREAD`) and for a stream of another context than the bound
    /// device's primary context (`cuStreamGetCtx`).
    ///
    /// # Safety
    ///
    /// `raw` is a live stream handle, and stays live (not destroyed, not handed to
    /// another owner that destroys it) until the returned value is dropped (for ever, if
    /// it is leaked with `std::mem::forget`: the end of the loan is its drop); gpubind
    /// records on it, waits on it and enqueues on it until then, and never destroys it.
    /// See `docs/safety.md`, "Borrowed streams".
    pub unsafe fn borrow_stream(&self, raw: sys::CUstream) -> Result<BorrowedStream<'_>> {
        // `CU_STREAM_LEGACY` is 0x1, `CU_STREAM_PER_THREAD` 0x2 (cuda.h).
        let special = (raw as usize) <= 2;
        if special {
            return Err(Error::InvalidArgument(format!(
                "borrow_stream: {raw:p} is a special stream handle (the legacy or per-thread \
                 default stream), not a stream of its own; use BoundDevice::default_stream"
            )));
        }
        // SAFETY: a live stream handle (the caller's promise).
        let owner = self
            .device()
            .check(unsafe { result::stream::context(raw) })?;
        // SAFETY: only compared, never used.
        let bound = unsafe { self.raw_context() };
        if owner != bound {
            return Err(Error::InvalidArgument(format!(
                "borrow_stream: stream {raw:p} belongs to context {owner:p}, not to device \
                 {}'s primary context {bound:p}",
                self.ordinal()
            )));
        }
        Ok(BorrowedStream {
            stream: Stream {
                inner: Arc::new(StreamInner::borrowed(Arc::clone(self.device()), raw)),
            },
            _loan: PhantomData,
        })
    }
}

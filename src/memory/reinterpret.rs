//! Device memory seen as another element type: `transmute` / `transmute_mut` on
//! [`DeviceSlice`] and its views, and [`DeviceSlice::try_clone`].
//!
//! A reinterpreting view borrows the memory it views and shares its tracker, so its
//! stream-ordered uses are ordered with every other use of the allocation, whatever
//! element type names them.

use super::{DeviceRepr, DeviceSlice, DeviceView, DeviceViewMut, ViewTracker};
use crate::context::BoundDevice;
use crate::error::{Error, Result, TransmuteRefusal};
use std::marker::PhantomData;

/// The number of `U` in `bytes` bytes at `addr`, or [`Error::Transmute`] when they do not
/// fit: `bytes` not a multiple of `size_of::<U>()`, `addr` not aligned for `U`, or `U` of
/// size 0. An empty range fits any type (it has no address to align).
pub(crate) fn fit<U>(addr: u64, bytes: usize) -> Result<usize> {
    let (size, align) = (std::mem::size_of::<U>(), std::mem::align_of::<U>());
    let refuse = |reason| Error::Transmute {
        to: std::any::type_name::<U>(),
        bytes,
        addr,
        size,
        align,
        reason,
    };
    if size == 0 {
        return Err(refuse(TransmuteRefusal::ZeroSized));
    }
    if bytes == 0 {
        return Ok(0);
    }
    if !bytes.is_multiple_of(size) {
        return Err(refuse(TransmuteRefusal::Length));
    }
    if !addr.is_multiple_of(align as u64) {
        return Err(refuse(TransmuteRefusal::Alignment));
    }
    Ok(bytes / size)
}

/// A shared view of `bytes` at `ptr` as `U`.
fn view<'a, U: DeviceRepr>(
    device: &'a std::sync::Arc<crate::device::Device>,
    tracker: &'a crate::access::AccessTracker,
    ptr: u64,
    bytes: usize,
) -> Result<DeviceView<'a, U>> {
    let len = fit::<U>(ptr, bytes)?;
    Ok(DeviceView {
        device,
        tracker,
        ptr,
        len,
        _t: PhantomData,
    })
}

impl<T: DeviceRepr> DeviceSlice<T> {
    /// The whole slice seen as elements of `U`: a shared view that borrows the slice and
    /// is tracked as it is. [`Error::Transmute`] when the byte length is not a multiple
    /// of `size_of::<U>()` or the address is not aligned for `U`. Needs no binding.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let bytes = gpu.clone_htod(&1.5f32.to_ne_bytes())?;
    /// let floats = bytes.transmute::<f32>()?;        // 4 bytes as one f32
    /// assert_eq!(gpu.dtoh(&floats)?, [1.5]);
    /// assert!(bytes.slice(1..4)?.transmute::<f32>().is_err()); // 3 bytes: refused
    /// # Ok(()) }
    /// ```
    pub fn transmute<U: DeviceRepr>(&self) -> Result<DeviceView<'_, U>> {
        view(&self.device, &self.tracker, self.ptr, self.num_bytes_raw())
    }

    /// The whole slice seen as elements of `U`, writable: like
    /// [`transmute`](Self::transmute), holding the slice's tracker alone.
    pub fn transmute_mut<U: DeviceRepr>(&mut self) -> Result<DeviceViewMut<'_, U>> {
        let len = fit::<U>(self.ptr, self.num_bytes_raw())?;
        Ok(DeviceViewMut {
            device: &self.device,
            tracker: ViewTracker::Alone(&mut self.tracker),
            ptr: self.ptr,
            len,
            _t: PhantomData,
        })
    }

    /// A new allocation on `gpu` holding a copy of this slice's contents: the copy
    /// (`cuMemcpyDtoD`) starts after the pending writes of this slice on every stream and
    /// has finished when this returns. [`Error::WrongDevice`] if `gpu` is bound to
    /// another device than the slice's.
    pub fn try_clone(&self, gpu: &BoundDevice<'_>) -> Result<DeviceSlice<T>> {
        gpu.clone_dtod(self)
    }

    fn num_bytes_raw(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
}

impl<'a, T: DeviceRepr> DeviceView<'a, T> {
    /// This view seen as elements of `U` (see [`DeviceSlice::transmute`]): borrows what
    /// this view borrows, so it may outlive the view itself.
    pub fn transmute<U: DeviceRepr>(&self) -> Result<DeviceView<'a, U>> {
        view(
            self.device,
            self.tracker,
            self.ptr,
            self.len * size_of::<T>(),
        )
    }
}

impl<'a, T: DeviceRepr> DeviceViewMut<'a, T> {
    /// This view seen as elements of `U`, read-only (see [`DeviceSlice::transmute`]).
    pub fn transmute<U: DeviceRepr>(&self) -> Result<DeviceView<'_, U>> {
        view(
            self.device,
            &self.tracker,
            self.ptr,
            self.len * size_of::<T>(),
        )
    }

    /// This view seen as elements of `U`, writable (see [`DeviceSlice::transmute`]);
    /// reborrows this view, so the two are never used at once.
    pub fn transmute_mut<U: DeviceRepr>(&mut self) -> Result<DeviceViewMut<'_, U>> {
        let len = fit::<U>(self.ptr, self.len * size_of::<T>())?;
        let tracker = match &mut self.tracker {
            ViewTracker::Alone(t) => ViewTracker::Alone(t),
            ViewTracker::Shared(t) => ViewTracker::Shared(t),
        };
        Ok(DeviceViewMut {
            device: self.device,
            tracker,
            ptr: self.ptr,
            len,
            _t: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::fit;
    use crate::error::{Error, TransmuteRefusal};

    fn refusal<U>(addr: u64, bytes: usize) -> Option<TransmuteRefusal> {
        match fit::<U>(addr, bytes) {
            Err(Error::Transmute { reason, .. }) => Some(reason),
            _ => None,
        }
    }

    #[test]
    fn lengths_that_divide_fit() {
        assert_eq!(fit::<f32>(0x1000, 16).ok(), Some(4));
        assert_eq!(fit::<u8>(0x1001, 7).ok(), Some(7));
        assert_eq!(fit::<[f32; 3]>(0x1004, 24).ok(), Some(2));
        assert_eq!(fit::<u64>(0x1008, 0).ok(), Some(0));
        assert_eq!(
            fit::<u64>(0x1003, 0).ok(),
            Some(0),
            "empty: nothing to align"
        );
    }

    #[test]
    fn remainders_and_misalignment_are_refused() {
        assert_eq!(refusal::<f32>(0x1000, 6), Some(TransmuteRefusal::Length));
        assert_eq!(refusal::<u64>(0x1000, 12), Some(TransmuteRefusal::Length));
        assert_eq!(refusal::<f32>(0x1001, 8), Some(TransmuteRefusal::Alignment));
        assert_eq!(refusal::<u16>(0x1003, 2), Some(TransmuteRefusal::Alignment));
        assert_eq!(
            refusal::<[u8; 0]>(0x1000, 8),
            Some(TransmuteRefusal::ZeroSized)
        );
        // [u16; 3] has size 6 but alignment 2: 12 bytes at an odd address is misaligned.
        assert_eq!(
            refusal::<[u16; 3]>(0x1001, 12),
            Some(TransmuteRefusal::Alignment)
        );
    }

    #[test]
    fn the_error_names_type_and_reason() {
        let msg = fit::<f32>(0x10, 6).unwrap_err().to_string();
        assert!(msg.contains("f32") && msg.contains("6 bytes") && msg.contains("multiple"));
    }
}

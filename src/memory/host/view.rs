//! Sub-ranges of page-locked host memory that keep their kind: [`PageLockedView`] and
//! [`PageLockedViewMut`].

use super::{LockedRange, PinnedHostBuffer, RegisteredHost};
use crate::copy::{Endpoint, TrackedMemory, copy_endpoints};
use crate::error::Result;
use crate::memory::{DeviceRepr, resolve};

/// A read-only sub-range of a [`PinnedHostBuffer`] or an owning [`RegisteredHost`]
/// (`'static`), from [`PinnedHostBuffer::slice`]. Unlike `&buf[a..b]`, a plain slice that
/// copies treat as pageable memory, a view stays page-locked and tracked: copies from it
/// are asynchronous DMA ([`BoundStream::copy_tracked_async`](crate::BoundStream::copy_tracked_async)),
/// ordered with every other use of the buffer. Derefs to `[T]` (after the GPU's pending
/// writes into the buffer have landed).
///
/// ```no_run
/// # fn f(gpu: &gpubind::BoundDevice<'_>, s: &gpubind::BoundStream<'_>) -> gpubind::Result<()> {
/// let pinned = gpu.pinned_from_slice(&[1u32, 2, 3, 4], Default::default())?;
/// let mut d = gpu.alloc_zeros::<u32>(2)?;
/// s.copy_tracked_async(&pinned.slice(2..)?, &mut d)?; // asynchronous, tracked
/// assert_eq!(gpu.dtoh(&d)?, [3, 4]);
/// # Ok(()) }
/// ```
pub struct PageLockedView<'v, T: DeviceRepr> {
    pub(super) range: &'v LockedRange<T>,
    pub(super) start: usize,
    pub(super) len: usize,
}

/// A writable sub-range of a [`PinnedHostBuffer`] or an owning [`RegisteredHost`], from
/// [`PinnedHostBuffer::slice_mut`]: a page-locked, tracked copy destination (see
/// [`PageLockedView`]). Derefs to `[T]` after the GPU's pending uses of the buffer.
pub struct PageLockedViewMut<'v, T: DeviceRepr> {
    range: &'v mut LockedRange<T>,
    start: usize,
    len: usize,
}

fn endpoint_at<T: DeviceRepr>(range: &LockedRange<T>, start: usize, len: usize) -> Endpoint<'_> {
    let whole = range.endpoint();
    Endpoint {
        addr: whole.addr + (start * std::mem::size_of::<T>()) as u64,
        len,
        ..whole
    }
}

impl<T: DeviceRepr> PageLockedView<'_, T> {
    fn endpoint(&self) -> Endpoint<'_> {
        endpoint_at(self.range, self.start, self.len)
    }

    /// The range, after the GPU's pending writes into the buffer: the way to read when
    /// that wait may fail (`Deref` aborts then).
    ///
    /// # Errors
    ///
    /// As [`PinnedHostBuffer::try_as_slice`].
    pub fn try_as_slice(&self) -> Result<&[T]> {
        Ok(&self.range.try_as_slice()?[self.start..self.start + self.len])
    }
}

impl<T: DeviceRepr> PageLockedViewMut<'_, T> {
    fn endpoint(&self) -> Endpoint<'_> {
        endpoint_at(self.range, self.start, self.len)
    }

    /// The range, after the GPU's pending writes into the buffer: the way to read when
    /// that wait may fail (`Deref` aborts then).
    ///
    /// # Errors
    ///
    /// As [`PinnedHostBuffer::try_as_slice`].
    pub fn try_as_slice(&self) -> Result<&[T]> {
        Ok(&self.range.try_as_slice()?[self.start..self.start + self.len])
    }

    /// The range, writable, after the GPU's pending uses of the buffer: the way to
    /// write when that wait may fail (`DerefMut` aborts then).
    ///
    /// # Errors
    ///
    /// As [`PinnedHostBuffer::try_as_slice`].
    pub fn try_as_mut_slice(&mut self) -> Result<&mut [T]> {
        let (start, len) = (self.start, self.len);
        Ok(&mut self.range.try_as_mut_slice()?[start..start + len])
    }
}

impl<T: DeviceRepr> std::ops::Deref for PageLockedView<'_, T> {
    type Target = [T];
    /// The range, after the GPU's pending writes into the buffer.
    ///
    /// # Aborts
    ///
    /// When that wait fails, as the buffer's `Deref`:
    /// use [`try_as_slice`](PageLockedView::try_as_slice) where it may.
    fn deref(&self) -> &[T] {
        &self.range.as_slice()[self.start..self.start + self.len]
    }
}

impl<T: DeviceRepr> std::ops::Deref for PageLockedViewMut<'_, T> {
    type Target = [T];
    /// The range, after the GPU's pending writes into the buffer.
    ///
    /// # Aborts
    ///
    /// When that wait fails, as the buffer's `Deref`:
    /// use [`try_as_slice`](PageLockedViewMut::try_as_slice) where it may.
    fn deref(&self) -> &[T] {
        &self.range.as_slice()[self.start..self.start + self.len]
    }
}

impl<T: DeviceRepr> std::ops::DerefMut for PageLockedViewMut<'_, T> {
    /// The range, writable, after the GPU's pending uses of the buffer.
    ///
    /// # Aborts
    ///
    /// When that wait fails, as the buffer's `DerefMut`:
    /// use [`try_as_mut_slice`](PageLockedViewMut::try_as_mut_slice) where it may.
    fn deref_mut(&mut self) -> &mut [T] {
        let (start, len) = (self.start, self.len);
        &mut self.range.as_mut_slice()[start..start + len]
    }
}

impl<T: DeviceRepr> std::fmt::Debug for PageLockedView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        describe(f, "PageLockedView", self.range, self.start, self.len)
    }
}

impl<T: DeviceRepr> std::fmt::Debug for PageLockedViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        describe(f, "PageLockedViewMut", self.range, self.start, self.len)
    }
}

fn describe<T: DeviceRepr>(
    f: &mut std::fmt::Formatter<'_>,
    name: &str,
    range: &LockedRange<T>,
    start: usize,
    len: usize,
) -> std::fmt::Result {
    f.debug_struct(name)
        .field("device", &range.device.ordinal())
        .field("kind", &range.kind)
        .field("start", &start)
        .field("len", &len)
        .field("type", &std::any::type_name::<T>())
        .finish()
}

copy_endpoints!(PageLockedView<'v>, const);
copy_endpoints!(PageLockedViewMut<'v>, mut);
impl<T: DeviceRepr> TrackedMemory for PageLockedView<'_, T> {}
impl<T: DeviceRepr> TrackedMemory for PageLockedViewMut<'_, T> {}

/// `slice` / `slice_mut` for a tracked page-locked kind.
macro_rules! page_locked_views {
    ($ty:ident $(<$lt:lifetime>)?) => {
        impl<T: DeviceRepr> $ty<$($lt,)? T> {
            /// The elements in `range` as a page-locked, tracked view; a range past the
            /// end is [`Error::OutOfBounds`](crate::Error::OutOfBounds).
            pub fn slice(
                &self,
                range: impl std::ops::RangeBounds<usize>,
            ) -> Result<PageLockedView<'_, T>> {
                let (start, len) = resolve(range, self.range.len)?;
                Ok(PageLockedView {
                    range: &self.range,
                    start,
                    len,
                })
            }

            /// The elements in `range` as a writable page-locked, tracked view; a range
            /// past the end is [`Error::OutOfBounds`](crate::Error::OutOfBounds).
            pub fn slice_mut(
                &mut self,
                range: impl std::ops::RangeBounds<usize>,
            ) -> Result<PageLockedViewMut<'_, T>> {
                let (start, len) = resolve(range, self.range.len)?;
                Ok(PageLockedViewMut {
                    range: &mut self.range,
                    start,
                    len,
                })
            }
        }
    };
}
page_locked_views!(PinnedHostBuffer);
page_locked_views!(RegisteredHost<'static>);

//! Export of gpubind buffers as DLPack tensors: [`export`], [`export_legacy`],
//! [`ExportedTensor`].

use super::dtype::DlpackDtype;
use super::header::{
    DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned, DLTensor, ManagedTensor,
};
use super::shape::{compact_strides, shape_len};
use crate::error::{Error, GivenBack, Result};
use crate::memory::host::{PinnedHostBuffer, RegisteredHost};
use crate::memory::managed::ManagedSlice;
use crate::memory::{DeviceMemory, DeviceSlice};
use std::ffi::c_void;
use std::ptr::NonNull;

/// Buffers that can be exported as DLPack tensors: `Vec<T>`, [`DeviceSlice`],
/// [`PinnedHostBuffer`], [`ManagedSlice`], `RegisteredHost<'static, T>`. Sealed.
///
/// `Send + 'static`: a consumer may call the deleter on any thread at any later time.
pub trait DlpackExport: private_export::Sealed + Send + 'static {
    /// The element type.
    type Elem: DlpackDtype;
    /// Base address, element count and DLPack device.
    #[doc(hidden)]
    fn dlpack_parts(&self) -> (*mut c_void, usize, DLDevice);
}

mod private_export {
    pub trait Sealed {
        /// Waits for every pending stream-ordered use of the buffer: a DLPack consumer
        /// uses the memory on its own streams, which gpubind cannot order.
        fn settle(&mut self) -> crate::Result<()> {
            Ok(())
        }
    }
}

const HOST0: DLDevice = DLDevice {
    device_type: DLDeviceType::CPU,
    device_id: 0,
};
const CUDA_HOST0: DLDevice = DLDevice {
    device_type: DLDeviceType::CUDA_HOST,
    device_id: 0,
};

macro_rules! exportable {
    ($ty:ty, |$b:ident| $parts:expr) => {
        impl<T: DlpackDtype> private_export::Sealed for $ty {}
        exportable!(@export $ty, |$b| $parts);
    };
    ($ty:ty, tracked: |$t:ident| $tracker:expr, |$b:ident| $parts:expr) => {
        impl<T: DlpackDtype> private_export::Sealed for $ty {
            fn settle(&mut self) -> crate::Result<()> {
                let $t = self;
                $tracker.wait_all()
            }
        }
        exportable!(@export $ty, |$b| $parts);
    };
    (@export $ty:ty, |$b:ident| $parts:expr) => {
        impl<T: DlpackDtype> DlpackExport for $ty {
            type Elem = T;
            fn dlpack_parts(&self) -> (*mut c_void, usize, DLDevice) {
                let $b = self;
                $parts
            }
        }
    };
}
exportable!(Vec<T>, |b| (b.as_ptr() as *mut c_void, b.len(), HOST0));
exportable!(DeviceSlice<T>, tracked: |t| t.tracker_mut(), |b| (
    b.device_ptr() as *mut c_void,
    b.len(),
    DLDevice {
        device_type: DLDeviceType::CUDA,
        device_id: b.device().ordinal() as i32
    }
));
// Host kinds give their address without `Deref`, which waits for the pending uses (and
// aborts if that wait fails): the export waits itself, in `settle`, and returns its error.
exportable!(PinnedHostBuffer<T>, tracked: |t| t.tracker_mut(), |b| {
    let (ptr, len) = b.raw_parts();
    (ptr.cast(), len, CUDA_HOST0)
});
exportable!(RegisteredHost<'static, T>, tracked: |t| t.tracker_mut(), |b| {
    let (ptr, len) = b.raw_parts();
    (ptr.cast(), len, CUDA_HOST0)
});
exportable!(ManagedSlice<T>, tracked: |t| t.tracker_mut(), |b| (
    b.device_ptr() as *mut c_void,
    b.len(),
    DLDevice {
        device_type: DLDeviceType::CUDA_MANAGED,
        device_id: 0
    }
));

/// What an exported tensor's `manager_ctx` points to. `managed` comes first (`repr(C)`),
/// so the managed struct lives inside this allocation.
#[repr(C)]
struct ExportCtx<B, M> {
    managed: M,
    shape: Box<[i64]>,
    strides: Box<[i64]>,
    buffer: B,
}

/// The deleter of exported tensors: frees the context box (and so the buffer) once.
unsafe extern "C" fn delete_export<B, M: ManagedTensor>(p: *mut M) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` is the `managed` field of a leaked `Box<ExportCtx<B, M>>` whose
    // `manager_ctx` is that box; the consumer calls the deleter once, so the box is
    // rebuilt and dropped once. Panics cannot cross this extern "C" boundary (they abort).
    unsafe {
        let ctx = (*p).manager_ctx().cast::<ExportCtx<B, M>>();
        drop(Box::from_raw(ctx));
    }
}

/// A tensor exported by gpubind, owning its buffer until handed to a consumer.
pub struct ExportedTensor<M: ManagedTensor = DLManagedTensorVersioned> {
    raw: NonNull<M>,
}

// SAFETY: the context holds a `B: Send` buffer and boxed shape/strides; nothing in it is
// tied to a thread.
unsafe impl<M: ManagedTensor> Send for ExportedTensor<M> {}

impl<M: ManagedTensor> ExportedTensor<M> {
    /// The tensor description.
    pub fn tensor(&self) -> &DLTensor {
        // SAFETY: `raw` is live until into_raw or drop.
        unsafe { self.raw.as_ref() }.dl_tensor()
    }

    /// The managed struct.
    pub fn managed(&self) -> &M {
        // SAFETY: as above.
        unsafe { self.raw.as_ref() }
    }

    /// Hands the tensor over: the receiver owns it and must call its deleter once.
    pub fn into_raw(self) -> *mut M {
        let me = std::mem::ManuallyDrop::new(self);
        me.raw.as_ptr()
    }
}

impl<M: ManagedTensor> Drop for ExportedTensor<M> {
    fn drop(&mut self) {
        // SAFETY: never handed over (into_raw forgets self), so we own it; deleted once.
        unsafe { M::delete(self.raw) }
    }
}

impl<M: ManagedTensor> std::fmt::Debug for ExportedTensor<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportedTensor")
            .field("tensor", self.tensor())
            .finish()
    }
}

fn export_as<B: DlpackExport, M: ManagedTensor>(
    mut buffer: B,
    shape: &[i64],
) -> std::result::Result<ExportedTensor<M>, Box<GivenBack<B>>> {
    let checked = check_shape(&buffer, shape).and_then(|ndim| {
        buffer.settle()?;
        Ok(ndim)
    });
    let ndim = match checked {
        Ok(ndim) => ndim,
        Err(error) => return Err(GivenBack::boxed(buffer, error)),
    };
    let (data, len, device) = buffer.dlpack_parts();
    let mut shape: Box<[i64]> = shape.into();
    let mut strides: Box<[i64]> = compact_strides(&shape).into();
    let tensor = DLTensor {
        data: if len == 0 { std::ptr::null_mut() } else { data },
        device,
        ndim,
        dtype: B::Elem::DTYPE,
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: 0,
    };
    let ctx = Box::into_raw(Box::new(ExportCtx {
        managed: M::assemble(tensor, std::ptr::null_mut(), delete_export::<B, M>),
        shape,
        strides,
        buffer,
    }));
    // SAFETY: `ctx` is the live box just leaked; `managed` is its first field.
    unsafe {
        let managed = std::ptr::addr_of_mut!((*ctx).managed);
        (*managed).set_manager_ctx(ctx.cast());
        Ok(ExportedTensor {
            raw: NonNull::new_unchecked(managed),
        })
    }
}

/// The number of dimensions of `shape`, checked against `buffer`'s length.
fn check_shape<B: DlpackExport>(buffer: &B, shape: &[i64]) -> Result<i32> {
    let (_, len, _) = buffer.dlpack_parts();
    let n = shape_len(shape)?;
    crate::memory::expect_len("DLPack export shape", len, n)?;
    i32::try_from(shape.len())
        .map_err(|_| Error::InvalidArgument(format!("{} dimensions", shape.len())))
}

/// Exports `buffer` as a versioned DLPack tensor of `shape` (row-major; the product of
/// `shape` must equal the buffer's length).
///
/// Waits first for the buffer's pending stream-ordered uses: the consumer uses the
/// memory on its own streams, which gpubind cannot order.
///
/// # Errors
///
/// A [`GivenBack`] with `buffer`, unchanged and still usable, and the error:
/// [`Error::SizeMismatch`] when the product of `shape` is not the buffer's length,
/// [`Error::InvalidArgument`] for a negative extent, a product that overflows `usize`
/// or more than `i32::MAX` dimensions, and the wait's error (a driver error naming its
/// call, or [`Error::Timeout`] past `GPUBIND_DROP_TIMEOUT`). `?` turns it into the
/// [`Error`], dropping the buffer.
///
/// ```
/// use gpubind::{Error, dlpack};
/// let data = vec![1.0f32; 6];
/// let failed = dlpack::export(data, &[4, 2]).unwrap_err();
/// assert!(matches!(failed.error, Error::SizeMismatch { expected: 6, found: 8, .. }));
/// let t = dlpack::export(failed.input, &[2, 3])?; // the same Vec, exported
/// # drop(t);
/// # Ok::<(), gpubind::Error>(())
/// ```
pub fn export<B: DlpackExport>(
    buffer: B,
    shape: &[i64],
) -> std::result::Result<ExportedTensor<DLManagedTensorVersioned>, Box<GivenBack<B>>> {
    export_as(buffer, shape)
}

/// Exports `buffer` as a legacy (`DLManagedTensor`) tensor of `shape`.
///
/// # Errors
///
/// As [`export`]: a [`GivenBack`] with the buffer.
pub fn export_legacy<B: DlpackExport>(
    buffer: B,
    shape: &[i64],
) -> std::result::Result<ExportedTensor<DLManagedTensor>, Box<GivenBack<B>>> {
    export_as(buffer, shape)
}

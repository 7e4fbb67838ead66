//! Import of foreign DLPack tensors: [`ImportedTensor`] and
//! [`BoundDevice::import_dlpack`].

use super::dtype::DlpackDtype;
use super::header::{
    DLDevice, DLDeviceType, DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_READ_ONLY,
    DLPACK_MAJOR_VERSION, ManagedTensor,
};
use super::shape::{compact_strides, shape_len};
use crate::context::BoundDevice;
use crate::copy::{Endpoint, MemoryKind};
use crate::device::Device;
use crate::error::{Error, Result};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

/// Owns a foreign managed tensor: calls its deleter once on drop.
struct Owned<M: ManagedTensor>(NonNull<M>);

impl<M: ManagedTensor> Drop for Owned<M> {
    fn drop(&mut self) {
        // SAFETY: we took ownership of the live tensor at import; deleted once, here.
        unsafe { M::delete(self.0) }
    }
}

/// A foreign DLPack tensor owned by gpubind: its deleter runs once, when this drops.
///
/// Row-major contiguous, of element type `T`. Copy it to or from any memory kind with
/// [`BoundDevice::copy`] / [`CopyScope::copy`](crate::CopyScope::copy); host tensors
/// (`kDLCPU`, `kDLCUDAHost`) also give slices ([`as_slice`](Self::as_slice)).
pub struct ImportedTensor<T: DlpackDtype, M: ManagedTensor = DLManagedTensorVersioned> {
    owner: Owned<M>,
    /// `data + byte_offset`.
    addr: u64,
    len: usize,
    shape: Vec<i64>,
    kind: MemoryKind,
    device: Option<Arc<Device>>,
    read_only: bool,
    _t: PhantomData<T>,
}

fn mismatch(what: &'static str, expected: impl Into<String>, found: impl Into<String>) -> Error {
    Error::DlpackMismatch {
        what,
        expected: expected.into(),
        found: found.into(),
    }
}

fn device_name(d: DLDevice) -> String {
    let name = match d.device_type {
        DLDeviceType::CPU => "kDLCPU",
        DLDeviceType::CUDA => "kDLCUDA",
        DLDeviceType::CUDA_HOST => "kDLCUDAHost",
        DLDeviceType::CUDA_MANAGED => "kDLCUDAManaged",
        DLDeviceType::ROCM => "kDLROCM",
        _ => "device type",
    };
    format!("{name}({}):{}", d.device_type.0, d.device_id)
}

impl<T: DlpackDtype, M: ManagedTensor> ImportedTensor<T, M> {
    /// Takes ownership of `ptr`, checks it, and maps its device with `accept`.
    ///
    /// # Safety
    ///
    /// `ptr` is null or a live managed tensor that the caller owns and hands over.
    unsafe fn import(
        ptr: *mut M,
        accept: impl FnOnce(DLDevice) -> Result<(MemoryKind, Option<Arc<Device>>)>,
    ) -> Result<Self> {
        let owner = Owned(
            NonNull::new(ptr).ok_or_else(|| Error::InvalidArgument("null DLPack tensor".into()))?,
        );
        // From here every early return drops `owner`, which calls the deleter once.
        // SAFETY: live tensor owned by `owner`.
        let managed = unsafe { owner.0.as_ref() };
        if let Some(v) = managed.version()
            && v.major != DLPACK_MAJOR_VERSION
        {
            return Err(mismatch(
                "version",
                format!("major {DLPACK_MAJOR_VERSION}"),
                format!("{}.{}", v.major, v.minor),
            ));
        }
        let t = managed.dl_tensor();
        let (kind, device) = accept(t.device)?;
        if t.dtype != T::DTYPE {
            return Err(mismatch(
                "dtype",
                format!("{:?} for {}", T::DTYPE, std::any::type_name::<T>()),
                format!("{:?}", t.dtype),
            ));
        }
        let ndim = usize::try_from(t.ndim)
            .map_err(|_| Error::InvalidArgument(format!("ndim {} < 0", t.ndim)))?;
        let shape: Vec<i64> = if ndim == 0 {
            Vec::new()
        } else if t.shape.is_null() {
            return Err(Error::InvalidArgument(
                "DLPack tensor with null shape".into(),
            ));
        } else {
            // SAFETY: DLPack: `shape` points to `ndim` extents while the tensor lives.
            unsafe { std::slice::from_raw_parts(t.shape, ndim) }.to_vec()
        };
        let len = shape_len(&shape)?;
        if ndim > 0 && !t.strides.is_null() {
            // SAFETY: DLPack: non-null `strides` points to `ndim` values.
            let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
            let want = compact_strides(&shape);
            // Extents of 1 make their stride irrelevant; an empty tensor has no layout.
            let fits = len == 0
                || shape
                    .iter()
                    .zip(strides.iter().zip(&want))
                    .all(|(&d, (&s, &w))| d == 1 || s == w);
            if !fits {
                return Err(mismatch(
                    "layout",
                    format!("row-major contiguous strides {want:?}"),
                    format!("strides {strides:?} for shape {shape:?}"),
                ));
            }
        }
        let addr = (t.data as u64)
            .checked_add(t.byte_offset)
            .ok_or_else(|| Error::InvalidArgument("data + byte_offset overflows".into()))?;
        if len > 0 && (t.data.is_null() || addr % std::mem::align_of::<T>() as u64 != 0) {
            return Err(mismatch(
                "layout",
                format!(
                    "a non-null address aligned to {}",
                    std::mem::align_of::<T>()
                ),
                format!("{addr:#x}"),
            ));
        }
        // No allocation holds more than `isize::MAX` bytes or wraps the address space, so
        // a tensor that claims to is refused before any slice or copy is sized by it.
        let fits_memory = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&bytes| bytes <= isize::MAX as usize)
            .and_then(|bytes| addr.checked_add(bytes as u64))
            .is_some();
        if !fits_memory {
            return Err(mismatch(
                "layout",
                format!("at most {} bytes, within the address space", isize::MAX),
                format!(
                    "{len} elements of {} bytes at {addr:#x} (shape {shape:?})",
                    std::mem::size_of::<T>()
                ),
            ));
        }
        let read_only = managed.flags() & DLPACK_FLAG_BITMASK_READ_ONLY != 0;
        Ok(ImportedTensor {
            owner,
            addr,
            len,
            shape,
            kind,
            device,
            read_only,
            _t: PhantomData,
        })
    }

    /// Imports a host (`kDLCPU`) tensor; needs no GPU. Any other device type is
    /// [`Error::DlpackMismatch`]. The deleter is called exactly once: when the result
    /// drops, or before an error is returned.
    ///
    /// # Safety
    ///
    /// `ptr` is null or a live managed tensor that the caller owns and hands over; its
    /// data stays valid (and, unless flagged read-only, unaliased) until the deleter runs.
    pub unsafe fn from_raw_cpu(ptr: *mut M) -> Result<Self> {
        // SAFETY: forwarded contract.
        unsafe {
            Self::import(ptr, |d| {
                if d.device_type == DLDeviceType::CPU {
                    Ok((MemoryKind::Pageable, None))
                } else {
                    Err(mismatch("device", "kDLCPU(1):0", device_name(d)))
                }
            })
        }
    }

    /// The extents.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory kind the device type maps to.
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }

    /// The tensor's DLPack device.
    pub fn dl_device(&self) -> DLDevice {
        // SAFETY: live while `owner` is.
        unsafe { self.owner.0.as_ref() }.dl_tensor().device
    }

    /// Whether the producer flagged the tensor read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The elements, for host tensors (`kDLCPU`, `kDLCUDAHost`); `None` for device
    /// memory.
    pub fn as_slice(&self) -> Option<&[T]> {
        if !self.kind.is_host() {
            return None;
        }
        if self.len == 0 {
            return Some(&[]);
        }
        // SAFETY: checked at import: non-null, aligned, contiguous `len` elements of `T`
        // (dtype matched) in host memory that lives until the deleter runs.
        Some(unsafe { std::slice::from_raw_parts(self.addr as *const T, self.len) })
    }

    /// The elements, writable, for host tensors not flagged read-only.
    pub fn as_mut_slice(&mut self) -> Option<&mut [T]> {
        if !self.kind.is_host() || self.read_only {
            return None;
        }
        if self.len == 0 {
            return Some(&mut []);
        }
        // SAFETY: as in `as_slice`, with an exclusive borrow (the import contract makes
        // the data ours until the deleter runs).
        Some(unsafe { std::slice::from_raw_parts_mut(self.addr as *mut T, self.len) })
    }

    fn endpoint(&self) -> Endpoint<'_> {
        Endpoint::new(self.addr, self.len, self.kind, self.device.as_ref())
    }
}

impl<T: DlpackDtype, M: ManagedTensor> crate::copy::seal::Sealed for ImportedTensor<T, M> {}
impl<T: DlpackDtype, M: ManagedTensor> crate::copy::CopySource<T> for ImportedTensor<T, M> {
    fn source(&self) -> Endpoint<'_> {
        self.endpoint()
    }
}
impl<T: DlpackDtype, M: ManagedTensor> crate::copy::CopyDest<T> for ImportedTensor<T, M> {
    fn dest(&mut self) -> Result<Endpoint<'_>> {
        if self.read_only {
            return Err(Error::ReadOnly {
                what: "imported DLPack tensor",
            });
        }
        Ok(self.endpoint())
    }
}

impl<T: DlpackDtype, M: ManagedTensor> std::fmt::Debug for ImportedTensor<T, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedTensor")
            .field("device", &device_name(self.dl_device()))
            .field("shape", &self.shape)
            .field("type", &std::any::type_name::<T>())
            .field("read_only", &self.read_only)
            .finish()
    }
}

impl<'a> BoundDevice<'a> {
    /// Takes ownership of a foreign DLPack tensor on this device (`kDLCUDA` with this
    /// ordinal), in managed memory (`kDLCUDAManaged`), pinned host memory
    /// (`kDLCUDAHost`) or host memory (`kDLCPU`), with element type `T`, row-major
    /// contiguous. Otherwise [`Error::DlpackMismatch`]. The deleter is called exactly
    /// once: when the result drops, or before an error is returned.
    ///
    /// `M` is [`DLManagedTensorVersioned`] or the legacy [`DLManagedTensor`](super::DLManagedTensor).
    ///
    /// # Safety
    ///
    /// `ptr` is null or a live managed tensor that the caller owns and hands over; its
    /// data stays valid (and, unless flagged read-only, unaliased) until the deleter runs,
    /// and the producer's pending work on it is complete.
    pub unsafe fn import_dlpack<T: DlpackDtype, M: ManagedTensor>(
        &self,
        ptr: *mut M,
    ) -> Result<ImportedTensor<T, M>> {
        let ordinal = self.ordinal();
        let dev = self.device();
        // SAFETY: forwarded contract.
        unsafe {
            ImportedTensor::import(ptr, |d| match d.device_type {
                DLDeviceType::CUDA if d.device_id as i64 == ordinal as i64 => {
                    Ok((MemoryKind::Device, Some(Arc::clone(dev))))
                }
                DLDeviceType::CUDA_MANAGED => Ok((MemoryKind::Managed, Some(Arc::clone(dev)))),
                DLDeviceType::CUDA_HOST => Ok((MemoryKind::Pinned, None)),
                DLDeviceType::CPU => Ok((MemoryKind::Pageable, None)),
                _ => Err(mismatch(
                    "device",
                    format!("kDLCUDA(2):{ordinal}, kDLCUDAManaged, kDLCUDAHost or kDLCPU"),
                    device_name(d),
                )),
            })
        }
    }
}

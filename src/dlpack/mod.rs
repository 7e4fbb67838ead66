//! DLPack interchange: the `dlpack.h` (v1.x) structs, export of any gpubind buffer as a
//! tensor, and import of a foreign tensor.
//!
//! # Export
//!
//! [`export`] (versioned, [`DLManagedTensorVersioned`]) and [`export_legacy`]
//! ([`DLManagedTensor`]) move a buffer into a heap context together with the shape and
//! (row-major, contiguous) strides. The resulting [`ExportedTensor`] keeps the buffer
//! alive; hand the raw pointer to a consumer with [`ExportedTensor::into_raw`]. The
//! consumer's one call of the tensor's `deleter` frees the buffer (in its own context,
//! from any thread); an `ExportedTensor` dropped before being handed over calls it itself.
//!
//! | gpubind buffer | `device_type` | `device_id` |
//! | --- | --- | --- |
//! | `Vec<T>` (pageable) | `kDLCPU` (1) | 0 |
//! | [`DeviceSlice`] | `kDLCUDA` (2) | the device ordinal |
//! | [`PinnedHostBuffer`] | `kDLCUDAHost` (3) | 0 |
//! | [`RegisteredHost<'static, T>`](RegisteredHost) | `kDLCUDAHost` (3) | 0 |
//! | [`ManagedSlice`] | `kDLCUDAManaged` (13) | 0 |
//!
//! ```
//! use gpubind::dlpack::{self, DLDeviceType};
//! let t = dlpack::export(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
//! let tensor = t.tensor();
//! assert_eq!(tensor.device.device_type, DLDeviceType::CPU);
//! assert_eq!(tensor.ndim, 2);
//! let raw = t.into_raw(); // a consumer now owns it and must call its deleter once
//! // SAFETY: `raw` came from `export` and is still owned by us.
//! unsafe { ((*raw).deleter.unwrap())(raw) };
//! # Ok::<(), gpubind::Error>(())
//! ```
//!
//! An exported buffer must own its memory: a registration that borrows a `Vec` cannot be
//! exported, because the consumer could outlive the borrow:
//!
//! ```compile_fail,E0597
//! # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
//! let mut v = vec![0f32; 4];
//! let reg = gpu.register_host(&mut v, Default::default())?;
//! let t = gpubind::dlpack::export(reg, &[4])?; // error[E0597]: `v` does not live long enough
//! # Ok(()) }
//! ```
//!
//! Register an owned `Vec` instead: `gpu.register_vec(v, Default::default())?` is a
//! `RegisteredHost<'static, f32>`.
//!
//! # Import
//!
//! [`BoundDevice::import_dlpack`] (and the host-only [`ImportedTensor::from_raw_cpu`])
//! take ownership of a foreign tensor: the deleter is called exactly once — when the
//! [`ImportedTensor`] drops, or before an import error is returned. The tensor must be
//! on the bound device (`kDLCUDA` with its ordinal; `kDLCUDAManaged`, `kDLCUDAHost` and
//! `kDLCPU` are accepted too), have `T`'s dtype, and be row-major contiguous; otherwise
//! the import fails with [`Error::DlpackMismatch`]. An `ImportedTensor` is a
//! [`CopySource`](crate::CopySource) (and, unless flagged read-only, a
//! [`CopyDest`](crate::CopyDest)), so it copies to and from every memory kind.

use crate::context::BoundDevice;
use crate::copy::{Endpoint, MemoryKind};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::memory::host::{PinnedHostBuffer, RegisteredHost};
use crate::memory::managed::ManagedSlice;
use crate::memory::{DeviceMemory, DeviceRepr, DeviceSlice};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

/// `DLPACK_MAJOR_VERSION` of the header these structs follow.
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// `DLPACK_MINOR_VERSION` of the header these structs follow.
pub const DLPACK_MINOR_VERSION: u32 = 3;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the data.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer made a copy the consumer solely owns.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;
/// `DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED`: sub-byte elements are padded, not packed.
pub const DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: u64 = 1 << 2;

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DLPackVersion {
    /// Major version: a different one means another ABI.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl DLPackVersion {
    /// The version these definitions follow.
    pub const CURRENT: DLPackVersion = DLPackVersion {
        major: DLPACK_MAJOR_VERSION,
        minor: DLPACK_MINOR_VERSION,
    };
}

/// `DLDeviceType`: an `int32_t` enum. A newtype rather than a Rust enum, so values a
/// newer producer sends are representable (and rejected with an error, not UB).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DLDeviceType(pub i32);

impl DLDeviceType {
    /// `kDLCPU`.
    pub const CPU: Self = Self(1);
    /// `kDLCUDA`.
    pub const CUDA: Self = Self(2);
    /// `kDLCUDAHost`: pinned CUDA host memory.
    pub const CUDA_HOST: Self = Self(3);
    /// `kDLOpenCL`.
    pub const OPENCL: Self = Self(4);
    /// `kDLVulkan`.
    pub const VULKAN: Self = Self(7);
    /// `kDLMetal`.
    pub const METAL: Self = Self(8);
    /// `kDLVPI`.
    pub const VPI: Self = Self(9);
    /// `kDLROCM`.
    pub const ROCM: Self = Self(10);
    /// `kDLROCMHost`.
    pub const ROCM_HOST: Self = Self(11);
    /// `kDLExtDev`.
    pub const EXT_DEV: Self = Self(12);
    /// `kDLCUDAManaged`: CUDA managed memory.
    pub const CUDA_MANAGED: Self = Self(13);
    /// `kDLOneAPI`.
    pub const ONE_API: Self = Self(14);
    /// `kDLWebGPU`.
    pub const WEBGPU: Self = Self(15);
    /// `kDLHexagon`.
    pub const HEXAGON: Self = Self(16);
    /// `kDLMAIA`.
    pub const MAIA: Self = Self(17);
    /// `kDLTrn`.
    pub const TRN: Self = Self(18);
}

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DLDevice {
    /// The device type.
    pub device_type: DLDeviceType,
    /// The device index (0 for CPU, pinned and managed memory).
    pub device_id: i32,
}

/// `DLDataTypeCode` values (the `code` of a [`DLDataType`]).
pub mod type_code {
    /// `kDLInt`.
    pub const INT: u8 = 0;
    /// `kDLUInt`.
    pub const UINT: u8 = 1;
    /// `kDLFloat`.
    pub const FLOAT: u8 = 2;
    /// `kDLOpaqueHandle`.
    pub const OPAQUE_HANDLE: u8 = 3;
    /// `kDLBfloat`.
    pub const BFLOAT: u8 = 4;
    /// `kDLComplex`.
    pub const COMPLEX: u8 = 5;
    /// `kDLBool`.
    pub const BOOL: u8 = 6;
}

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DLDataType {
    /// A [`type_code`] value.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Vector lanes (1 for scalars).
    pub lanes: u16,
}

/// `DLTensor`: a plain, non-owning tensor description.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    /// Base pointer (host or device address; NULL for an empty tensor).
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements (NULL meant "compact row-major" before v1.2).
    pub strides: *mut i64,
    /// Offset in bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLManagedTensor` (legacy, pre-v1.0 exchange struct).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees `manager_ctx` and the struct itself; called once by the consumer.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned` (the v1.x exchange struct).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// ABI version of this struct.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees `manager_ctx` and the struct itself; called once by the consumer.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*` bits.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// The two managed-tensor structs, for code shared by versioned and legacy exchange.
/// Sealed.
pub trait ManagedTensor: private::Sealed + Sized {
    /// The tensor description.
    fn dl_tensor(&self) -> &DLTensor;
    /// The version (`None` for the legacy struct).
    fn version(&self) -> Option<DLPackVersion>;
    /// The flags (0 for the legacy struct).
    fn flags(&self) -> u64;
    /// The deleter.
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)>;
    /// Calls the deleter of `ptr`, if any.
    ///
    /// # Safety
    ///
    /// `ptr` is a live managed tensor owned by the caller; it is invalid afterwards.
    unsafe fn delete(ptr: NonNull<Self>) {
        // SAFETY: the caller owns the live struct; the deleter field is readable for any
        // major version (the ABI keeps everything up to `flags` stable).
        if let Some(d) = unsafe { ptr.as_ref() }.deleter() {
            // SAFETY: the producer's deleter, called once with its own pointer.
            unsafe { d(ptr.as_ptr()) }
        }
    }
    #[doc(hidden)]
    fn assemble(
        dl_tensor: DLTensor,
        manager_ctx: *mut c_void,
        deleter: unsafe extern "C" fn(*mut Self),
    ) -> Self;
    #[doc(hidden)]
    fn manager_ctx(&self) -> *mut c_void;
    #[doc(hidden)]
    fn set_manager_ctx(&mut self, ctx: *mut c_void);
}

mod private {
    pub trait Sealed {}
    impl Sealed for super::DLManagedTensor {}
    impl Sealed for super::DLManagedTensorVersioned {}
}

/// The accessors both managed structs share (same field names).
macro_rules! managed_fields {
    () => {
        fn dl_tensor(&self) -> &DLTensor {
            &self.dl_tensor
        }
        fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
            self.deleter
        }
        fn manager_ctx(&self) -> *mut c_void {
            self.manager_ctx
        }
        fn set_manager_ctx(&mut self, ctx: *mut c_void) {
            self.manager_ctx = ctx;
        }
    };
}

impl ManagedTensor for DLManagedTensorVersioned {
    managed_fields!();
    fn version(&self) -> Option<DLPackVersion> {
        Some(self.version)
    }
    fn flags(&self) -> u64 {
        self.flags
    }
    fn assemble(
        dl_tensor: DLTensor,
        manager_ctx: *mut c_void,
        deleter: unsafe extern "C" fn(*mut Self),
    ) -> Self {
        DLManagedTensorVersioned {
            version: DLPackVersion::CURRENT,
            manager_ctx,
            deleter: Some(deleter),
            flags: 0,
            dl_tensor,
        }
    }
}

impl ManagedTensor for DLManagedTensor {
    managed_fields!();
    fn version(&self) -> Option<DLPackVersion> {
        None
    }
    fn flags(&self) -> u64 {
        0
    }
    fn assemble(
        dl_tensor: DLTensor,
        manager_ctx: *mut c_void,
        deleter: unsafe extern "C" fn(*mut Self),
    ) -> Self {
        DLManagedTensor {
            dl_tensor,
            manager_ctx,
            deleter: Some(deleter),
        }
    }
}

/// Element types with a DLPack dtype.
///
/// # Safety
///
/// `DTYPE` must describe `Self` exactly (`bits == 8 * size_of::<Self>()`, one lane).
pub unsafe trait DlpackDtype: DeviceRepr {
    /// The dtype.
    const DTYPE: DLDataType;
}

macro_rules! dlpack_dtype {
    ($($t:ty => $code:ident),* $(,)?) => { $(
        // SAFETY: a primitive of exactly `bits` bits, one lane, of that type code.
        unsafe impl DlpackDtype for $t {
            const DTYPE: DLDataType = DLDataType {
                code: type_code::$code,
                bits: (8 * std::mem::size_of::<$t>()) as u8,
                lanes: 1,
            };
        }
    )* };
}
dlpack_dtype!(
    i8 => INT, i16 => INT, i32 => INT, i64 => INT, isize => INT,
    u8 => UINT, u16 => UINT, u32 => UINT, u64 => UINT, usize => UINT,
    f32 => FLOAT, f64 => FLOAT, half::f16 => FLOAT, half::bf16 => BFLOAT,
);

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
exportable!(PinnedHostBuffer<T>, tracked: |t| t.tracker_mut(), |b| (
    b.as_ptr() as *mut c_void,
    b.len(),
    CUDA_HOST0
));
exportable!(RegisteredHost<'static, T>, tracked: |t| t.tracker_mut(), |b| (
    b.as_ptr() as *mut c_void,
    b.len(),
    CUDA_HOST0
));
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

/// Row-major contiguous strides for `shape`.
fn compact_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    strides
}

/// Element count of `shape`, or an error for negative or overflowing extents.
fn shape_len(shape: &[i64]) -> Result<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        let d = usize::try_from(d)
            .map_err(|_| Error::InvalidArgument(format!("negative extent {d} in shape")))?;
        acc.checked_mul(d)
            .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} overflows usize")))
    })
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
) -> Result<ExportedTensor<M>> {
    buffer.settle()?;
    let (data, len, device) = buffer.dlpack_parts();
    let n = shape_len(shape)?;
    crate::memory::expect_len("DLPack export shape", len, n)?;
    let ndim = i32::try_from(shape.len())
        .map_err(|_| Error::InvalidArgument(format!("{} dimensions", shape.len())))?;
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

/// Exports `buffer` as a versioned DLPack tensor of `shape` (row-major; the product of
/// `shape` must equal the buffer's length).
pub fn export<B: DlpackExport>(
    buffer: B,
    shape: &[i64],
) -> Result<ExportedTensor<DLManagedTensorVersioned>> {
    export_as(buffer, shape)
}

/// Exports `buffer` as a legacy (`DLManagedTensor`) tensor of `shape`.
pub fn export_legacy<B: DlpackExport>(
    buffer: B,
    shape: &[i64],
) -> Result<ExportedTensor<DLManagedTensor>> {
    export_as(buffer, shape)
}

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
    /// `M` is [`DLManagedTensorVersioned`] or the legacy [`DLManagedTensor`].
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

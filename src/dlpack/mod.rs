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
//! A refused export (a shape that does not fit, a failed wait for the buffer's pending
//! uses) gives the buffer back in its error, a [`GivenBack`](crate::GivenBack).
//!
//! | gpubind buffer | `device_type` | `device_id` |
//! | --- | --- | --- |
//! | `Vec<T>` (pageable) | `kDLCPU` (1) | 0 |
//! | [`DeviceSlice`](crate::DeviceSlice) | `kDLCUDA` (2) | the device ordinal |
//! | [`PinnedHostBuffer`](crate::PinnedHostBuffer) | `kDLCUDAHost` (3) | 0 |
//! | [`RegisteredHost<'static, T>`](crate::RegisteredHost) | `kDLCUDAHost` (3) | 0 |
//! | [`ManagedSlice`](crate::ManagedSlice) | `kDLCUDAManaged` (13) | 0 |
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
//! [`BoundDevice::import_dlpack`](crate::BoundDevice::import_dlpack) (and the host-only [`ImportedTensor::from_raw_cpu`])
//! take ownership of a foreign tensor: the deleter is called exactly once — when the
//! [`ImportedTensor`] drops, or before an import error is returned. The tensor must be
//! on the bound device (`kDLCUDA` with its ordinal; `kDLCUDAManaged`, `kDLCUDAHost` and
//! `kDLCPU` are accepted too), have `T`'s dtype, be row-major contiguous, and span at
//! most `isize::MAX` bytes without wrapping the address space; otherwise
//! the import fails with [`Error::DlpackMismatch`](crate::Error::DlpackMismatch). An `ImportedTensor` is a
//! [`CopySource`](crate::CopySource) (and, unless flagged read-only, a
//! [`CopyDest`](crate::CopyDest)), so it copies to and from every memory kind.

mod dtype;
mod export;
mod header;
mod import;
mod shape;

pub use dtype::DlpackDtype;
pub use export::{DlpackExport, ExportedTensor, export, export_legacy};
pub use header::{
    DLDataType, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPACK_FLAG_BITMASK_IS_COPIED, DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED,
    DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLPackVersion,
    DLTensor, ManagedTensor, type_code,
};
pub use import::ImportedTensor;

//! The backends that move the data of the collectives: gpubind's own NVRTC kernels for
//! ranks of one process (`kernels`), the same kernels for ranks that are processes of
//! one machine (`procs`, feature `ipc`), and NCCL (`nccl`; without the `nccl` feature a
//! stand-in of the same crate-internal API whose every way in is a typed error).

pub(crate) mod interface;
pub(crate) mod kernels;
// Without the `nccl` feature a stand-in with the same crate-internal API: nothing NCCL
// is compiled or linked, and `Backend::Nccl` is a typed error (`Error::FeatureDisabled`).
#[cfg_attr(not(feature = "nccl"), path = "nccl_off/mod.rs")]
pub(crate) mod nccl;
#[cfg(feature = "ipc")]
pub(crate) mod procs;

pub use nccl::{nccl_available, nccl_version};
#[cfg(feature = "ipc")]
pub use procs::PROCESS_STAGING_BYTES;
#[cfg(feature = "ipc")]
pub use procs::control::ProcessGroup;

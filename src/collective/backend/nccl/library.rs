//! The NCCL library: `libnccl` loaded at run time, its entry points, the calls that
//! need no communicator (version, unique id), the calls made on a raw handle (the
//! watchdog's `poll_raw` and `abort_raw`, a group's `cancel_group`), and NCCL's codes
//! for gpubind's operators and types.
//!
//! The types (`ncclUniqueId`, the data-type and reduction-operator codes) are cudarc's
//! (`cudarc::nccl::sys`). The entry points are resolved here with `libloading` instead
//! of through cudarc's loader, for two reasons: cudarc panics when a symbol or the
//! library is missing (we want [`Error::NoNccl`]), and its candidate names do not
//! include `libnccl.so.2`, the only name most NCCL installs (apt `libnccl2`, pip
//! `nvidia-nccl-cu*`) provide without the `-dev` package. Nothing is loaded until a
//! NCCL communicator is created or [`nccl_available`] is asked.
//!
//! NCCL uses the CUDA runtime, which may change the calling thread's current context
//! (`cudaSetDevice`). Every call here runs under [`RestoreCurrent`], which puts the
//! context the thread had back, so gpubind's binding invariant survives NCCL.

use crate::collective::api::types::Op;
use crate::driver::result;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t, ncclUniqueId};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

pub(crate) type Comm = *mut c_void;
pub(crate) type Stream = *mut c_void;
pub(crate) type Res = c_int;
/// The id `ncclCommInitRank` ranks meet by.
pub(crate) type UniqueId = ncclUniqueId;

/// The NCCL entry points gpubind uses (stable since NCCL 2.10).
pub(crate) struct Api {
    pub(crate) _lib: libloading::Library,
    pub(crate) get_version: unsafe extern "C" fn(*mut c_int) -> Res,
    pub(crate) get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> Res,
    pub(crate) comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> Res,
    pub(crate) comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, ncclUniqueId, c_int) -> Res,
    pub(crate) comm_destroy: unsafe extern "C" fn(Comm) -> Res,
    pub(crate) get_error_string: unsafe extern "C" fn(Res) -> *const c_char,
    pub(crate) group_start: unsafe extern "C" fn() -> Res,
    pub(crate) group_end: unsafe extern "C" fn() -> Res,
    #[allow(clippy::type_complexity)]
    pub(crate) all_reduce:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Res,
    #[allow(clippy::type_complexity)]
    pub(crate) reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> Res,
    #[allow(clippy::type_complexity)]
    pub(crate) broadcast:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Res,
    pub(crate) all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> Res,
    #[allow(clippy::type_complexity)]
    pub(crate) reduce_scatter:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Res,
    pub(crate) send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> Res,
    pub(crate) recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> Res,
    /// The bounded (non-blocking) initialisation, where the library has all three
    /// (`ncclCommInitRankConfig` needs NCCL 2.14; the other two are older).
    pub(crate) nonblocking: Option<NonBlockingApi>,
}

/// The entry points of NCCL's non-blocking mode.
#[derive(Clone, Copy)]
pub(crate) struct NonBlockingApi {
    #[allow(clippy::type_complexity)]
    pub(crate) init_rank_config:
        unsafe extern "C" fn(*mut Comm, c_int, ncclUniqueId, c_int, *mut ConfigV214) -> Res,
    pub(crate) get_async_error: unsafe extern "C" fn(Comm, *mut Res) -> Res,
    pub(crate) abort: unsafe extern "C" fn(Comm) -> Res,
    /// `ncclCommFinalize` (NCCL 2.14, like `ncclCommInitRankConfig`): on a non-blocking
    /// communicator it flushes the pending work in NCCL's background and answers
    /// `ncclInProgress`, so a drop can wait for it with a limit.
    pub(crate) finalize: unsafe extern "C" fn(Comm) -> Res,
}

/// `ncclConfig_t` as NCCL 2.14 defined it (the first four fields of every later one).
/// NCCL reads at most `size` bytes of it and, for a `version` older than its own, takes
/// its defaults for every field added since (`parseCommConfig` in init.cc), so this is
/// a valid config for every NCCL >= 2.14: it asks for `blocking = 0` and nothing else.
#[repr(C)]
pub(crate) struct ConfigV214 {
    pub(crate) size: usize,
    pub(crate) magic: std::ffi::c_uint,
    pub(crate) version: std::ffi::c_uint,
    pub(crate) blocking: c_int,
}
/// `ncclInProgress`.
pub(crate) const IN_PROGRESS: Res = 7;

/// Library names tried in order (after `$GPUBIND_NCCL_PATH`).
const LIB_NAMES: [&str; 3] = ["libnccl.so.2", "libnccl.so", "libnccl.so.1"];

impl Api {
    fn load() -> Option<Api> {
        let env = crate::config::nccl_path(&crate::config::env);
        let lib = env
            .iter()
            .map(String::as_str)
            .chain(LIB_NAMES)
            // SAFETY: loading NCCL runs its (side-effect free) ELF initialisers only.
            .find_map(|name| unsafe { libloading::Library::new(name) }.ok())?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the field's type is the C prototype of this NCCL entry point
                // (nccl.h, unchanged since NCCL 2.10); the pointer stays valid while
                // `_lib` (kept in the same struct) is loaded.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.ok()?
            };
        }
        Some(Api {
            get_version: sym!("ncclGetVersion"),
            get_unique_id: sym!("ncclGetUniqueId"),
            comm_init_all: sym!("ncclCommInitAll"),
            comm_init_rank: sym!("ncclCommInitRank"),
            comm_destroy: sym!("ncclCommDestroy"),
            get_error_string: sym!("ncclGetErrorString"),
            group_start: sym!("ncclGroupStart"),
            group_end: sym!("ncclGroupEnd"),
            all_reduce: sym!("ncclAllReduce"),
            reduce: sym!("ncclReduce"),
            broadcast: sym!("ncclBroadcast"),
            all_gather: sym!("ncclAllGather"),
            reduce_scatter: sym!("ncclReduceScatter"),
            send: sym!("ncclSend"),
            recv: sym!("ncclRecv"),
            nonblocking: (|| {
                Some(NonBlockingApi {
                    init_rank_config: sym!("ncclCommInitRankConfig"),
                    get_async_error: sym!("ncclCommGetAsyncError"),
                    abort: sym!("ncclCommAbort"),
                    finalize: sym!("ncclCommFinalize"),
                })
            })(),
            _lib: lib,
        })
    }

    /// Turns an `ncclResult_t` into a [`Result`], naming the call.
    pub(crate) fn check(&self, call: &'static str, code: Res) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString accepts any code and returns a static string.
        let text = unsafe { (self.get_error_string)(code) };
        let description = if text.is_null() {
            "no description".to_owned()
        } else {
            // SAFETY: non-null, NUL-terminated, static.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        Err(Error::Nccl {
            call,
            code,
            name: result_name(code).to_owned(),
            description,
        })
    }
}

/// The name of an `ncclResult_t` value.
pub(crate) fn result_name(code: i32) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        8 => "ncclTimeout",
        _ => "unknown ncclResult_t",
    }
}

/// The loaded library, or [`Error::NoNccl`].
pub(crate) fn api() -> Result<&'static Api> {
    static API: OnceLock<Option<Api>> = OnceLock::new();
    API.get_or_init(Api::load).as_ref().ok_or(Error::NoNccl)
}

/// Whether `libnccl` can be loaded (tries `$GPUBIND_NCCL_PATH`, `libnccl.so.2`,
/// `libnccl.so`). Needs no GPU.
pub fn nccl_available() -> bool {
    api().is_ok()
}

/// The NCCL version as `(major, minor, patch)`, or [`Error::NoNccl`].
pub fn nccl_version() -> Result<(u32, u32, u32)> {
    let api = api()?;
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    api.check("ncclGetVersion", unsafe { (api.get_version)(&mut v) })?;
    let v = v.max(0) as u32;
    Ok((v / 10000, (v / 100) % 100, v % 100))
}

/// Restores the thread's current context on drop if NCCL (the CUDA runtime) changed it.
pub(crate) struct RestoreCurrent {
    saved: sys::CUcontext,
    _same_thread: std::marker::PhantomData<*const ()>,
}

impl RestoreCurrent {
    pub(crate) fn new() -> Result<Self> {
        let saved = result::context::get_current()?;
        Ok(RestoreCurrent {
            saved,
            _same_thread: std::marker::PhantomData,
        })
    }
}

impl Drop for RestoreCurrent {
    fn drop(&mut self) {
        let restored = result::context::get_current().and_then(|now| {
            if now == self.saved {
                return Ok(());
            }
            // SAFETY: `saved` was current on this thread when we were created and is
            // kept retained by the caller's binding (or is null).
            unsafe { result::context::set_current(self.saved) }
        });
        if let Err(e) = restored {
            crate::teardown::faults::report_drop(
                format_args!("the context restorer around an NCCL call"),
                None,
                "restoring the thread's context",
                &e,
                "the thread's current context may be NCCL's (gpubind's next bound operation \
                 sets its own again)",
            );
        }
    }
}

/// `ncclCommGetAsyncError` of `raw`: `Err` with what NCCL reports if the communicator
/// failed (`ncclInProgress` is not a failure).
///
/// # Safety
///
/// `raw` is a live communicator nobody else calls NCCL on during this call (the caller
/// is inside its gate).
pub(crate) unsafe fn poll_raw(raw: usize) -> Result<()> {
    let api = api()?;
    let Some(nb) = api.nonblocking else {
        return Ok(());
    };
    let mut state: Res = 0;
    // SAFETY: the caller's contract; writes one result.
    let code = unsafe { (nb.get_async_error)(raw as Comm, &mut state) };
    api.check("ncclCommGetAsyncError", code)?;
    match state {
        0 | IN_PROGRESS => Ok(()),
        failed => api.check("ncclCommGetAsyncError", failed),
    }
}

/// `ncclCommAbort` of `raw` (a communicator of `nranks`), logging a failure.
///
/// # Safety
///
/// `raw` is a live communicator, aborted once (taken through its gate), nobody else is
/// inside NCCL on it, and it is never used after.
pub(crate) unsafe fn abort_raw(raw: usize, nranks: usize) {
    let Ok(api) = api() else { return };
    let Some(nb) = api.nonblocking else { return };
    // SAFETY: the caller's contract.
    let code = unsafe { (nb.abort)(raw as Comm) };
    // ncclInProgress: NCCL finishes the abort itself.
    let code = if code == IN_PROGRESS { 0 } else { code };
    if let Err(e) = api.check("ncclCommAbort", code) {
        crate::teardown::faults::report_drop(
            format_args!("an NCCL communicator of {nranks} ranks"),
            None,
            "aborting it",
            &e,
            crate::teardown::faults::MAYBE_LEAKED,
        );
    }
}

/// The error for a use of an aborted communicator.
pub(crate) fn aborted_error() -> Error {
    Error::InvalidArgument(
        "this NCCL communicator was aborted after an earlier error or timeout: make a new one"
            .into(),
    )
}

/// The bytes of `id`.
pub(crate) fn id_bytes(id: &UniqueId) -> [u8; 128] {
    id.internal.map(|c| c as u8)
}

/// A fresh unique id, as bytes.
pub(crate) fn unique_id_bytes() -> Result<[u8; 128]> {
    Ok(id_bytes(&unique_id()?))
}

/// A fresh `ncclUniqueId` for `ncclCommInitRank`.
pub(crate) fn unique_id() -> Result<ncclUniqueId> {
    let api = api()?;
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: writes one 128-byte id.
    api.check("ncclGetUniqueId", unsafe { (api.get_unique_id)(&mut id) })?;
    Ok(id)
}

/// Makes NCCL cancel the group open on this thread: an all-reduce on `comm` of a data
/// type NCCL does not have, which its argument check refuses (`ncclInvalidArgument`)
/// and records as the group's error, so that `ncclGroupEnd` launches none of the
/// group's calls and reports that error (NCCL makes a group atomic: after a failed call
/// it cancels every operation of the group). Returns whether NCCL refused the call.
///
/// # Safety
///
/// A group is open on this thread; `comm` is a live communicator nobody else calls
/// NCCL on meanwhile; `stream` a live stream of its device (NCCL refuses the call
/// before it looks at the stream or the null buffers).
pub(crate) unsafe fn cancel_group(api: &Api, comm: Comm, stream: sys::CUstream) -> bool {
    /// Not an `ncclDataType_t` (they are 0 and up).
    const NO_TYPE: c_int = -1;
    let sum = ncclRedOp_t::ncclSum as c_int;
    // SAFETY: the caller's contract; NCCL's argument check rejects the type before
    // anything is read, written or enqueued.
    let code = unsafe {
        (api.all_reduce)(
            std::ptr::null(),
            std::ptr::null_mut(),
            1,
            NO_TYPE,
            sum,
            comm,
            stream as Stream,
        )
    };
    code != 0 && code != IN_PROGRESS
}

/// NCCL's code for a reduction operator, in a communicator of `nranks` ranks.
///
/// With one rank the average *is* the sum, and NCCL is asked for `ncclSum`: NCCL 2.28.3's
/// `ncclAvg` on one rank returned a wrong last element for 65537 f64 values on an H200
/// (`gpu_collective`, twice, while `ncclSum` and our kernels were right). With more ranks
/// `ncclAvg` is used as is (not yet run: needs 2+ GPUs).
pub(crate) fn red_op(op: Op, nranks: usize) -> c_int {
    (match op {
        Op::Avg if nranks == 1 => ncclRedOp_t::ncclSum,
        Op::Sum => ncclRedOp_t::ncclSum,
        Op::Prod => ncclRedOp_t::ncclProd,
        Op::Min => ncclRedOp_t::ncclMin,
        Op::Max => ncclRedOp_t::ncclMax,
        Op::Avg => ncclRedOp_t::ncclAvg,
    }) as c_int
}

/// NCCL's data types, at [`CollectiveType::INDEX`](crate::collective::CollectiveType::INDEX).
const DTYPES: [ncclDataType_t; 7] = [
    ncclDataType_t::ncclFloat32,
    ncclDataType_t::ncclFloat64,
    ncclDataType_t::ncclFloat16,
    ncclDataType_t::ncclBfloat16,
    ncclDataType_t::ncclInt32,
    ncclDataType_t::ncclInt64,
    ncclDataType_t::ncclUint8,
];

/// NCCL's code for the data type at `index` (a [`crate::collective::CollectiveType::INDEX`], always
/// in range: the trait is sealed).
pub(crate) fn dtype_code(index: usize) -> c_int {
    DTYPES.get(index).map_or(-1, |&t| t as c_int)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_a_typed_error() {
        if !nccl_available() {
            assert_eq!(nccl_version().unwrap_err(), Error::NoNccl);
            assert!(Error::NoNccl.to_string().contains("LD_LIBRARY_PATH"));
        } else {
            assert!(nccl_version().unwrap().0 >= 2);
        }
    }

    #[test]
    fn codes_match_nccl_h() {
        assert_eq!(red_op(Op::Sum, 2), 0);
        assert_eq!(red_op(Op::Avg, 2), 4);
        assert_eq!(red_op(Op::Avg, 1), 0, "one rank: the average is the sum");
        assert_eq!(
            dtype_code(<half::bf16 as crate::collective::api::types::CollectiveType>::INDEX),
            9
        );
        assert_eq!(
            dtype_code(<f32 as crate::collective::api::types::CollectiveType>::INDEX),
            7
        );
        assert_eq!(
            dtype_code(<u8 as crate::collective::api::types::CollectiveType>::INDEX),
            1
        );
        assert_eq!(result_name(5), "ncclInvalidUsage");
        assert_eq!(result_name(IN_PROGRESS), "ncclInProgress");
        // nccl.h 2.14: size_t size; unsigned magic, version; int blocking.
        assert_eq!(std::mem::size_of::<ConfigV214>(), 24);
        assert_eq!(std::mem::offset_of!(ConfigV214, blocking), 16);
    }
}

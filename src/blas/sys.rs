//! The cuBLAS and cuBLASLt entry points the products use, resolved at run time.
//!
//! cuBLAS itself is chosen by [`crate::driver::libraries`] (its handle calls live there); the typed
//! GEMM entry points (`cublasGemmEx`, `cublasGemmStridedBatchedEx`) are resolved here from
//! that same library (opened again by the name it was loaded by, which yields the loaded
//! copy). cuBLASLt is chosen by the same rules as cuBLAS ([`crate::driver::libraries`]: the driver's
//! major version first, `GPUBIND_CUBLASLT_PATH` overriding), on first use.
//!
//! Enums are passed as plain integers with the values of the CUDA headers (the enums of
//! cudarc's bindings differ between binding versions, and a value outside one would be
//! undefined behaviour in Rust); `tests` checks them against cudarc's bindings.

use crate::driver::libraries::{self as libs, CublasHandle, LibraryInfo, Probe};
use crate::error::{Error, Result};
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

/// `cublasLtHandle_t` (opaque).
pub(crate) type LtHandle = *mut c_void;
/// `cublasLtMatmulDesc_t` (opaque).
pub(crate) type LtDesc = *mut c_void;
/// `cublasLtMatrixLayout_t` (opaque).
pub(crate) type LtLayout = *mut c_void;
/// `cublasLtMatmulPreference_t` (opaque).
pub(crate) type LtPref = *mut c_void;

/// `cublasLtMatmulAlgo_t` (cublasLt.h): 64 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LtAlgo {
    pub(crate) data: [u64; 8],
}

/// `cublasLtMatmulHeuristicResult_t` (cublasLt.h), with the status as a plain integer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LtHeuristic {
    pub(crate) algo: LtAlgo,
    pub(crate) workspace_size: usize,
    pub(crate) state: c_int,
    pub(crate) waves_count: f32,
    pub(crate) reserved: [c_int; 4],
}

// cudaDataType_t (library_types.h).
pub(crate) const CUDA_R_32F: c_int = 0;
pub(crate) const CUDA_R_64F: c_int = 1;
pub(crate) const CUDA_R_16F: c_int = 2;
pub(crate) const CUDA_R_16BF: c_int = 14;
// cublasComputeType_t (cublas_api.h).
pub(crate) const COMPUTE_32F: c_int = 68;
pub(crate) const COMPUTE_64F: c_int = 70;
pub(crate) const COMPUTE_32F_FAST_TF32: c_int = 77;
/// `CUBLAS_GEMM_DEFAULT`.
pub(crate) const GEMM_DEFAULT: c_int = -1;
// cublasLtMatmulDescAttributes_t (cublasLt.h).
pub(crate) const DESC_TRANSA: c_int = 3;
pub(crate) const DESC_TRANSB: c_int = 4;
pub(crate) const DESC_EPILOGUE: c_int = 7;
pub(crate) const DESC_BIAS_POINTER: c_int = 8;
pub(crate) const DESC_EPILOGUE_AUX_POINTER: c_int = 11;
pub(crate) const DESC_EPILOGUE_AUX_LD: c_int = 12;
// cublasLtMatmulPreferenceAttributes_t (cublasLt.h).
pub(crate) const PREF_MAX_WORKSPACE_BYTES: c_int = 1;
pub(crate) const PREF_MIN_ALIGNMENT_A_BYTES: c_int = 5;

/// `cublasGemmEx` (cublas_api.h).
pub(crate) type GemmExFn = unsafe extern "C" fn(
    CublasHandle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
) -> c_int;

/// `cublasGemmStridedBatchedEx` (cublas_api.h).
pub(crate) type GemmStridedBatchedExFn = unsafe extern "C" fn(
    CublasHandle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    i64,
    *const c_void,
    c_int,
    c_int,
    i64,
    *const c_void,
    *mut c_void,
    c_int,
    c_int,
    i64,
    c_int,
    c_int,
    c_int,
) -> c_int;

/// `cublas{S,D}gemv_v2(handle, trans, m, n, alpha, A, lda, x, incx, beta, y, incy)`
/// (cublas_api.h), for `T` = f32 or f64.
pub(crate) type GemvFn<T> = unsafe extern "C" fn(
    CublasHandle,
    c_int,
    c_int,
    c_int,
    *const T,
    *const T,
    c_int,
    *const T,
    c_int,
    *const T,
    *mut T,
    c_int,
) -> c_int;

/// `cublas{S,D}asum_v2(handle, n, x, incx, result)` (cublas_api.h).
pub(crate) type AsumFn<T> =
    unsafe extern "C" fn(CublasHandle, c_int, *const T, c_int, *mut T) -> c_int;

/// `cublasGemmGroupedBatchedEx` (cublas_api.h, cuBLAS 12.5 and later): per group
/// `transa, transb, m, n, k, alpha, lda, ldb, beta, ldc, group_size` (host arrays), the
/// matrices' addresses (device arrays, one entry per product), types and compute type.
pub(crate) type GemmGroupedBatchedExFn = unsafe extern "C" fn(
    CublasHandle,
    *const c_int,
    *const c_int,
    *const c_int,
    *const c_int,
    *const c_int,
    *const c_void,
    *const *const c_void,
    c_int,
    *const c_int,
    *const *const c_void,
    c_int,
    *const c_int,
    *const c_void,
    *const *mut c_void,
    c_int,
    *const c_int,
    c_int,
    *const c_int,
    c_int,
) -> c_int;

/// `cublasSetPointerMode_v2(handle, mode)`: `CUBLAS_POINTER_MODE_HOST` = 0,
/// `CUBLAS_POINTER_MODE_DEVICE` = 1.
pub(crate) type SetPointerModeFn = unsafe extern "C" fn(CublasHandle, c_int) -> c_int;
/// `CUBLAS_POINTER_MODE_HOST`.
pub(crate) const POINTER_MODE_HOST: c_int = 0;
/// `CUBLAS_POINTER_MODE_DEVICE`.
pub(crate) const POINTER_MODE_DEVICE: c_int = 1;

/// The cuBLAS version that introduced `cublasGemmGroupedBatchedEx`.
pub(crate) const GROUPED_GEMM_SINCE: (u32, u32) = (12, 5);

/// The typed entry points of the cuBLAS [`crate::driver::libraries`] chose.
pub(crate) struct CublasEx {
    _lib: libloading::Library,
    pub(crate) gemm_ex: GemmExFn,
    pub(crate) gemm_strided_batched_ex: GemmStridedBatchedExFn,
    pub(crate) set_pointer_mode: SetPointerModeFn,
    pub(crate) sgemv: GemvFn<f32>,
    pub(crate) dgemv: GemvFn<f64>,
    pub(crate) sasum: AsumFn<f32>,
    pub(crate) dasum: AsumFn<f64>,
    /// `None` before cuBLAS 12.5.
    pub(crate) gemm_grouped_batched_ex: Option<GemmGroupedBatchedExFn>,
}

/// `cublasLtMatmul` (cublasLt.h).
pub(crate) type LtMatmulFn = unsafe extern "C" fn(
    LtHandle,
    LtDesc,
    *const c_void,
    *const c_void,
    LtLayout,
    *const c_void,
    LtLayout,
    *const c_void,
    *const c_void,
    LtLayout,
    *mut c_void,
    LtLayout,
    *const LtAlgo,
    *mut c_void,
    usize,
    *mut c_void,
) -> c_int;

/// `cublasLtMatmulAlgoGetHeuristic` (cublasLt.h).
pub(crate) type LtHeuristicFn = unsafe extern "C" fn(
    LtHandle,
    LtDesc,
    LtLayout,
    LtLayout,
    LtLayout,
    LtLayout,
    LtPref,
    c_int,
    *mut LtHeuristic,
    *mut c_int,
) -> c_int;

/// `cublas*SetAttribute(object, attribute, buf, bytes)` (cublasLt.h).
pub(crate) type SetAttrFn = unsafe extern "C" fn(*mut c_void, c_int, *const c_void, usize) -> c_int;

/// The cuBLASLt entry points gpubind uses.
pub(crate) struct CublasLt {
    _lib: libloading::Library,
    pub(crate) create: unsafe extern "C" fn(*mut LtHandle) -> c_int,
    pub(crate) destroy: unsafe extern "C" fn(LtHandle) -> c_int,
    pub(crate) desc_create: unsafe extern "C" fn(*mut LtDesc, c_int, c_int) -> c_int,
    pub(crate) desc_destroy: unsafe extern "C" fn(LtDesc) -> c_int,
    pub(crate) desc_set: SetAttrFn,
    pub(crate) layout_create: unsafe extern "C" fn(*mut LtLayout, c_int, u64, u64, i64) -> c_int,
    pub(crate) layout_destroy: unsafe extern "C" fn(LtLayout) -> c_int,
    pub(crate) pref_create: unsafe extern "C" fn(*mut LtPref) -> c_int,
    pub(crate) pref_destroy: unsafe extern "C" fn(LtPref) -> c_int,
    pub(crate) pref_set: SetAttrFn,
    pub(crate) heuristic: LtHeuristicFn,
    pub(crate) matmul: LtMatmulFn,
    pub(crate) info: LibraryInfo,
}

/// Resolves `$name` from `$lib` as the type of the field it is assigned to.
macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: every field this initialises has the C prototype of the named entry
        // point (cublas_api.h / cublasLt.h, unchanged since CUDA 11), with enums as ints;
        // the pointer is used only while the library, kept in the same struct, is loaded.
        match unsafe { $lib.get(concat!($name, "\0").as_bytes()) } {
            Ok(s) => *s,
            Err(_) => return Err(format!("no symbol {}", $name)),
        }
    };
}

impl CublasEx {
    fn resolve(lib: libloading::Library) -> std::result::Result<Self, String> {
        // cudarc 0.19 binds cublasGemmGroupedBatchedEx only for its cuda-12050 and later
        // binding features, and gpubind takes its cuBLAS from the machine whatever the
        // binding feature: the symbol is looked up here, by name, and may be absent.
        // SAFETY: the field has cublasGemmGroupedBatchedEx's C prototype (cublas_api.h,
        // 12.5), with enums as ints; used only while `lib`, kept in the struct, is loaded.
        let grouped = unsafe { lib.get::<GemmGroupedBatchedExFn>(b"cublasGemmGroupedBatchedEx\0") }
            .ok()
            .map(|s| *s);
        Ok(CublasEx {
            gemm_ex: sym!(lib, "cublasGemmEx"),
            gemm_strided_batched_ex: sym!(lib, "cublasGemmStridedBatchedEx"),
            set_pointer_mode: sym!(lib, "cublasSetPointerMode_v2"),
            sgemv: sym!(lib, "cublasSgemv_v2"),
            dgemv: sym!(lib, "cublasDgemv_v2"),
            sasum: sym!(lib, "cublasSasum_v2"),
            dasum: sym!(lib, "cublasDasum_v2"),
            gemm_grouped_batched_ex: grouped,
            _lib: lib,
        })
    }
}

/// The typed GEMM entry points, from the cuBLAS gpubind loaded; [`Error::NoCublas`] if
/// there is none (or it lacks them).
pub(crate) fn cublas_ex() -> Result<&'static CublasEx> {
    static EX: OnceLock<std::result::Result<CublasEx, String>> = OnceLock::new();
    let name = &libs::cublas()?.info.name;
    EX.get_or_init(|| libs::open_lib(name).and_then(CublasEx::resolve))
        .as_ref()
        .map_err(|why| {
            log::debug!("gpubind: cuBLAS GEMM entry points not resolved: {why}");
            Error::NoCublas
        })
}

/// Resolved cuBLASLt symbols, before they are moved into [`CublasLt`] with their library.
struct LtSyms {
    create: unsafe extern "C" fn(*mut LtHandle) -> c_int,
    destroy: unsafe extern "C" fn(LtHandle) -> c_int,
    get_property: unsafe extern "C" fn(c_int, *mut c_int) -> c_int,
    desc_create: unsafe extern "C" fn(*mut LtDesc, c_int, c_int) -> c_int,
    desc_destroy: unsafe extern "C" fn(LtDesc) -> c_int,
    desc_set: SetAttrFn,
    layout_create: unsafe extern "C" fn(*mut LtLayout, c_int, u64, u64, i64) -> c_int,
    layout_destroy: unsafe extern "C" fn(LtLayout) -> c_int,
    pref_create: unsafe extern "C" fn(*mut LtPref) -> c_int,
    pref_destroy: unsafe extern "C" fn(LtPref) -> c_int,
    pref_set: SetAttrFn,
    heuristic: LtHeuristicFn,
    matmul: LtMatmulFn,
}

impl LtSyms {
    fn resolve(lib: &libloading::Library) -> std::result::Result<Self, String> {
        Ok(LtSyms {
            create: sym!(lib, "cublasLtCreate"),
            destroy: sym!(lib, "cublasLtDestroy"),
            get_property: sym!(lib, "cublasLtGetProperty"),
            desc_create: sym!(lib, "cublasLtMatmulDescCreate"),
            desc_destroy: sym!(lib, "cublasLtMatmulDescDestroy"),
            desc_set: sym!(lib, "cublasLtMatmulDescSetAttribute"),
            layout_create: sym!(lib, "cublasLtMatrixLayoutCreate"),
            layout_destroy: sym!(lib, "cublasLtMatrixLayoutDestroy"),
            pref_create: sym!(lib, "cublasLtMatmulPreferenceCreate"),
            pref_destroy: sym!(lib, "cublasLtMatmulPreferenceDestroy"),
            pref_set: sym!(lib, "cublasLtMatmulPreferenceSetAttribute"),
            heuristic: sym!(lib, "cublasLtMatmulAlgoGetHeuristic"),
            matmul: sym!(lib, "cublasLtMatmul"),
        })
    }
}

fn open_cublaslt(name: &str) -> Probe<(libloading::Library, LtSyms)> {
    let lib = match libs::open_lib(name) {
        Ok(l) => l,
        Err(e) => return Probe::Failed(e),
    };
    let syms = match LtSyms::resolve(&lib) {
        Ok(s) => s,
        Err(e) => return Probe::Failed(e),
    };
    // libraryPropertyType: MAJOR_VERSION = 0, MINOR_VERSION = 1.
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the prototype of cublasLtGetProperty (no handle, no context needed);
    // writes one int each.
    let ok = unsafe {
        (syms.get_property)(0, &mut major) == 0 && (syms.get_property)(1, &mut minor) == 0
    };
    if !ok {
        return Probe::Failed("cublasLtGetProperty failed".into());
    }
    Probe::Loaded((lib, syms), (major.max(0) as u32, minor.max(0) as u32))
}

/// The cuBLASLt gpubind uses, loaded on first call; [`Error::NoCublasLt`] if none fits.
pub(crate) fn cublaslt() -> Result<&'static CublasLt> {
    static LT: OnceLock<std::result::Result<CublasLt, String>> = OnceLock::new();
    LT.get_or_init(|| {
        libs::load(libs::Lib::CublasLt, open_cublaslt).map(|((lib, s), info)| CublasLt {
            _lib: lib,
            create: s.create,
            destroy: s.destroy,
            desc_create: s.desc_create,
            desc_destroy: s.desc_destroy,
            desc_set: s.desc_set,
            layout_create: s.layout_create,
            layout_destroy: s.layout_destroy,
            pref_create: s.pref_create,
            pref_destroy: s.pref_destroy,
            pref_set: s.pref_set,
            heuristic: s.heuristic,
            matmul: s.matmul,
            info,
        })
    })
    .as_ref()
    .map_err(|why| {
        log::debug!("gpubind: cuBLASLt not loaded: {why}");
        Error::NoCublasLt
    })
}

/// The cuBLASLt gpubind's [`Blas`](super::Blas) uses for
/// [`matmul_lt`](crate::BoundStream::matmul_lt) (chosen like cuBLAS, see
/// [`cublas_info`](crate::cublas_info);
/// override: `GPUBIND_CUBLASLT_PATH`), or [`Error::NoCublasLt`].
pub fn cublaslt_info() -> Result<LibraryInfo> {
    cublaslt().map(|c| c.info.clone())
}

/// `Ok` for `CUBLAS_STATUS_SUCCESS`, else [`Error::Cublas`] naming `call` and the status.
pub(crate) fn check(status: c_int, call: &'static str) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(Error::Cublas {
            call,
            status: libs::cublas_status_name(status),
        })
    }
}

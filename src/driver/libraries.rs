//! Loading NVRTC and cuBLAS: the library matching the driver's major version (documented on
//! [`nvrtc_info`]).

use crate::error::{Error, Result};
use std::ffi::{c_char, c_int};
use std::sync::OnceLock;

/// `NVRTC_SUCCESS`. NVRTC and cuBLAS results are kept as plain integers: the enums of
/// cudarc's bindings differ between binding versions, and a value outside one would be
/// undefined behaviour in Rust.
pub(crate) const NVRTC_SUCCESS: c_int = 0;

/// The name of an `nvrtcResult` value.
pub(crate) fn nvrtc_status_name(code: c_int) -> String {
    let name = match code {
        0 => "NVRTC_SUCCESS",
        1 => "NVRTC_ERROR_OUT_OF_MEMORY",
        2 => "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
        3 => "NVRTC_ERROR_INVALID_INPUT",
        4 => "NVRTC_ERROR_INVALID_PROGRAM",
        5 => "NVRTC_ERROR_INVALID_OPTION",
        6 => "NVRTC_ERROR_COMPILATION",
        7 => "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
        8 => "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
        9 => "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
        10 => "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
        11 => "NVRTC_ERROR_INTERNAL_ERROR",
        12 => "NVRTC_ERROR_TIME_FILE_WRITE_FAILED",
        13 => "NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED",
        14 => "NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED",
        15 => "NVRTC_ERROR_PCH_CREATE",
        16 => "NVRTC_ERROR_CANCELLED",
        17 => "NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED",
        _ => return format!("nvrtcResult {code}"),
    };
    name.to_owned()
}

/// The name of a `cublasStatus_t` value.
#[cfg(feature = "cublas")]
pub(crate) fn cublas_status_name(code: c_int) -> String {
    let name = match code {
        0 => "CUBLAS_STATUS_SUCCESS",
        1 => "CUBLAS_STATUS_NOT_INITIALIZED",
        3 => "CUBLAS_STATUS_ALLOC_FAILED",
        7 => "CUBLAS_STATUS_INVALID_VALUE",
        8 => "CUBLAS_STATUS_ARCH_MISMATCH",
        11 => "CUBLAS_STATUS_MAPPING_ERROR",
        13 => "CUBLAS_STATUS_EXECUTION_FAILED",
        14 => "CUBLAS_STATUS_INTERNAL_ERROR",
        15 => "CUBLAS_STATUS_NOT_SUPPORTED",
        16 => "CUBLAS_STATUS_LICENSE_ERROR",
        _ => return format!("cublasStatus_t {code}"),
    };
    name.to_owned()
}

/// A library gpubind loads itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lib {
    Nvrtc,
    #[cfg(feature = "cublas")]
    Cublas,
    #[cfg(feature = "cublas")]
    CublasLt,
}

/// The newest CUDA major version whose library names gpubind knows.
const NEWEST_KNOWN_MAJOR: u32 = 13;
/// The oldest.
const OLDEST_MAJOR: u32 = 11;

impl Lib {
    fn env_var(self) -> &'static str {
        match self {
            Lib::Nvrtc => crate::config::NVRTC_PATH.name,
            #[cfg(feature = "cublas")]
            Lib::Cublas => crate::config::CUBLAS_PATH.name,
            #[cfg(feature = "cublas")]
            Lib::CublasLt => crate::config::CUBLASLT_PATH.name,
        }
    }

    /// The override's value, if set (not empty).
    fn override_path(self) -> Option<String> {
        match self {
            Lib::Nvrtc => crate::config::nvrtc_path(&crate::config::env),
            #[cfg(feature = "cublas")]
            Lib::Cublas => crate::config::cublas_path(&crate::config::env),
            #[cfg(feature = "cublas")]
            Lib::CublasLt => crate::config::cublaslt_path(&crate::config::env),
        }
    }

    /// The soname of `major`'s release of this library.
    fn soname(self, major: u32) -> String {
        match (self, major) {
            (Lib::Nvrtc, 11) => "libnvrtc.so.11.2".to_owned(),
            (Lib::Nvrtc, m) => format!("libnvrtc.so.{m}"),
            #[cfg(feature = "cublas")]
            (Lib::Cublas, m) => format!("libcublas.so.{m}"),
            #[cfg(feature = "cublas")]
            (Lib::CublasLt, m) => format!("libcublasLt.so.{m}"),
        }
    }

    fn dev_name(self) -> &'static str {
        match self {
            Lib::Nvrtc => "libnvrtc.so",
            #[cfg(feature = "cublas")]
            Lib::Cublas => "libcublas.so",
            #[cfg(feature = "cublas")]
            Lib::CublasLt => "libcublasLt.so",
        }
    }
}

/// The names to try, in order: the override alone if set, else the driver's major
/// version and older ones, then the unversioned name.
pub(crate) fn candidates(lib: Lib, driver_major: Option<u32>, env: Option<&str>) -> Vec<String> {
    if let Some(path) = env.filter(|p| !p.is_empty()) {
        return vec![path.to_owned()];
    }
    let newest = driver_major.unwrap_or(NEWEST_KNOWN_MAJOR);
    let mut names: Vec<String> = (OLDEST_MAJOR..=newest)
        .rev()
        .map(|m| lib.soname(m))
        .collect();
    names.push(lib.dev_name().to_owned());
    names
}

/// What one candidate turned out to be.
pub(crate) enum Probe<L> {
    /// Loaded, with the `(major, minor)` version the library reports.
    Loaded(L, (u32, u32)),
    /// Not loadable, or lacking an entry point gpubind needs: why.
    Failed(String),
}

/// The first candidate that loads and is not newer than the driver (an override is
/// taken whatever its version: the caller asked for it). `Err` lists each candidate and
/// why it was not taken.
pub(crate) fn choose<L>(
    candidates: &[String],
    driver_major: Option<u32>,
    is_override: bool,
    mut open: impl FnMut(&str) -> Probe<L>,
) -> std::result::Result<(L, String, (u32, u32)), Vec<String>> {
    let mut refused = Vec::new();
    for name in candidates {
        match open(name) {
            Probe::Loaded(lib, (major, minor)) => match driver_major {
                Some(d) if major > d && !is_override => refused.push(format!(
                    "{name}: version {major}.{minor} is newer than the driver's {d}.x"
                )),
                _ => return Ok((lib, name.clone(), (major, minor))),
            },
            Probe::Failed(why) => refused.push(format!("{name}: {why}")),
        }
    }
    Err(refused)
}

/// Which library was loaded, and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryInfo {
    /// The name or path it was loaded by (a soname, or the override's value).
    pub name: String,
    /// The version the library reports, `(major, minor)`.
    pub version: (u32, u32),
    /// The driver's major version it was matched to (`None` without a driver).
    pub driver_major: Option<u32>,
}

/// The driver's major version (`cuDriverGetVersion / 1000`), if a driver is there.
///
/// The real one, not the version `GPUBIND_ASSUME_DRIVER_VERSION` caps: the cap makes
/// gpubind use old *driver entry points*, while the libraries on the machine are the
/// machine's (a 13.x driver with only CUDA 13's NVRTC installed would find no NVRTC at
/// all under a 12.x cap, so nothing capped could compile a kernel).
fn driver_major() -> Option<u32> {
    crate::driver::version::real_driver_version()
        .ok()
        .map(|v| v.major())
}

/// Loads `lib` by the rules on [`nvrtc_info`] with `open` resolving one candidate.
pub(crate) fn load<L>(
    lib: Lib,
    open: impl FnMut(&str) -> Probe<L>,
) -> std::result::Result<(L, LibraryInfo), String> {
    let env = lib.override_path();
    let is_override = env.as_deref().is_some_and(|p| !p.is_empty());
    let driver = driver_major();
    let names = candidates(lib, driver, env.as_deref());
    choose(&names, driver, is_override, open)
        .map(|(l, name, version)| {
            (
                l,
                LibraryInfo {
                    name,
                    version,
                    driver_major: driver,
                },
            )
        })
        .map_err(|refused| {
            let what = if is_override {
                format!("{}={}", lib.env_var(), env.unwrap_or_default())
            } else {
                format!(
                    "no candidate matching driver major version {}",
                    driver.map_or("unknown".into(), |d| d.to_string())
                )
            };
            format!("{what}: {}", refused.join("; "))
        })
}

/// Opens one library file.
pub(crate) fn open_lib(name: &str) -> std::result::Result<libloading::Library, String> {
    // SAFETY: loading NVRTC or cuBLAS runs their ELF initialisers only, which have no
    // effect on this process's state that gpubind relies on.
    unsafe { libloading::Library::new(name) }.map_err(|e| e.to_string())
}

/// The NVRTC entry points gpubind uses.
pub(crate) struct Nvrtc {
    _lib: libloading::Library,
    pub(crate) create_program: unsafe extern "C" fn(
        *mut NvrtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    pub(crate) compile_program:
        unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> c_int,
    pub(crate) destroy_program: unsafe extern "C" fn(*mut NvrtcProgram) -> c_int,
    pub(crate) get_ptx_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
    pub(crate) get_ptx: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
    pub(crate) get_cubin_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
    pub(crate) get_cubin: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
    pub(crate) get_log_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
    pub(crate) get_log: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
    /// `nvrtcGetNumSupportedArchs` and `nvrtcGetSupportedArchs` (NVRTC 11.2+).
    #[allow(clippy::type_complexity)]
    supported: Option<(
        unsafe extern "C" fn(*mut c_int) -> c_int,
        unsafe extern "C" fn(*mut c_int) -> c_int,
    )>,
    pub(crate) info: LibraryInfo,
}

impl Nvrtc {
    fn open(name: &str) -> Probe<(libloading::Library, NvrtcSyms)> {
        let lib = match open_lib(name) {
            Ok(l) => l,
            Err(e) => return Probe::Failed(e),
        };
        let syms = match NvrtcSyms::resolve(&lib) {
            Ok(s) => s,
            Err(e) => return Probe::Failed(e),
        };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: the prototype of nvrtcVersion (nvrtc.h); writes two ints.
        if unsafe { (syms.version)(&mut major, &mut minor) } != NVRTC_SUCCESS {
            return Probe::Failed("nvrtcVersion failed".into());
        }
        Probe::Loaded((lib, syms), (major.max(0) as u32, minor.max(0) as u32))
    }

    /// The architectures this NVRTC compiles for (`sm_XY` as `XY`), if it can tell.
    pub(crate) fn supported_archs(&self) -> Option<Vec<i32>> {
        let (num, get) = self.supported?;
        let mut n: c_int = 0;
        // SAFETY: the prototype of nvrtcGetNumSupportedArchs; writes one int.
        if unsafe { num(&mut n) } != NVRTC_SUCCESS || !(0..=1024).contains(&n) {
            return None;
        }
        let mut archs = vec![0 as c_int; n as usize];
        // SAFETY: the buffer has room for the `n` ints NVRTC just reported.
        if unsafe { get(archs.as_mut_ptr()) } != NVRTC_SUCCESS {
            return None;
        }
        Some(archs)
    }
}

/// Resolved NVRTC symbols, before they are moved into [`Nvrtc`] with their library.
struct NvrtcSyms {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    create_program: unsafe extern "C" fn(
        *mut NvrtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile_program: unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> c_int,
    destroy_program: unsafe extern "C" fn(*mut NvrtcProgram) -> c_int,
    get_ptx_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
    get_ptx: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
    get_cubin_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
    get_cubin: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
    get_log_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
    get_log: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
    #[allow(clippy::type_complexity)]
    supported: Option<(
        unsafe extern "C" fn(*mut c_int) -> c_int,
        unsafe extern "C" fn(*mut c_int) -> c_int,
    )>,
}

/// Resolves `$name` from `$lib` as the type of the field it is assigned to.
macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: every field this initialises has the C prototype of the named entry
        // point (nvrtc.h / cublas_api.h, unchanged since CUDA 11); the pointer is used only
        // while the library, kept in the same struct, stays loaded.
        match unsafe { $lib.get(concat!($name, "\0").as_bytes()) } {
            Ok(s) => *s,
            Err(_) => return Err(format!("no symbol {}", $name)),
        }
    };
}

impl NvrtcSyms {
    fn resolve(lib: &libloading::Library) -> std::result::Result<Self, String> {
        let supported = (|| -> std::result::Result<_, String> {
            Ok((
                sym!(lib, "nvrtcGetNumSupportedArchs"),
                sym!(lib, "nvrtcGetSupportedArchs"),
            ))
        })()
        .ok();
        Ok(NvrtcSyms {
            version: sym!(lib, "nvrtcVersion"),
            create_program: sym!(lib, "nvrtcCreateProgram"),
            compile_program: sym!(lib, "nvrtcCompileProgram"),
            destroy_program: sym!(lib, "nvrtcDestroyProgram"),
            get_ptx_size: sym!(lib, "nvrtcGetPTXSize"),
            get_ptx: sym!(lib, "nvrtcGetPTX"),
            get_cubin_size: sym!(lib, "nvrtcGetCUBINSize"),
            get_cubin: sym!(lib, "nvrtcGetCUBIN"),
            get_log_size: sym!(lib, "nvrtcGetProgramLogSize"),
            get_log: sym!(lib, "nvrtcGetProgramLog"),
            supported,
        })
    }
}

/// The NVRTC gpubind uses, loaded on first call; [`Error::NoNvrtc`] if none fits.
pub(crate) fn nvrtc() -> Result<&'static Nvrtc> {
    static NVRTC: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
    NVRTC
        .get_or_init(|| {
            load(Lib::Nvrtc, Nvrtc::open).map(|((lib, s), info)| Nvrtc {
                _lib: lib,
                create_program: s.create_program,
                compile_program: s.compile_program,
                destroy_program: s.destroy_program,
                get_ptx_size: s.get_ptx_size,
                get_ptx: s.get_ptx,
                get_cubin_size: s.get_cubin_size,
                get_cubin: s.get_cubin,
                get_log_size: s.get_log_size,
                get_log: s.get_log,
                supported: s.supported,
                info,
            })
        })
        .as_ref()
        .map_err(|why| {
            log::debug!("gpubind: NVRTC not loaded: {why}");
            Error::NoNvrtc
        })
}

/// The cuBLAS entry points gpubind uses.
#[cfg(feature = "cublas")]
pub(crate) struct Cublas {
    _lib: libloading::Library,
    pub(crate) create: unsafe extern "C" fn(*mut CublasHandle) -> c_int,
    pub(crate) destroy: unsafe extern "C" fn(CublasHandle) -> c_int,
    pub(crate) set_stream: unsafe extern "C" fn(CublasHandle, *mut std::ffi::c_void) -> c_int,
    /// `cublasSetWorkspace_v2(handle, workspace, bytes)`.
    pub(crate) set_workspace: SetWorkspaceFn,
    pub(crate) sgemm: SgemmFn,
    pub(crate) info: LibraryInfo,
}

/// `cublasHandle_t` (opaque). Plain pointers rather than cudarc's types, so this module
/// needs none of cudarc's NVRTC or cuBLAS bindings.
#[cfg(feature = "cublas")]
pub(crate) type CublasHandle = *mut std::ffi::c_void;

/// `cublasSetWorkspace_v2(handle, workspace, workspaceSizeInBytes)` (cublas_api.h).
#[cfg(feature = "cublas")]
pub(crate) type SetWorkspaceFn =
    unsafe extern "C" fn(CublasHandle, *mut std::ffi::c_void, usize) -> c_int;

/// `cublasSgemm_v2(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)`,
/// with host scalars (cublas_api.h).
#[cfg(feature = "cublas")]
pub(crate) type SgemmFn = unsafe extern "C" fn(
    CublasHandle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const f32,
    *const f32,
    c_int,
    *const f32,
    c_int,
    *const f32,
    *mut f32,
    c_int,
) -> c_int;

/// `NvrtcProgram` (opaque).
pub(crate) type NvrtcProgram = *mut std::ffi::c_void;

/// Resolved cuBLAS symbols with their library and version.
#[cfg(feature = "cublas")]
type CublasParts = (libloading::Library, CublasSyms);

#[cfg(feature = "cublas")]
struct CublasSyms {
    create: unsafe extern "C" fn(*mut CublasHandle) -> c_int,
    destroy: unsafe extern "C" fn(CublasHandle) -> c_int,
    set_stream: unsafe extern "C" fn(CublasHandle, *mut std::ffi::c_void) -> c_int,
    set_workspace: SetWorkspaceFn,
    sgemm: SgemmFn,
    get_property: unsafe extern "C" fn(c_int, *mut c_int) -> c_int,
}

#[cfg(feature = "cublas")]
impl CublasSyms {
    fn resolve(lib: &libloading::Library) -> std::result::Result<Self, String> {
        Ok(CublasSyms {
            create: sym!(lib, "cublasCreate_v2"),
            destroy: sym!(lib, "cublasDestroy_v2"),
            set_stream: sym!(lib, "cublasSetStream_v2"),
            set_workspace: sym!(lib, "cublasSetWorkspace_v2"),
            sgemm: sym!(lib, "cublasSgemm_v2"),
            get_property: sym!(lib, "cublasGetProperty"),
        })
    }
}

#[cfg(feature = "cublas")]
fn open_cublas(name: &str) -> Probe<CublasParts> {
    let lib = match open_lib(name) {
        Ok(l) => l,
        Err(e) => return Probe::Failed(e),
    };
    let syms = match CublasSyms::resolve(&lib) {
        Ok(s) => s,
        Err(e) => return Probe::Failed(e),
    };
    // libraryPropertyType: MAJOR_VERSION = 0, MINOR_VERSION = 1.
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the prototype of cublasGetProperty (no handle, no context needed); writes
    // one int each.
    let ok = unsafe {
        (syms.get_property)(0, &mut major) == 0 && (syms.get_property)(1, &mut minor) == 0
    };
    if !ok {
        return Probe::Failed("cublasGetProperty failed".into());
    }
    Probe::Loaded((lib, syms), (major.max(0) as u32, minor.max(0) as u32))
}

/// The cuBLAS gpubind uses, loaded on first call; [`Error::NoCublas`] if none fits.
#[cfg(feature = "cublas")]
pub(crate) fn cublas() -> Result<&'static Cublas> {
    static CUBLAS: OnceLock<std::result::Result<Cublas, String>> = OnceLock::new();
    CUBLAS
        .get_or_init(|| {
            load(Lib::Cublas, open_cublas).map(|((lib, s), info)| Cublas {
                _lib: lib,
                create: s.create,
                destroy: s.destroy,
                set_stream: s.set_stream,
                set_workspace: s.set_workspace,
                sgemm: s.sgemm,
                info,
            })
        })
        .as_ref()
        .map_err(|why| {
            log::debug!("gpubind: cuBLAS not loaded: {why}");
            Error::NoCublas
        })
}

/// The NVRTC gpubind compiles with (`GPUBIND_NVRTC_PATH`, else the newest one not newer
/// than the driver's major version), or [`Error::NoNvrtc`].
///
/// # Which NVRTC and cuBLAS are loaded
///
/// cudarc's loader tries a fixed list of names, unversioned `libnvrtc.so` first and then
/// the major version its bindings were generated for (13 here) before 12 and 11. With the
/// CUDA 12 and 13 toolkits both installed on a 12.x driver, that picks `libnvrtc.so.13`,
/// whose PTX and cubins the driver cannot load, and `libcublas.so.13`, which needs a 13.x
/// driver. gpubind therefore resolves the NVRTC and cuBLAS entry points it uses itself
/// (with `libloading`, as it does for NCCL) and chooses the library like this:
///
/// 1. **Override:** `GPUBIND_NVRTC_PATH` / `GPUBIND_CUBLAS_PATH` / `GPUBIND_CUBLASLT_PATH`
///    (cuBLASLt, for the epilogue products of `gpubind::blas`), a file name or path, is
///    the only candidate when set (not empty). If it cannot be loaded (or lacks an entry
///    point), that is the error: gpubind does not fall back behind an explicit choice.
/// 2. **Driver's major version first:** with the driver's version `D.x`
///    (`cuDriverGetVersion`), the sonames of majors `D, D-1, …, 11` in that order
///    (`libnvrtc.so.12`, `libcublas.so.12`, …; NVRTC 11 is `libnvrtc.so.11.2`), then the
///    unversioned development name (`libnvrtc.so`). A library is accepted only if the
///    version it reports (`nvrtcVersion`, `cublasGetProperty`, `cublasLtGetProperty`) is
///    not newer than `D`, so a `libnvrtc.so` that points at a newer toolkit is skipped too.
/// 3. **No driver** (compiling on a machine without a GPU): the newest major known first.
///
/// The choice is made once per process, on first use. `nvrtc_info` and `cublas_info`
/// report it. cudarc's *own* safe API (`cudarc::nvrtc`, `cudarc::cublas::CudaBlas`) still
/// loads through cudarc's loader, which gpubind cannot steer (it opens by name; a library
/// gpubind loaded is reused only when the name matches its soname or file): with two
/// toolkits installed, point the loader's search path at the right one
/// (`LD_LIBRARY_PATH`) for those.
pub fn nvrtc_info() -> Result<LibraryInfo> {
    nvrtc().map(|n| n.info.clone())
}

/// The architectures (`XY` of `sm_XY`) the NVRTC of [`nvrtc_info`] compiles for, `None`
/// if it cannot tell (before NVRTC 11.2); [`Error::NoNvrtc`] without one.
pub fn nvrtc_supported_archs() -> Result<Option<Vec<i32>>> {
    nvrtc().map(Nvrtc::supported_archs)
}

/// The cuBLAS gpubind's [`Blas`](crate::blas::Blas) uses, or [`Error::NoCublas`].
#[cfg(feature = "cublas")]
#[cfg_attr(docsrs, doc(cfg(feature = "cublas")))]
pub fn cublas_info() -> Result<LibraryInfo> {
    cublas().map(|c| c.info.clone())
}

/// What NVRTC should compile a device of compute capability `cc` (`10 * major + minor`)
/// for, given the architectures it supports (`None`: it cannot tell, NVRTC before 11.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// A cubin for `sm_XY`: nothing to JIT at load.
    Cubin(i32),
    /// PTX for `compute_XY`, the newest architecture NVRTC knows below the device's; the
    /// driver JIT-compiles it for the device at load.
    Ptx(i32),
}

/// The target for a device of compute capability `cc` with NVRTC supporting `supported`.
pub(crate) fn pick_target(
    supported: Option<&[i32]>,
    cc: i32,
) -> std::result::Result<Target, String> {
    let Some(archs) = supported else {
        return Ok(Target::Cubin(cc));
    };
    if archs.contains(&cc) {
        return Ok(Target::Cubin(cc));
    }
    match archs.iter().copied().filter(|&a| a < cc).max() {
        Some(older) => Ok(Target::Ptx(older)),
        None => Err(match (archs.iter().min(), archs.iter().max()) {
            (Some(lo), Some(hi)) => format!(
                "this NVRTC supports sm_{lo} to sm_{hi}, none at or below the device's sm_{cc} \
                 (set GPUBIND_NVRTC_PATH to an NVRTC that still supports it)"
            ),
            _ => "this NVRTC reports no supported architecture".to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn candidates_start_at_the_drivers_major_version() {
        assert_eq!(
            candidates(Lib::Nvrtc, Some(12), None),
            names(&["libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"])
        );
        #[cfg(feature = "cublas")]
        assert_eq!(
            candidates(Lib::Cublas, Some(13), None),
            names(&[
                "libcublas.so.13",
                "libcublas.so.12",
                "libcublas.so.11",
                "libcublas.so"
            ])
        );
        #[cfg(feature = "cublas")]
        assert_eq!(
            candidates(Lib::CublasLt, Some(12), None),
            names(&["libcublasLt.so.12", "libcublasLt.so.11", "libcublasLt.so"])
        );
        #[cfg(feature = "cublas")]
        assert_eq!(Lib::CublasLt.env_var(), "GPUBIND_CUBLASLT_PATH");
        // A driver newer than any name gpubind knows: its own major is tried first.
        assert_eq!(candidates(Lib::Nvrtc, Some(14), None)[0], "libnvrtc.so.14");
        // No driver: newest known first.
        assert_eq!(candidates(Lib::Nvrtc, None, None)[0], "libnvrtc.so.13");
        // The override is the only candidate; an empty one is ignored.
        assert_eq!(
            candidates(
                Lib::Nvrtc,
                Some(12),
                Some("/opt/cuda-12/lib64/libnvrtc.so.12")
            ),
            names(&["/opt/cuda-12/lib64/libnvrtc.so.12"])
        );
        assert_eq!(
            candidates(Lib::Nvrtc, Some(12), Some(""))[0],
            "libnvrtc.so.12"
        );
        #[cfg(feature = "cublas")]
        assert_eq!(
            candidates(Lib::Cublas, Some(12), Some(""))[0],
            "libcublas.so.12"
        );
    }

    /// A machine with these files, each reporting its version.
    fn machine(
        files: &'static [(&'static str, (u32, u32))],
    ) -> impl FnMut(&str) -> Probe<&'static str> {
        move |name| match files.iter().find(|(f, _)| *f == name) {
            Some((f, v)) => Probe::Loaded(*f, *v),
            None => Probe::Failed("cannot open shared object file".into()),
        }
    }

    #[test]
    fn both_toolkits_on_a_12_driver_pick_12() {
        // libnvrtc.so (the dev symlink) points at 13, and 13 is present: 12 wins.
        let files = &[
            ("libnvrtc.so", (13, 0)),
            ("libnvrtc.so.13", (13, 0)),
            ("libnvrtc.so.12", (12, 8)),
        ];
        let c = candidates(Lib::Nvrtc, Some(12), None);
        let (lib, name, v) = choose(&c, Some(12), false, machine(files)).unwrap();
        assert_eq!(
            (lib, name.as_str(), v),
            ("libnvrtc.so.12", "libnvrtc.so.12", (12, 8))
        );
    }

    #[test]
    fn a_newer_unversioned_library_is_skipped() {
        // Only the 13 toolkit's dev symlink on a 12 driver: nothing fits, and the error
        // says why for every candidate.
        let files = &[("libnvrtc.so", (13, 0))];
        let c = candidates(Lib::Nvrtc, Some(12), None);
        let refused = choose(&c, Some(12), false, machine(files)).err().unwrap();
        assert_eq!(refused.len(), 3);
        assert!(
            refused[0].starts_with("libnvrtc.so.12: cannot open"),
            "{refused:?}"
        );
        assert_eq!(
            refused[2],
            "libnvrtc.so: version 13.0 is newer than the driver's 12.x"
        );
        // An older one behind it is taken.
        let files = &[("libnvrtc.so", (12, 2)), ("libcublas.so.12", (12, 1))];
        let (_, name, _) = choose(&c, Some(12), false, machine(files)).unwrap();
        assert_eq!(name, "libnvrtc.so");
        // A 13 driver takes 13 before 12.
        let files = &[("libnvrtc.so.12", (12, 9)), ("libnvrtc.so.13", (13, 1))];
        let c = candidates(Lib::Nvrtc, Some(13), None);
        assert_eq!(
            choose(&c, Some(13), false, machine(files)).unwrap().1,
            "libnvrtc.so.13"
        );
    }

    #[test]
    fn the_override_is_taken_as_is_or_fails() {
        let files = &[("/x/libnvrtc.so.13", (13, 0)), ("libnvrtc.so.12", (12, 4))];
        let c = candidates(Lib::Nvrtc, Some(12), Some("/x/libnvrtc.so.13"));
        // Taken although newer than the driver: the user asked for it.
        assert_eq!(
            choose(&c, Some(12), true, machine(files)).unwrap().1,
            "/x/libnvrtc.so.13"
        );
        // Missing: an error, no fallback to the 12 that is there.
        let c = candidates(Lib::Nvrtc, Some(12), Some("/nope/libnvrtc.so"));
        let refused = choose(&c, Some(12), true, machine(files)).err().unwrap();
        assert_eq!(refused.len(), 1);
        assert!(refused[0].starts_with("/nope/libnvrtc.so: "));
    }

    #[test]
    fn no_driver_takes_the_newest() {
        let files = &[("libnvrtc.so.12", (12, 8)), ("libnvrtc.so.13", (13, 0))];
        let c = candidates(Lib::Nvrtc, None, None);
        assert_eq!(
            choose(&c, None, false, machine(files)).unwrap().1,
            "libnvrtc.so.13"
        );
    }

    #[test]
    fn known_architectures_get_a_cubin() {
        let archs = [75, 80, 86, 87, 89, 90, 100, 120];
        assert_eq!(pick_target(Some(&archs), 90), Ok(Target::Cubin(90)));
        assert_eq!(pick_target(Some(&archs), 75), Ok(Target::Cubin(75)));
        // NVRTC that cannot list its architectures: a cubin, as before.
        assert_eq!(pick_target(None, 103), Ok(Target::Cubin(103)));
    }

    #[test]
    fn a_gpu_newer_than_nvrtc_gets_ptx_for_the_newest_older_arch() {
        // NVRTC 12.0 knows up to sm_90; an sm_100 device gets compute_90 PTX.
        let archs = [50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90];
        assert_eq!(pick_target(Some(&archs), 100), Ok(Target::Ptx(90)));
        assert_eq!(pick_target(Some(&archs), 120), Ok(Target::Ptx(90)));
        // A device between two known architectures: the one below.
        assert_eq!(pick_target(Some(&[80, 90]), 89), Ok(Target::Ptx(80)));
    }

    #[test]
    fn a_gpu_older_than_every_supported_arch_is_an_error() {
        let e = pick_target(Some(&[75, 80, 90]), 70).unwrap_err();
        assert!(e.contains("sm_75 to sm_90"), "{e}");
        assert!(e.contains("sm_70"), "{e}");
        assert!(pick_target(Some(&[]), 90).is_err());
    }
}

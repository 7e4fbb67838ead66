//! Driver versions, and the lookup of the entry points that not every supported driver has
//! (documented on [`DriverVersion`](crate::DriverVersion)).

use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::{CStr, c_void};
use std::sync::OnceLock;

/// The environment variable that caps the driver version gpubind assumes.
///
/// Its value is a CUDA version, as the driver API writes it (`12020`) or as
/// `major.minor` (`12.2`). An empty value means no cap; anything else that does not
/// parse makes [`init`](crate::init) and [`driver_version`] fail with
/// [`Error::InvalidArgument`] naming the variable. A cap can only lower the version:
/// capping above the real one changes nothing.
pub const ASSUME_DRIVER_VERSION_ENV: &str = crate::config::ASSUME_DRIVER_VERSION.name;

pub use crate::cuda_version::DriverVersion;

/// The cap from the environment, read once per process.
fn cap() -> Result<Option<DriverVersion>> {
    static CAP: OnceLock<Result<Option<DriverVersion>>> = OnceLock::new();
    CAP.get_or_init(|| {
        let cap = crate::config::assume_driver_version(&crate::config::env)?;
        Ok(cap.map(|(major, minor)| DriverVersion::new(major, minor)))
    })
    .clone()
}

/// The version gpubind acts on: the smaller of the real one and the cap.
pub(crate) fn effective(real: DriverVersion, cap: Option<DriverVersion>) -> DriverVersion {
    cap.map_or(real, |c| real.min(c))
}

/// The CUDA version the driver supports (`cuDriverGetVersion`), as gpubind uses it:
/// capped by [`ASSUME_DRIVER_VERSION_ENV`] when that is set.
///
/// Needs `libcuda` but no `cuInit` and no GPU context; [`Error::NoDriver`] without a
/// driver. The answer is cached after the first success. [`init`](crate::init) refuses
/// drivers older than [`DriverVersion::MINIMUM`] with [`Error::DriverTooOld`].
///
/// ```no_run
/// let v = gpubind::driver_version()?;
/// if v < gpubind::DriverVersion::new(12, 8) {
///     println!("CUDA {v} driver: Event::elapsed_ms uses cuEventElapsedTime");
/// }
/// # Ok::<(), gpubind::Error>(())
/// ```
pub fn driver_version() -> Result<DriverVersion> {
    static VERSION: OnceLock<DriverVersion> = OnceLock::new();
    if let Some(v) = VERSION.get() {
        return Ok(*v);
    }
    let cap = cap()?;
    let real = real_driver_version()?;
    Ok(*VERSION.get_or_init(|| effective(real, cap)))
}

/// The driver's own version (`cuDriverGetVersion`), ignoring the cap: for what is the
/// machine's rather than gpubind's choice, like which NVRTC is installed.
pub(crate) fn real_driver_version() -> Result<DriverVersion> {
    if !crate::driver::driver_available() {
        return Err(Error::NoDriver);
    }
    // The library is present (checked above); cuDriverGetVersion needs no cuInit.
    let raw = crate::driver::result::init::driver_get_version()?;
    DriverVersion::from_raw(raw).map_err(|_| {
        Error::InvalidArgument(format!(
            "cuDriverGetVersion reported {raw}, not a CUDA version"
        ))
    })
}

/// [`Error::DriverTooOld`] for versions before [`DriverVersion::MINIMUM`].
pub(crate) fn require_minimum(found: DriverVersion) -> Result<()> {
    let needed = DriverVersion::MINIMUM;
    if found < needed {
        return Err(Error::DriverTooOld { found, needed });
    }
    Ok(())
}

/// A driver entry point gpubind calls only where the driver has it.
///
/// `base` is the name `cuGetProcAddress` takes (no `_v2` suffix); `since` is both the
/// CUDA version that introduced this variant and the `cudaVersion` passed to
/// `cuGetProcAddress_v2`, which picks the variant (`cuEventElapsedTime` at 12.8 is
/// `cuEventElapsedTime_v2`, at 12.2 the original).
pub(crate) struct EntryPoint {
    /// The name as `cuGetProcAddress` takes it.
    pub(crate) base: &'static CStr,
    /// The versioned symbol this resolves to, for messages and error names.
    pub(crate) symbol: &'static str,
    /// The CUDA version that introduced the variant (and that is asked for).
    pub(crate) since: DriverVersion,
    /// The address once looked up: `Some(0)` never, `Some(addr)` found, `None` missing.
    resolved: OnceLock<Option<usize>>,
}

impl EntryPoint {
    const fn new(base: &'static CStr, symbol: &'static str, since: DriverVersion) -> Self {
        EntryPoint {
            base,
            symbol,
            since,
            resolved: OnceLock::new(),
        }
    }

    /// The entry point's address, looked up once; [`Error::Unsupported`] when the
    /// (capped) driver version is older than `since` or the driver does not export it.
    pub(crate) fn address(&self) -> Result<*mut c_void> {
        if let Some(found) = self.resolved.get() {
            return self.found(*found);
        }
        let version = driver_version()?;
        if version < self.since {
            // Not cached: the same answer every time, and it costs one compare.
            return Err(self.unsupported(version));
        }
        // cuGetProcAddress_v2 exists in every driver gpubind runs on (CUDA 12.0+) and is
        // an ordinary cudarc sys function under every linking mode. A symbol the driver
        // does not have comes back null, with a status other than success.
        let (pfn, status) = crate::driver::result::init::get_proc_address(
            self.base,
            self.since.raw(),
            sys::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_DEFAULT as u64,
        )?;
        let found = (status == sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS
            && !pfn.is_null())
        .then_some(pfn as usize);
        self.found(*self.resolved.get_or_init(|| found))
    }

    fn found(&self, found: Option<usize>) -> Result<*mut c_void> {
        match found {
            Some(addr) => Ok(addr as *mut c_void),
            None => Err(self.unsupported(driver_version()?)),
        }
    }

    fn unsupported(&self, found: DriverVersion) -> Error {
        Error::Unsupported {
            what: self.symbol,
            needs: self.since,
            found,
        }
    }

    /// The entry point as a typed function pointer.
    ///
    /// # Safety
    ///
    /// `F` must be an `unsafe extern "C" fn` with the C prototype of `symbol` (the
    /// variant of `since`).
    pub(crate) unsafe fn get<F: Copy>(&self) -> Result<F> {
        const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
        let addr = self.address()?;
        // SAFETY: `addr` is the non-null address of `symbol` in the loaded driver, which
        // stays loaded for the process; the caller guarantees `F` is its prototype.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&addr) })
    }
}

/// `cuEventElapsedTime_v2` (CUDA 12.8).
pub(crate) static EVENT_ELAPSED_TIME_V2: EntryPoint = EntryPoint::new(
    c"cuEventElapsedTime",
    "cuEventElapsedTime_v2",
    DriverVersion::new(12, 8),
);
/// The original `cuEventElapsedTime`, the fallback on drivers before 12.8 (every driver
/// still exports it for programs built against older toolkits).
pub(crate) static EVENT_ELAPSED_TIME: EntryPoint = EntryPoint::new(
    c"cuEventElapsedTime",
    "cuEventElapsedTime",
    DriverVersion::MINIMUM,
);
/// `cuFuncGetParamInfo` (CUDA 12.4): without it launch arguments are not checked.
pub(crate) static FUNC_GET_PARAM_INFO: EntryPoint = EntryPoint::new(
    c"cuFuncGetParamInfo",
    "cuFuncGetParamInfo",
    DriverVersion::new(12, 4),
);
/// `cuMemAdvise_v2` (CUDA 12.2, the floor; looked up so the ABI is pinned whatever the
/// bindings' version).
pub(crate) static MEM_ADVISE_V2: EntryPoint =
    EntryPoint::new(c"cuMemAdvise", "cuMemAdvise_v2", DriverVersion::MINIMUM);
/// `cuMemPrefetchAsync_v2` (CUDA 12.2; the plain name is the original signature before
/// CUDA 13 and this one from 13, so the version asked for matters).
pub(crate) static MEM_PREFETCH_ASYNC_V2: EntryPoint = EntryPoint::new(
    c"cuMemPrefetchAsync",
    "cuMemPrefetchAsync_v2",
    DriverVersion::MINIMUM,
);

/// `cuLaunchKernelEx` (CUDA 12.0, below the floor; looked up so launches with
/// attributes never go through cudarc's loader).
pub(crate) static LAUNCH_KERNEL_EX: EntryPoint = EntryPoint::new(
    c"cuLaunchKernelEx",
    "cuLaunchKernelEx",
    DriverVersion::MINIMUM,
);
/// `cuOccupancyMaxActiveClusters` (CUDA 12.0, below the floor; as above).
pub(crate) static OCCUPANCY_MAX_ACTIVE_CLUSTERS: EntryPoint = EntryPoint::new(
    c"cuOccupancyMaxActiveClusters",
    "cuOccupancyMaxActiveClusters",
    DriverVersion::MINIMUM,
);
/// Every entry point gpubind resolves by version (docs/compat.md lists the same).
pub(crate) static ENTRY_POINTS: [&EntryPoint; 7] = [
    &EVENT_ELAPSED_TIME_V2,
    &EVENT_ELAPSED_TIME,
    &FUNC_GET_PARAM_INFO,
    &MEM_ADVISE_V2,
    &MEM_PREFETCH_ASYNC_V2,
    &LAUNCH_KERNEL_EX,
    &OCCUPANCY_MAX_ACTIVE_CLUSTERS,
];

/// One version-dependent driver entry point, as gpubind finds it on this driver.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EntryPointStatus {
    /// The versioned symbol, e.g. `cuEventElapsedTime_v2`.
    pub symbol: &'static str,
    /// The CUDA version that introduced it.
    pub since: DriverVersion,
    /// `Ok(())` where gpubind calls it on this driver; else [`Error::Unsupported`] (the
    /// driver, or the cap, is older than `since`, or the driver does not export it).
    pub status: Result<()>,
}

/// Every driver entry point gpubind looks up by version, and whether this driver (as
/// capped by [`ASSUME_DRIVER_VERSION_ENV`]) has it: a compatibility report.
///
/// Runs [`init`](crate::init) first, so a driver older than 12.2 is
/// [`Error::DriverTooOld`]; an entry point the driver lacks is an
/// [`Error::Unsupported`] in its `status`, not an error of the call.
///
/// ```no_run
/// for ep in gpubind::entry_points()? {
///     match &ep.status {
///         Ok(()) => println!("{} (CUDA {}): used", ep.symbol, ep.since),
///         Err(e) => println!("{}: {e}", ep.symbol),
///     }
/// }
/// # Ok::<(), gpubind::Error>(())
/// ```
pub fn entry_points() -> Result<Vec<EntryPointStatus>> {
    crate::driver::init()?;
    ENTRY_POINTS
        .iter()
        .map(|ep| {
            let status = match ep.address() {
                Ok(_) => Ok(()),
                Err(e @ Error::Unsupported { .. }) => Err(e),
                Err(other) => return Err(other),
            };
            Ok(EntryPointStatus {
                symbol: ep.symbol,
                since: ep.since,
                status,
            })
        })
        .collect()
}

/// `cuEventElapsedTime{,_v2}`: milliseconds between two events.
pub(crate) type EventElapsedTime =
    unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;
/// `cuFuncGetParamInfo`.
pub(crate) type FuncGetParamInfo =
    unsafe extern "C" fn(sys::CUfunction, usize, *mut usize, *mut usize) -> sys::CUresult;
/// `cuMemAdvise_v2`.
pub(crate) type MemAdviseV2 = unsafe extern "C" fn(
    sys::CUdeviceptr,
    usize,
    sys::CUmem_advise,
    sys::CUmemLocation,
) -> sys::CUresult;
/// `cuMemPrefetchAsync_v2`.
pub(crate) type MemPrefetchAsyncV2 = unsafe extern "C" fn(
    sys::CUdeviceptr,
    usize,
    sys::CUmemLocation,
    std::ffi::c_uint,
    sys::CUstream,
) -> sys::CUresult;

/// The elapsed-time entry point this driver has: `_v2` from 12.8, else the original.
pub(crate) fn event_elapsed_time() -> Result<(EventElapsedTime, &'static str)> {
    // SAFETY: both variants have the prototype of `EventElapsedTime`
    // (float*, CUevent, CUevent) -> CUresult.
    match unsafe { EVENT_ELAPSED_TIME_V2.get::<EventElapsedTime>() } {
        Ok(f) => Ok((f, EVENT_ELAPSED_TIME_V2.symbol)),
        Err(Error::Unsupported { .. }) => {
            // SAFETY: as above.
            let f = unsafe { EVENT_ELAPSED_TIME.get::<EventElapsedTime>() }?;
            Ok((f, EVENT_ELAPSED_TIME.symbol))
        }
        Err(e) => Err(e),
    }
}

/// `cuEventElapsedTime_v2` (or, before CUDA 12.8, `cuEventElapsedTime`): milliseconds
/// from `start` to `end`. The error names the variant called.
///
/// # Safety
///
/// `start` and `end` are live events of the current context.
#[inline]
pub(crate) unsafe fn event_elapsed_ms(start: sys::CUevent, end: sys::CUevent) -> Result<f32> {
    let (elapsed, call) = event_elapsed_time()?;
    let mut ms = 0f32;
    // SAFETY: the caller guarantees both events; writes one float.
    crate::driver::result::check(unsafe { elapsed(&mut ms, start, end) }, call)?;
    Ok(ms)
}

/// `cuFuncGetParamInfo` (CUDA 12.4+): `Some((offset, size))` of parameter `index` of
/// `f`, `None` past the last parameter (the driver's `CUDA_ERROR_INVALID_VALUE`);
/// [`Error::Unsupported`] on drivers without the entry point.
///
/// # Safety
///
/// `f` is a function of a live module.
#[allow(dead_code)] // called by the launch and module layers
#[inline]
pub(crate) unsafe fn func_param_info(
    f: sys::CUfunction,
    index: usize,
) -> Result<Option<(usize, usize)>> {
    // SAFETY: `FuncGetParamInfo` is cuFuncGetParamInfo's prototype
    // (CUfunction, size_t, size_t*, size_t*) -> CUresult.
    let get = unsafe { FUNC_GET_PARAM_INFO.get::<FuncGetParamInfo>() }?;
    let (mut offset, mut size) = (0usize, 0usize);
    // SAFETY: the caller guarantees the function; writes two size_t.
    match unsafe { get(f, index, &mut offset, &mut size) } {
        sys::CUresult::CUDA_ERROR_INVALID_VALUE => Ok(None),
        code => crate::driver::result::check(code, FUNC_GET_PARAM_INFO.symbol)
            .map(|()| Some((offset, size))),
    }
}

/// `cuMemAdvise_v2`: advice about the managed range `ptr..ptr + bytes`.
///
/// # Safety
///
/// The range is managed memory of the current context, live for the call.
#[inline]
pub(crate) unsafe fn mem_advise(
    ptr: sys::CUdeviceptr,
    bytes: usize,
    advice: sys::CUmem_advise,
    location: sys::CUmemLocation,
) -> Result<()> {
    // SAFETY: `MemAdviseV2` is cuMemAdvise_v2's prototype
    // (CUdeviceptr, size_t, CUmem_advise, CUmemLocation) -> CUresult.
    let advise = unsafe { MEM_ADVISE_V2.get::<MemAdviseV2>() }?;
    // SAFETY: the caller guarantees the range.
    crate::driver::result::check(
        unsafe { advise(ptr, bytes, advice, location) },
        MEM_ADVISE_V2.symbol,
    )
}

/// `cuMemPrefetchAsync_v2`: migrates the managed range `ptr..ptr + bytes` to
/// `location`, ordered on `stream`.
///
/// # Safety
///
/// The range is managed memory that stays allocated until the stream has run the
/// prefetch; `stream` is a live stream of the current context.
#[inline]
pub(crate) unsafe fn mem_prefetch_async(
    ptr: sys::CUdeviceptr,
    bytes: usize,
    location: sys::CUmemLocation,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: `MemPrefetchAsyncV2` is cuMemPrefetchAsync_v2's prototype
    // (CUdeviceptr, size_t, CUmemLocation, unsigned int, CUstream) -> CUresult.
    let prefetch = unsafe { MEM_PREFETCH_ASYNC_V2.get::<MemPrefetchAsyncV2>() }?;
    // SAFETY: the caller guarantees the range and the stream; flags must be 0.
    crate::driver::result::check(
        unsafe { prefetch(ptr, bytes, location, 0, stream) },
        MEM_PREFETCH_ASYNC_V2.symbol,
    )
}

/// `cuLaunchKernelEx`'s prototype.
#[allow(dead_code)] // called by the launch and module layers
pub(crate) type LaunchKernelEx = unsafe extern "C" fn(
    *const sys::CUlaunchConfig,
    sys::CUfunction,
    *mut *mut c_void,
    *mut *mut c_void,
) -> sys::CUresult;

/// `cuOccupancyMaxActiveClusters`'s prototype.
#[allow(dead_code)] // called by the launch and module layers
pub(crate) type OccupancyMaxActiveClusters = unsafe extern "C" fn(
    *mut std::ffi::c_int,
    sys::CUfunction,
    *const sys::CUlaunchConfig,
) -> sys::CUresult;

/// `cuLaunchKernelEx`: enqueues `f` with the launch configuration (grid, block, shared
/// memory, stream and attribute list) `config`.
///
/// # Safety
///
/// As `result::module::launch_kernel`, for the stream of `config`; `config` and its
/// attribute list are valid for the call, and the attributes are ones the kernel can
/// run with (a grid-synchronising kernel is cooperative, a cluster kernel has its
/// cluster dimension).
#[allow(dead_code)] // called by the launch and module layers
#[inline]
pub(crate) unsafe fn launch_kernel_ex(
    config: &sys::CUlaunchConfig,
    f: sys::CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: `LaunchKernelEx` is cuLaunchKernelEx's prototype
    // (const CUlaunchConfig*, CUfunction, void**, void**) -> CUresult.
    let launch = unsafe { LAUNCH_KERNEL_EX.get::<LaunchKernelEx>() }?;
    // SAFETY: the caller's contract is this call's.
    crate::driver::result::check(
        unsafe { launch(config, f, params, extra) },
        LAUNCH_KERNEL_EX.symbol,
    )
}

/// `cuOccupancyMaxActiveClusters`: how many clusters of `config`'s shape can be
/// co-resident.
///
/// # Safety
///
/// `f` is a function of a live module of the current context; `config` and its
/// attribute list are valid for the call.
#[allow(dead_code)] // called by the launch and module layers
#[inline]
pub(crate) unsafe fn occupancy_max_active_clusters(
    f: sys::CUfunction,
    config: &sys::CUlaunchConfig,
) -> Result<std::ffi::c_int> {
    // SAFETY: `OccupancyMaxActiveClusters` is the entry point's prototype
    // (int*, CUfunction, const CUlaunchConfig*) -> CUresult.
    let query = unsafe { OCCUPANCY_MAX_ACTIVE_CLUSTERS.get::<OccupancyMaxActiveClusters>() }?;
    let mut clusters = 0;
    // SAFETY: the caller guarantees the function and the configuration; writes one int.
    crate::driver::result::check(
        unsafe { query(&mut clusters, f, config) },
        OCCUPANCY_MAX_ACTIVE_CLUSTERS.symbol,
    )?;
    Ok(clusters)
}

/// A `CUmemLocation` of `type_` and `id`, whatever the bindings' version (CUDA 13.2
/// turned `id` into a member of an anonymous union; the layout is unchanged).
pub(crate) fn mem_location(type_: sys::CUmemLocationType, id: i32) -> sys::CUmemLocation {
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Plain {
        type_: sys::CUmemLocationType,
        id: std::ffi::c_int,
    }
    static_assertions::assert_eq_size!(Plain, sys::CUmemLocation);
    static_assertions::assert_eq_align!(Plain, sys::CUmemLocation);
    // SAFETY: `CUmemLocation` is `#[repr(C)] { CUmemLocationType type_; int id }` in
    // every binding version, or (13.2+) `{ type_; union { int id; ... } }`, whose union
    // is 4 bytes at offset 4 with `id` at its start: the same layout as `Plain` (sizes
    // and alignments asserted above), and every bit pattern of the union is valid.
    unsafe { std::mem::transmute::<Plain, sys::CUmemLocation>(Plain { type_, id }) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_both_spellings() {
        let v = DriverVersion::new(12, 2);
        assert_eq!("12020".parse::<DriverVersion>(), Ok(v));
        assert_eq!(" 12.2 ".parse::<DriverVersion>(), Ok(v));
        assert_eq!(
            "13000".parse::<DriverVersion>(),
            Ok(DriverVersion::new(13, 0))
        );
        assert_eq!(
            "12.9".parse::<DriverVersion>(),
            Ok(DriverVersion::new(12, 9))
        );
        assert_eq!(DriverVersion::from_raw(12080).unwrap().to_string(), "12.8");
        assert_eq!(DriverVersion::from_raw(13020).unwrap().raw(), 13020);
        // The driver's own encoding rounds down odd values the same way.
        assert_eq!(
            DriverVersion::from_raw(12025).unwrap(),
            DriverVersion::new(12, 2)
        );
    }

    #[test]
    fn bad_versions_are_typed_errors() {
        for bad in [
            "", "abc", "12", "-12020", "0", "12.", ".2", "12.100", "12.2.1", "1e4", "99999999",
        ] {
            match bad.parse::<DriverVersion>() {
                Err(Error::InvalidArgument(msg)) => {
                    assert!(msg.contains("not a CUDA version"), "{bad:?}: {msg}")
                }
                other => panic!("{bad:?} parsed as {other:?}"),
            }
        }
        assert!(DriverVersion::from_raw(0).is_err());
        assert!(DriverVersion::from_raw(i32::MIN).is_err());
        assert!(DriverVersion::from_raw(i32::MAX).is_err());
    }

    #[test]
    fn versions_order_by_major_then_minor() {
        assert!(DriverVersion::new(12, 9) < DriverVersion::new(13, 0));
        assert!(DriverVersion::new(12, 2) < DriverVersion::new(12, 10));
        assert_eq!(DriverVersion::MINIMUM.raw(), 12020);
        assert_eq!(DriverVersion::new(12, 250).minor(), 99);
    }

    #[test]
    fn the_cap_only_lowers() {
        let real = DriverVersion::new(13, 0);
        assert_eq!(effective(real, None), real);
        assert_eq!(
            effective(real, Some(DriverVersion::new(12, 2))),
            DriverVersion::new(12, 2)
        );
        assert_eq!(effective(real, Some(DriverVersion::new(13, 2))), real);
    }

    #[test]
    fn entry_point_table() {
        // Base names carry no version suffix (cuGetProcAddress picks the variant by
        // version); each versioned symbol starts with its base name.
        for ep in ENTRY_POINTS {
            let base = ep.base.to_str().unwrap();
            assert!(!base.ends_with("_v2"), "{base}");
            assert!(ep.symbol.starts_with(base), "{} / {base}", ep.symbol);
            assert!(ep.since >= DriverVersion::MINIMUM, "{}", ep.symbol);
        }
        assert_eq!(EVENT_ELAPSED_TIME_V2.since, DriverVersion::new(12, 8));
        assert_eq!(FUNC_GET_PARAM_INFO.since, DriverVersion::new(12, 4));
        // The fallback is older than the entry point it replaces, for the same base.
        assert!(EVENT_ELAPSED_TIME.since < EVENT_ELAPSED_TIME_V2.since);
        assert_eq!(EVENT_ELAPSED_TIME.base, EVENT_ELAPSED_TIME_V2.base);
        // No symbol listed twice.
        let mut names: Vec<_> = ENTRY_POINTS.iter().map(|e| e.symbol).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ENTRY_POINTS.len());
    }

    #[test]
    fn drivers_before_12_2_are_refused_naming_both_versions() {
        assert_eq!(require_minimum(DriverVersion::new(12, 2)), Ok(()));
        assert_eq!(require_minimum(DriverVersion::new(13, 0)), Ok(()));
        for old in [DriverVersion::new(12, 1), DriverVersion::new(11, 8)] {
            let e = require_minimum(old).unwrap_err();
            assert_eq!(
                e,
                Error::DriverTooOld {
                    found: old,
                    needed: DriverVersion::MINIMUM
                }
            );
            let msg = e.to_string();
            assert!(
                msg.contains(&old.to_string()) && msg.contains("12.2"),
                "{msg}"
            );
            assert!(msg.contains("GPUBIND_ASSUME_DRIVER_VERSION"), "{msg}");
        }
    }

    #[test]
    fn unsupported_names_both_versions() {
        let e = FUNC_GET_PARAM_INFO.unsupported(DriverVersion::new(12, 2));
        let msg = e.to_string();
        assert!(msg.contains("cuFuncGetParamInfo"), "{msg}");
        assert!(msg.contains("12.4") && msg.contains("12.2"), "{msg}");
    }

    #[test]
    fn mem_location_fields() {
        let loc = mem_location(sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, 3);
        assert_eq!(
            loc.type_,
            sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
        );
        // SAFETY: `loc` is a plain 8-byte struct; read its second int.
        let id = unsafe { *(&loc as *const sys::CUmemLocation).cast::<i32>().add(1) };
        assert_eq!(id, 3);
    }

    #[test]
    fn driver_version_without_a_driver_is_typed() {
        // Here (no libcuda) NoDriver; on a GPU machine a version at least 1.0.
        match driver_version() {
            Ok(v) => assert!(v.major() >= 1),
            Err(Error::NoDriver) | Err(Error::InvalidArgument(_)) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
}

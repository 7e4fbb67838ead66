//! Every environment variable gpubind reads, read and parsed here: one function per
//! variable, each returning a typed value or a [`VarError`] naming the variable.
//!
//! The README's "Environment variables" table lists them with their defaults. A variable
//! that was renamed is still read under its old name when the new one is not set, with a
//! deprecation warning (`log::warn!`, once per process) naming both.
//!
//! Each function takes a [`Lookup`] (the process environment is [`env`]), so the parsing is
//! testable without touching the process environment. Caching is the caller's: what is
//! read once per process (the driver-version cap, the drop timeout, the library paths) is
//! kept by the code that uses it.

use crate::error::Error;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

/// A source of variables: a name to its value, `None` if unset.
pub(crate) type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// One variable gpubind reads: its name, and its name before a rename.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Var {
    /// The name to set.
    pub(crate) name: &'static str,
    /// The deprecated name, still read when `name` is not set.
    pub(crate) old: Option<&'static str>,
}

impl Var {
    const fn new(name: &'static str) -> Var {
        Var { name, old: None }
    }

    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    const fn renamed(name: &'static str, old: &'static str) -> Var {
        Var {
            name,
            old: Some(old),
        }
    }
}

/// The driver version gpubind assumes at most (`12020` or `12.2`).
pub(crate) const ASSUME_DRIVER_VERSION: Var = Var::new("GPUBIND_ASSUME_DRIVER_VERSION");
/// Whether the ranks of a launched job agree on every NCCL collective.
#[cfg(feature = "collective")]
pub(crate) const CHECK_CALLS: Var = Var::new("GPUBIND_CHECK_CALLS");
/// The cuBLAS library to load instead of searching.
#[cfg(feature = "cublas")]
pub(crate) const CUBLAS_PATH: Var = Var::new("GPUBIND_CUBLAS_PATH");
/// The cuBLASLt library to load instead of searching.
#[cfg(feature = "cublas")]
pub(crate) const CUBLASLT_PATH: Var = Var::new("GPUBIND_CUBLASLT_PATH");
/// How long a drop waits for pending work.
pub(crate) const DROP_TIMEOUT: Var = Var::new("GPUBIND_DROP_TIMEOUT");
/// The NCCL library to try first.
#[cfg(feature = "nccl")]
pub(crate) const NCCL_PATH: Var = Var::renamed("GPUBIND_NCCL_PATH", "GPUBIND_NCCL_LIB");
/// The NVRTC library to load instead of searching.
pub(crate) const NVRTC_PATH: Var = Var::new("GPUBIND_NVRTC_PATH");
/// The rendezvous port of a launched job.
#[cfg(feature = "collective")]
pub(crate) const RDZV_PORT: Var = Var::new("GPUBIND_RDZV_PORT");
/// The rendezvous (and NCCL initialisation) timeout of a launched job, in seconds.
#[cfg(feature = "collective")]
pub(crate) const RDZV_TIMEOUT: Var = Var::new("GPUBIND_RDZV_TIMEOUT");

/// The default of [`DROP_TIMEOUT`].
pub(crate) const DEFAULT_DROP_TIMEOUT: Duration = Duration::from_secs(300);

/// A value gpubind cannot use, naming the variable it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VarError {
    /// The variable as set (the old name if that is the one set).
    pub(crate) variable: &'static str,
    /// What is wrong with the value.
    pub(crate) reason: String,
}

impl fmt::Display for VarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.variable, self.reason)
    }
}

impl From<VarError> for Error {
    /// [`Error::InvalidArgument`] starting with the variable's name.
    fn from(e: VarError) -> Error {
        Error::InvalidArgument(e.to_string())
    }
}

impl VarError {
    /// [`Error::LaunchEnv`], for the variables of a launched job.
    #[cfg(feature = "collective")]
    pub(crate) fn into_launch_env(self) -> Error {
        Error::LaunchEnv {
            variable: self.variable.to_owned(),
            reason: self.reason,
        }
    }
}

/// The process environment: the one place gpubind reads it. A value that is not valid
/// Unicode is read lossily (it then fails to parse, or names a file that does not exist).
pub(crate) fn env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// `var`'s value and the name it was found under: the new name, else the old one (with a
/// deprecation warning, once per process). Surrounding white space is removed.
fn read(var: Var, get: Lookup<'_>) -> Option<(&'static str, String)> {
    let old = var.old.and_then(|old| get(old).map(|v| (old, v)));
    if let Some((old, _)) = &old {
        warn_deprecated(old, var.name);
    }
    let found = get(var.name).map(|v| (var.name, v)).or(old)?;
    Some((found.0, found.1.trim().to_owned()))
}

/// Logs once per process per old name that `old` is deprecated in favour of `new`.
fn warn_deprecated(old: &'static str, new: &'static str) {
    static WARNED: Mutex<Vec<&str>> = Mutex::new(Vec::new());
    let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    if !warned.contains(&old) {
        warned.push(old);
        log::warn!("{old} is deprecated: set {new} instead (it wins when both are set)");
    }
}

fn invalid(variable: &'static str, reason: String) -> VarError {
    VarError { variable, reason }
}

/// [`ASSUME_DRIVER_VERSION`] as `(major, minor)`: `12020` (the driver API's encoding) or
/// `12.2`. Unset or empty: no cap.
pub(crate) fn assume_driver_version(get: Lookup<'_>) -> Result<Option<(u32, u32)>, VarError> {
    let Some((name, v)) = read(ASSUME_DRIVER_VERSION, get).filter(|(_, v)| !v.is_empty()) else {
        return Ok(None);
    };
    let bad = || {
        invalid(
            name,
            format!("{v:?} is not a CUDA version (expected e.g. 12020 or 12.2)"),
        )
    };
    let (major, minor) = match v.split_once('.') {
        Some((major, minor)) => (
            major.parse::<u32>().map_err(|_| bad())?,
            minor.parse::<u32>().map_err(|_| bad())?,
        ),
        None => {
            let raw = v.parse::<u32>().map_err(|_| bad())?;
            if !(1000..1_000_000).contains(&raw) {
                return Err(bad());
            }
            (raw / 1000, (raw % 1000) / 10)
        }
    };
    if !(1..1000).contains(&major) || minor > 99 {
        return Err(bad());
    }
    Ok(Some((major, minor)))
}

/// [`CHECK_CALLS`]: `1`, `true`, `on`, `yes` (any case) or unset is on; `0`, `false`,
/// `off`, `no` is off.
#[cfg(feature = "collective")]
pub(crate) fn check_calls(get: Lookup<'_>) -> Result<bool, VarError> {
    let Some((name, v)) = read(CHECK_CALLS, get) else {
        return Ok(true);
    };
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        v => Err(invalid(
            name,
            format!("{v:?} is not one of 1/true/on/yes or 0/false/off/no"),
        )),
    }
}

/// A library path: unset or empty is `None`.
fn path(var: Var, get: Lookup<'_>) -> Option<String> {
    read(var, get).map(|(_, v)| v).filter(|v| !v.is_empty())
}

/// [`CUBLAS_PATH`]: the file name or path of the cuBLAS to load, if set.
#[cfg(feature = "cublas")]
pub(crate) fn cublas_path(get: Lookup<'_>) -> Option<String> {
    path(CUBLAS_PATH, get)
}

/// The CUDA toolkit roots named by `CUDA_HOME` and then `CUDA_PATH` (the variables the
/// toolkit's own tools read), where set and not empty: where NVRTC's headers are looked
/// for after the directory of the loaded NVRTC.
pub(crate) fn cuda_toolkit_roots(get: Lookup<'_>) -> Vec<std::path::PathBuf> {
    ["CUDA_HOME", "CUDA_PATH"]
        .into_iter()
        .filter_map(|name| get(name).filter(|v| !v.trim().is_empty()))
        .map(|v| std::path::PathBuf::from(v.trim()))
        .collect()
}

/// [`CUBLASLT_PATH`]: the file name or path of the cuBLASLt to load, if set.
#[cfg(feature = "cublas")]
pub(crate) fn cublaslt_path(get: Lookup<'_>) -> Option<String> {
    path(CUBLASLT_PATH, get)
}

/// [`NCCL_PATH`] (formerly `GPUBIND_NCCL_LIB`): the NCCL to try first, if set.
#[cfg(feature = "nccl")]
pub(crate) fn nccl_path(get: Lookup<'_>) -> Option<String> {
    path(NCCL_PATH, get)
}

/// [`NVRTC_PATH`]: the file name or path of the NVRTC to load, if set.
pub(crate) fn nvrtc_path(get: Lookup<'_>) -> Option<String> {
    path(NVRTC_PATH, get)
}

/// [`DROP_TIMEOUT`] in whole seconds: `0` is no wait, `none` (any case) is no limit
/// (`Duration::MAX`); unset or empty is [`DEFAULT_DROP_TIMEOUT`].
pub(crate) fn drop_timeout(get: Lookup<'_>) -> Result<Duration, VarError> {
    match read(DROP_TIMEOUT, get) {
        None => Ok(DEFAULT_DROP_TIMEOUT),
        Some((_, v)) if v.is_empty() => Ok(DEFAULT_DROP_TIMEOUT),
        Some((_, v)) if v.eq_ignore_ascii_case("none") => Ok(Duration::MAX),
        Some((name, v)) => v.parse::<u64>().map(Duration::from_secs).map_err(|_| {
            invalid(
                name,
                format!("{v:?} is not a number of seconds (or \"none\")"),
            )
        }),
    }
}

/// [`RDZV_PORT`]: a TCP port, `1..=65535`, if set.
#[cfg(feature = "collective")]
pub(crate) fn rdzv_port(get: Lookup<'_>) -> Result<Option<u16>, VarError> {
    let Some((name, v)) = read(RDZV_PORT, get) else {
        return Ok(None);
    };
    match v.parse::<u16>() {
        Ok(p) if p > 0 => Ok(Some(p)),
        _ => Err(invalid(
            name,
            format!("{v:?} is not a TCP port (1..=65535)"),
        )),
    }
}

/// [`RDZV_TIMEOUT`]: a positive, finite number of seconds (a fraction allowed), if set.
#[cfg(feature = "collective")]
pub(crate) fn rdzv_timeout(get: Lookup<'_>) -> Result<Option<Duration>, VarError> {
    let Some((name, v)) = read(RDZV_TIMEOUT, get) else {
        return Ok(None);
    };
    // Positive after rounding to whole nanoseconds too: `1e-12` would be no time at all.
    match v.parse::<f64>() {
        Ok(s) if (1e-9..1e9).contains(&s) => Ok(Some(Duration::from_secs_f64(s))),
        _ => Err(invalid(
            name,
            format!("{v:?} is not a positive number of seconds"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lookup over fixed pairs.
    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn named(e: VarError, variable: &str) -> String {
        assert_eq!(e.variable, variable, "{e}");
        e.reason
    }

    #[test]
    fn assume_driver_version_parses_both_spellings() {
        let f = |v: &str| assume_driver_version(&vars(&[(ASSUME_DRIVER_VERSION.name, v)]));
        assert_eq!(assume_driver_version(&vars(&[])), Ok(None));
        assert_eq!(f(""), Ok(None));
        assert_eq!(f("  "), Ok(None));
        assert_eq!(f("12020"), Ok(Some((12, 2))));
        assert_eq!(f(" 11.8 "), Ok(Some((11, 8))));
        for bad in ["twelve", "12", "0.5", "12.100", "-12020", "12.x"] {
            let reason = named(f(bad).unwrap_err(), "GPUBIND_ASSUME_DRIVER_VERSION");
            assert!(reason.contains(&format!("{bad:?}")), "{reason}");
        }
        let e: Error = f("twelve").unwrap_err().into();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.starts_with("GPUBIND_ASSUME_DRIVER_VERSION: ")),
            "{e:?}"
        );
    }

    #[test]
    fn drop_timeout_parses_seconds_none_and_zero() {
        let f = |v: &str| drop_timeout(&vars(&[(DROP_TIMEOUT.name, v)]));
        assert_eq!(drop_timeout(&vars(&[])), Ok(DEFAULT_DROP_TIMEOUT));
        assert_eq!(f(""), Ok(DEFAULT_DROP_TIMEOUT));
        assert_eq!(f(" 5 "), Ok(Duration::from_secs(5)));
        assert_eq!(f("0"), Ok(Duration::ZERO));
        assert_eq!(f("None"), Ok(Duration::MAX));
        // `none` means no deadline at all (no overflow, no panic).
        assert_eq!(std::time::Instant::now().checked_add(Duration::MAX), None);
        for bad in ["five", "-1", "1.5"] {
            named(f(bad).unwrap_err(), "GPUBIND_DROP_TIMEOUT");
        }
    }

    #[test]
    fn library_paths_are_taken_as_set() {
        let set = [(NVRTC_PATH.name, " /opt/nvrtc.so ")];
        assert_eq!(nvrtc_path(&vars(&set)).as_deref(), Some("/opt/nvrtc.so"));
        assert_eq!(nvrtc_path(&vars(&[(NVRTC_PATH.name, "")])), None);
        assert_eq!(nvrtc_path(&vars(&[])), None);
        #[cfg(feature = "cublas")]
        assert_eq!(
            cublas_path(&vars(&[(CUBLAS_PATH.name, "libcublas.so.12")])).as_deref(),
            Some("libcublas.so.12")
        );
    }

    #[cfg(feature = "nccl")]
    #[test]
    fn nccl_path_reads_its_old_name_and_the_new_one_wins() {
        let old = [("GPUBIND_NCCL_LIB", "/old/libnccl.so.2")];
        let new = [("GPUBIND_NCCL_PATH", "/old/libnccl.so.2")];
        assert_eq!(nccl_path(&vars(&old)), nccl_path(&vars(&new)));
        assert_eq!(nccl_path(&vars(&old)).as_deref(), Some("/old/libnccl.so.2"));
        let both = [
            ("GPUBIND_NCCL_LIB", "/old/libnccl.so.2"),
            ("GPUBIND_NCCL_PATH", "/new/libnccl.so.2"),
        ];
        assert_eq!(
            nccl_path(&vars(&both)).as_deref(),
            Some("/new/libnccl.so.2")
        );
        assert_eq!(nccl_path(&vars(&[])), None);
    }

    /// An invalid value under an old name is reported under the name that was set.
    #[test]
    fn an_old_name_gives_the_same_value_and_errors_name_it() {
        const RENAMED: Var = Var::renamed("GPUBIND_TEST_NEW", "GPUBIND_TEST_OLD");
        let port = |pairs: &[(&str, &str)]| {
            read(RENAMED, &vars(pairs)).map(|(name, v)| match v.parse::<u16>() {
                Ok(p) => Ok(p),
                Err(_) => Err(invalid(name, format!("{v:?}"))),
            })
        };
        assert_eq!(
            port(&[("GPUBIND_TEST_OLD", "7")]),
            port(&[("GPUBIND_TEST_NEW", "7")])
        );
        let e = port(&[("GPUBIND_TEST_OLD", "x")]).unwrap().unwrap_err();
        assert_eq!(e.variable, "GPUBIND_TEST_OLD");
        let new_wins = port(&[("GPUBIND_TEST_OLD", "x"), ("GPUBIND_TEST_NEW", "8")]);
        assert_eq!(new_wins, Some(Ok(8)));
    }

    #[cfg(feature = "collective")]
    #[test]
    fn launch_job_variables_parse_or_name_themselves() {
        let check = |v: &str| check_calls(&vars(&[(CHECK_CALLS.name, v)]));
        assert_eq!(check_calls(&vars(&[])), Ok(true));
        for on in ["1", "TRUE", "on", "yes"] {
            assert_eq!(check(on), Ok(true), "{on}");
        }
        for off in ["0", "false", "OFF", "no"] {
            assert_eq!(check(off), Ok(false), "{off}");
        }
        named(check("maybe").unwrap_err(), "GPUBIND_CHECK_CALLS");

        let port = |v: &str| rdzv_port(&vars(&[(RDZV_PORT.name, v)]));
        assert_eq!(rdzv_port(&vars(&[])), Ok(None));
        assert_eq!(port("40000"), Ok(Some(40000)));
        for bad in ["0", "65536", "http"] {
            named(port(bad).unwrap_err(), "GPUBIND_RDZV_PORT");
        }

        let timeout = |v: &str| rdzv_timeout(&vars(&[(RDZV_TIMEOUT.name, v)]));
        assert_eq!(rdzv_timeout(&vars(&[])), Ok(None));
        assert_eq!(timeout("2.5"), Ok(Some(Duration::from_millis(2500))));
        for bad in ["-3", "0", "1e-12", "inf", "NaN", "soon"] {
            named(timeout(bad).unwrap_err(), "GPUBIND_RDZV_TIMEOUT");
        }
        let e = timeout("-3").unwrap_err().into_launch_env();
        assert!(
            matches!(&e, Error::LaunchEnv { variable, .. } if variable == "GPUBIND_RDZV_TIMEOUT"),
            "{e:?}"
        );
    }

    #[test]
    fn cuda_toolkit_roots_in_order_skipping_empty() {
        let both = [
            ("CUDA_HOME", " /opt/cuda "),
            ("CUDA_PATH", "/usr/local/cuda-13"),
        ];
        assert_eq!(
            cuda_toolkit_roots(&vars(&both)),
            [
                std::path::PathBuf::from("/opt/cuda"),
                std::path::PathBuf::from("/usr/local/cuda-13")
            ]
        );
        assert!(cuda_toolkit_roots(&vars(&[("CUDA_HOME", "  ")])).is_empty());
    }
}

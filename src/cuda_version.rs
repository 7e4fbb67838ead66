//! CUDA version numbers: a utility below the driver layer, so that errors can name the
//! versions involved. Public as [`gpubind::DriverVersion`](crate::DriverVersion).

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// A CUDA version: what a driver supports (`cuDriverGetVersion`) or what an entry point
/// needs.
///
/// Ordered by (major, minor); displayed as `major.minor`.
///
/// ```
/// use gpubind::DriverVersion;
/// let v = DriverVersion::from_raw(12020).unwrap();
/// assert_eq!((v.major(), v.minor()), (12, 2));
/// assert_eq!(v.to_string(), "12.2");
/// assert_eq!(v.raw(), 12020);
/// assert_eq!("12.2".parse::<DriverVersion>().unwrap(), v);
/// assert!(DriverVersion::new(13, 0) > v);
/// assert!(DriverVersion::from_raw(-1).is_err());
/// ```
///
/// # Supported drivers and entry points
///
/// gpubind runs on every driver from CUDA 12.2 (R535) up, whatever CUDA version its
/// cudarc bindings were generated from (see `docs/compat.md`). Entry points newer than
/// 12.2 are never called through cudarc's per-symbol loader (which panics on a missing
/// symbol) nor linked by name: they are looked up with `cuGetProcAddress_v2`, asking for
/// the ABI of the CUDA version that introduced them, and only when the driver's version
/// is at least that one. Where an older entry point does the same job it is used instead
/// (`cuEventElapsedTime` where `cuEventElapsedTime_v2` is missing); where none does, the
/// operation is [`Error::Unsupported`], naming what it needs, or (for checks that are an
/// extra, like the launch-argument check of `cuFuncGetParamInfo`) skipped.
///
/// [`driver_version`](crate::driver_version) is the version gpubind acts on. Setting the
/// environment variable [`ASSUME_DRIVER_VERSION_ENV`](crate::ASSUME_DRIVER_VERSION_ENV)
/// (`GPUBIND_ASSUME_DRIVER_VERSION`, e.g. `12020` or `12.2`) caps it: gpubind behaves as if
/// the driver reported the smaller of its real version and the cap, so a new driver
/// exercises every old-driver path for real. It is read once per process.
///
/// ```no_run
/// let v = gpubind::driver_version()?;
/// println!("driver supports CUDA {v}"); // e.g. "driver supports CUDA 13.0"
/// assert!(v >= gpubind::DriverVersion::MINIMUM);
/// # Ok::<(), gpubind::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriverVersion {
    major: u32,
    minor: u32,
}

impl DriverVersion {
    /// The oldest driver gpubind runs on: CUDA 12.2 (driver branch R535).
    pub const MINIMUM: DriverVersion = DriverVersion::new(12, 2);

    /// `major.minor`. Minor versions above 99 are clamped to 99.
    pub const fn new(major: u32, minor: u32) -> DriverVersion {
        let minor = if minor > 99 { 99 } else { minor };
        DriverVersion { major, minor }
    }

    /// From the driver API's encoding, `1000 * major + 10 * minor` (`12020` is 12.2).
    /// Zero, negative and absurd values (above 1000.0) are [`Error::InvalidArgument`].
    pub fn from_raw(raw: i32) -> Result<DriverVersion> {
        if !(1000..1_000_000).contains(&raw) {
            return Err(Error::InvalidArgument(format!(
                "{raw} is not a CUDA version (expected 1000 * major + 10 * minor, e.g. 12020)"
            )));
        }
        let raw = raw as u32;
        Ok(DriverVersion::new(raw / 1000, (raw % 1000) / 10))
    }

    /// The driver API's encoding, `1000 * major + 10 * minor`.
    pub const fn raw(self) -> i32 {
        (self.major * 1000 + self.minor * 10) as i32
    }

    /// The major version (12 for 12.2).
    pub const fn major(self) -> u32 {
        self.major
    }

    /// The minor version (2 for 12.2).
    pub const fn minor(self) -> u32 {
        self.minor
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for DriverVersion {
    type Err = Error;

    /// `12020` (the driver API's encoding) or `12.2`; surrounding spaces are ignored.
    fn from_str(s: &str) -> Result<DriverVersion> {
        let bad = || {
            Error::InvalidArgument(format!(
                "{s:?} is not a CUDA version (expected e.g. 12020 or 12.2)"
            ))
        };
        let t = s.trim();
        if let Some((major, minor)) = t.split_once('.') {
            let major: u32 = major.parse().map_err(|_| bad())?;
            let minor: u32 = minor.parse().map_err(|_| bad())?;
            if !(1..1000).contains(&major) || minor > 99 {
                return Err(bad());
            }
            Ok(DriverVersion::new(major, minor))
        } else {
            let raw: i32 = t.parse().map_err(|_| bad())?;
            DriverVersion::from_raw(raw).map_err(|_| bad())
        }
    }
}

//! [`DriverErrorCode`]: a driver result code, gpubind's own type.

use cudarc::driver::sys::CUresult;
use std::fmt;

/// A CUDA driver result code (a `CUresult` other than `CUDA_SUCCESS`): the `code` of
/// [`Error::Driver`](crate::Error::Driver) and [`Error::ContextPoisoned`](crate::Error::ContextPoisoned).
///
/// gpubind's own type, not cudarc's enum, so matching on it does not tie code to a cudarc
/// version. Compare with the constants, or by [`name`](Self::name) or [`raw`](Self::raw)
/// value:
///
/// ```
/// use gpubind::DriverErrorCode;
/// let oom = DriverErrorCode::OUT_OF_MEMORY;
/// assert_eq!(oom.name(), "CUDA_ERROR_OUT_OF_MEMORY");
/// assert_eq!(oom.raw(), 2);
/// assert_eq!(oom.to_string(), "CUDA_ERROR_OUT_OF_MEMORY");
/// ```
///
/// The raw escape hatches convert to and from cudarc's `CUresult`
/// ([`as_cudarc`](Self::as_cudarc), `From<CUresult>`), for code that calls the driver
/// itself.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverErrorCode(pub(super) CUresult);

impl DriverErrorCode {
    /// `CUDA_ERROR_INVALID_VALUE` (1).
    pub const INVALID_VALUE: Self = Self(CUresult::CUDA_ERROR_INVALID_VALUE);
    /// `CUDA_ERROR_OUT_OF_MEMORY` (2).
    pub const OUT_OF_MEMORY: Self = Self(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    /// `CUDA_ERROR_NOT_INITIALIZED` (3).
    pub const NOT_INITIALIZED: Self = Self(CUresult::CUDA_ERROR_NOT_INITIALIZED);
    /// `CUDA_ERROR_NO_DEVICE` (100).
    pub const NO_DEVICE: Self = Self(CUresult::CUDA_ERROR_NO_DEVICE);
    /// `CUDA_ERROR_INVALID_DEVICE` (101).
    pub const INVALID_DEVICE: Self = Self(CUresult::CUDA_ERROR_INVALID_DEVICE);
    /// `CUDA_ERROR_INVALID_CONTEXT` (201).
    pub const INVALID_CONTEXT: Self = Self(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    /// `CUDA_ERROR_INVALID_HANDLE` (400).
    pub const INVALID_HANDLE: Self = Self(CUresult::CUDA_ERROR_INVALID_HANDLE);
    /// `CUDA_ERROR_NOT_FOUND` (500).
    pub const NOT_FOUND: Self = Self(CUresult::CUDA_ERROR_NOT_FOUND);
    /// `CUDA_ERROR_ILLEGAL_ADDRESS` (700).
    pub const ILLEGAL_ADDRESS: Self = Self(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    /// `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES` (701).
    pub const LAUNCH_OUT_OF_RESOURCES: Self = Self(CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
    /// `CUDA_ERROR_LAUNCH_TIMEOUT` (702).
    pub const LAUNCH_TIMEOUT: Self = Self(CUresult::CUDA_ERROR_LAUNCH_TIMEOUT);
    /// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` (704).
    pub const PEER_ACCESS_ALREADY_ENABLED: Self =
        Self(CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    /// `CUDA_ERROR_ASSERT` (710), a device-side assert.
    pub const ASSERT: Self = Self(CUresult::CUDA_ERROR_ASSERT);
    /// `CUDA_ERROR_LAUNCH_FAILED` (719).
    pub const LAUNCH_FAILED: Self = Self(CUresult::CUDA_ERROR_LAUNCH_FAILED);
    /// `CUDA_ERROR_NOT_PERMITTED` (800).
    pub const NOT_PERMITTED: Self = Self(CUresult::CUDA_ERROR_NOT_PERMITTED);
    /// `CUDA_ERROR_NOT_SUPPORTED` (801).
    pub const NOT_SUPPORTED: Self = Self(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` (900): a call not allowed while a stream
    /// captures.
    pub const STREAM_CAPTURE_UNSUPPORTED: Self =
        Self(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` (901): the capture was invalidated by an
    /// earlier error.
    pub const STREAM_CAPTURE_INVALIDATED: Self =
        Self(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /// `CUDA_ERROR_STREAM_CAPTURE_UNJOINED` (904): a stream forked into a capture was not
    /// joined back.
    pub const STREAM_CAPTURE_UNJOINED: Self = Self(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
    /// `CUDA_ERROR_UNKNOWN` (999).
    pub const UNKNOWN: Self = Self(CUresult::CUDA_ERROR_UNKNOWN);

    /// The numeric value, as in `cuda.h`.
    pub fn raw(self) -> u32 {
        self.0 as u32
    }

    /// The driver's `CUresult`.
    pub(crate) fn cu(self) -> CUresult {
        self.0
    }

    /// The `cuda.h` name, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS` (what `cuGetErrorName`
    /// returns; known without a driver).
    pub fn name(self) -> String {
        format!("{:?}", self.0)
    }

    /// Raw escape hatch: the code as cudarc's `CUresult` (a cudarc type: see the crate
    /// docs on `gpubind::cudarc` and semver).
    pub fn as_cudarc(self) -> CUresult {
        self.0
    }
}

/// Raw escape hatch: a `CUresult` from a driver call made directly (through
/// `gpubind::cudarc`), e.g. for [`Error::driver`](crate::Error::driver).
impl From<CUresult> for DriverErrorCode {
    fn from(code: CUresult) -> Self {
        DriverErrorCode(code)
    }
}

impl fmt::Display for DriverErrorCode {
    /// The name ([`DriverErrorCode::name`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl fmt::Debug for DriverErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DriverErrorCode({:?} = {})", self.0, self.raw())
    }
}

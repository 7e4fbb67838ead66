//! The driver's result layer: one thin, named wrapper per driver call.
//!
//! As in cudarc's `driver::result`, each function here calls exactly one `sys::cu*`
//! entry point and
//!
//! * returns [`Result`], whose error is [`Error::Driver`] naming the call (the
//!   versioned symbol, e.g. `cuMemAlloc_v2`) and its code;
//! * turns out-parameters into return values (`memory::alloc(bytes)` returns the
//!   `CUdeviceptr`);
//! * is an `unsafe fn` where the call's contract needs the caller (a raw pointer, a
//!   handle whose liveness the caller guarantees, a context that must be current), with
//!   a `# Safety` section saying what; calls the driver validates fully are safe.
//!
//! The wrappers are `#[inline]` and their error path is `#[cold]`, so a call through
//! them costs what the raw call costs plus one compare. They decide nothing about
//! devices: whether an error poisons a device is the device layer's decision
//! (`Device::check`). Entry points that not every supported driver has are looked up
//! by version and wrapped the same way in [`crate::driver::version`].
//!
//! The modules follow the driver API's concepts: [`init`], [`context`], [`device`],
//! [`memory`], [`copy`] (copies and memsets), [`stream`], [`event`], [`module`]
//! (modules, functions, occupancy, launches), [`graph`], [`ipc`] and [`pool`].

pub(crate) mod context;
pub(crate) mod copy;
pub(crate) mod device;
pub(crate) mod event;
pub(crate) mod graph;
pub(crate) mod init;
pub(crate) mod ipc;
pub(crate) mod memory;
pub(crate) mod module;
pub(crate) mod pool;
pub(crate) mod stream;

use crate::error::{Error, Result};
use cudarc::driver::sys;

/// `Ok(())` on `CUDA_SUCCESS`, else [`Error::Driver`] naming `call`.
///
/// The success path is one compare; building the error (which asks the driver for the
/// code's name and description) is out of line.
#[inline(always)]
pub(crate) fn check(code: sys::CUresult, call: &'static str) -> Result<()> {
    match code {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        code => Err(failed(call, code)),
    }
}

/// `Ok(value)` on `CUDA_SUCCESS`, else [`Error::Driver`] naming `call`.
#[inline(always)]
pub(crate) fn check_value<T>(code: sys::CUresult, call: &'static str, value: T) -> Result<T> {
    match code {
        sys::CUresult::CUDA_SUCCESS => Ok(value),
        code => Err(failed(call, code)),
    }
}

/// `Ok(true)` on `CUDA_SUCCESS`, `Ok(false)` on `CUDA_ERROR_NOT_READY` (the answer of
/// the query calls for work still running), else [`Error::Driver`] naming `call`.
#[inline(always)]
pub(crate) fn check_ready(code: sys::CUresult, call: &'static str) -> Result<bool> {
    match code {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        code => Err(failed(call, code)),
    }
}

/// The error of a failed call (out of line: the success path stays a compare).
#[cold]
#[inline(never)]
pub(crate) fn failed(call: &'static str, code: sys::CUresult) -> Error {
    Error::driver(call, code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_the_call_and_keeps_the_code() {
        assert_eq!(check(sys::CUresult::CUDA_SUCCESS, "cuInit"), Ok(()));
        let e = check(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc_v2").unwrap_err();
        match &e {
            Error::Driver { call, .. } => assert_eq!(*call, "cuMemAlloc_v2"),
            other => panic!("expected Error::Driver, got {other:?}"),
        }
        assert_eq!(
            e.driver_code().map(|c| c.as_cudarc()),
            Some(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        );
    }

    #[test]
    fn check_value_returns_the_value_only_on_success() {
        assert_eq!(
            check_value(sys::CUresult::CUDA_SUCCESS, "cuDeviceGet", 7),
            Ok(7)
        );
        assert!(check_value(sys::CUresult::CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet", 7).is_err());
    }

    /// Every `sys::cu*` entry point that gpubind's sources call has its wrapper here (or,
    /// for the entry points looked up by version, in `driver::version`).
    #[test]
    fn every_driver_call_in_src_has_a_wrapper() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![root.clone()];
        let mut sources = Vec::new();
        while let Some(path) = files.pop() {
            if path.is_dir() {
                for entry in std::fs::read_dir(&path).unwrap() {
                    files.push(entry.unwrap().path());
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                sources.push((path.clone(), std::fs::read_to_string(&path).unwrap()));
            }
        }
        let layer: String = sources
            .iter()
            .filter(|(p, _)| p.starts_with(root.join("driver/result")))
            .map(|(_, text)| text.as_str())
            .collect();
        let mut missing = Vec::new();
        for (path, text) in &sources {
            for (i, _) in text.match_indices("sys::cu") {
                let name: String = text[i + 5..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let is_call = name.len() > 2 && name.as_bytes()[2].is_ascii_uppercase();
                if is_call && !layer.contains(&format!("sys::{name}(")) {
                    missing.push(format!("{name} ({})", path.display()));
                }
            }
        }
        missing.sort();
        missing.dedup();
        assert!(
            missing.is_empty(),
            "driver calls without a wrapper: {missing:#?}"
        );
    }

    #[test]
    fn check_ready_maps_not_ready_to_false() {
        assert_eq!(
            check_ready(sys::CUresult::CUDA_SUCCESS, "cuStreamQuery"),
            Ok(true)
        );
        assert_eq!(
            check_ready(sys::CUresult::CUDA_ERROR_NOT_READY, "cuStreamQuery"),
            Ok(false)
        );
        let e = check_ready(sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, "cuStreamQuery");
        assert!(matches!(
            e,
            Err(Error::Driver {
                call: "cuStreamQuery",
                ..
            })
        ));
    }
}

//! Non-GPU checks of the public API: auto-trait promises (compile time), the per-thread
//! token, error messages, and typed errors without a driver.

use gpubind::*;
use static_assertions::{assert_impl_all, assert_not_impl_any};
use std::fmt::Debug;
use std::sync::Arc;

// The token and everything that proves a binding stay on their thread.
assert_not_impl_any!(ThreadContext: Send, Sync);
assert_not_impl_any!(BoundDevice<'static>: Send, Sync);
assert_not_impl_any!(BoundStream<'static>: Send, Sync);
assert_not_impl_any!(LaunchBuilder<'static, 'static>: Send, Sync);
// A capture is ended on the thread that began it; graphs are not internally synchronised
// by the driver (one thread at a time, but they may move).
assert_not_impl_any!(gpubind::Capture<'static, 'static>: Send, Sync);
assert_not_impl_any!(gpubind::CaptureLaunch<'static, 'static, 'static>: Send, Sync);
assert_impl_all!(gpubind::Graph<'static>: Send);
assert_not_impl_any!(gpubind::Graph<'static>: Sync);
assert_impl_all!(gpubind::GraphExec<'static>: Send);
assert_not_impl_any!(gpubind::GraphExec<'static>: Sync);
assert_not_impl_any!(LaunchExBuilder<'static, 'static>: Send, Sync);
assert_not_impl_any!(StreamLaunch<'static, 'static>: Send, Sync);
// One step, written once, issued on a stream or into a capture.
assert_impl_all!(BoundStream<'static>: Issue<'static>);
assert_impl_all!(gpubind::Capture<'static, 'static>: Issue<'static>);
assert_impl_all!(StreamLaunch<'static, 'static>: KernelLaunch<'static>, Debug);
assert_impl_all!(gpubind::CaptureLaunch<'static, 'static, 'static>: KernelLaunch<'static>, Debug);

// Devices and resources are shared freely.
assert_impl_all!(Device: Send, Sync);
assert_impl_all!(Arc<Device>: Send, Sync, Clone);
assert_impl_all!(DeviceSlice<f32>: Send, Sync);
assert_impl_all!(DeviceSlice<half::bf16>: Send, Sync);
assert_impl_all!(DeviceView<'static, u8>: Send, Sync);
assert_impl_all!(DeviceViewMut<'static, u8>: Send, Sync);
assert_impl_all!(Stream: Send, Sync);
assert_impl_all!(Event: Send, Sync);
assert_impl_all!(Module: Send, Sync);
assert_impl_all!(Function<'static>: Send, Sync, Clone);
assert_impl_all!(Kernel: Send, Sync, Clone, Debug);
assert_impl_all!(SharedModule: Send, Sync, Clone, Debug, std::ops::Deref<Target = Module>);
assert_impl_all!(ModuleGlobal<f32>: Send, Sync, Clone, Debug);
assert_impl_all!(ModuleGlobal<[u64; 2]>: CopySource<[u64; 2]>, CopyDest<[u64; 2]>, DeviceMemoryMut<[u64; 2]>, KernelArg, DeviceOnlyMemory);
// Every buffer and view of this process may be written by a kernel (passed by `&mut` or
// to `arg_written`), except a shared view of managed memory, whose host slices may be
// held meanwhile.
assert_impl_all!(DeviceSlice<f32>: WritableArg);
assert_impl_all!(DeviceView<'static, f32>: WritableArg);
assert_impl_all!(DeviceViewMut<'static, f32>: WritableArg);
assert_impl_all!(ManagedSlice<f32>: WritableArg);
assert_not_impl_any!(ManagedView<'static, f32>: WritableArg);
assert_impl_all!(ManagedViewMut<'static, f32>: WritableArg);
assert_impl_all!(PinnedHostBuffer<f32>: WritableArg);
assert_impl_all!(RegisteredHost<'static, f32>: WritableArg);
assert_impl_all!(ModuleGlobal<f32>: WritableArg);
assert_impl_all!(ClusterScheduling: Debug, Copy, Eq, Default);
assert_impl_all!(Error: Send, Sync, Clone, std::error::Error);

// Every public type is `Debug` (handles print their device and identity, never memory
// contents or raw pointers' targets). `#![warn(missing_debug_implementations)]` in lib.rs
// catches a new type in the library; this list fails the test build if one regresses.
assert_impl_all!(ThreadContext: Debug);
assert_impl_all!(BoundDevice<'static>: Debug);
assert_impl_all!(BoundStream<'static>: Debug);
assert_impl_all!(gpubind::Graph<'static>: Debug);
assert_impl_all!(gpubind::GraphExec<'static>: Debug);
assert_impl_all!(Device: Debug);
assert_impl_all!(DeviceAttribute: Debug, Copy, Eq, std::hash::Hash, std::fmt::Display);
assert_impl_all!(DriverErrorCode: Debug, Copy, Eq, std::hash::Hash, std::fmt::Display);
assert_impl_all!(Uuid: Debug);
assert_impl_all!(gpubind::DriverVersion: Debug, Send, Sync, Copy, Ord, std::fmt::Display);
assert_impl_all!(gpubind::EntryPointStatus: Debug, Send, Sync, Clone);
assert_impl_all!(Error: Debug);
assert_impl_all!(Stream: Debug);
assert_impl_all!(Event: Debug);
assert_impl_all!(Module: Debug);
assert_impl_all!(Function<'static>: Debug);
assert_impl_all!(LaunchBuilder<'static, 'static>: Debug);
assert_impl_all!(LaunchExBuilder<'static, 'static>: Debug);
assert_impl_all!(LaunchConfig: Debug);
assert_impl_all!(Output: Debug);
assert_impl_all!(DeviceSlice<f32>: Debug);
assert_impl_all!(DeviceView<'static, f32>: Debug);
assert_impl_all!(DeviceViewMut<'static, f32>: Debug);
assert_impl_all!(CopyScope<'static, 'static>: Debug);
assert_impl_all!(Endpoint<'static>: Debug);
assert_impl_all!(MemoryKind: Debug);
assert_impl_all!(PinnedHostBuffer<f32>: Debug);
assert_impl_all!(PinnedOptions: Debug);
assert_impl_all!(RegisteredHost<'static, f32>: Debug);
assert_impl_all!(RegisterOptions: Debug);
assert_impl_all!(ManagedSlice<f32>: Debug);
assert_impl_all!(Advice<'static>: Debug);
assert_impl_all!(Location<'static>: Debug);

// The optional parts (Cargo features, all on by default) are checked when built.
#[cfg(feature = "cublas")]
mod cublas_api {
    use super::*;
    assert_impl_all!(gpubind::blas::Blas: Debug);
    assert_impl_all!(gpubind::blas::Matmul: Debug);
    assert_impl_all!(gpubind::blas::Batch: Debug);
    assert_impl_all!(gpubind::blas::Epilogue: Debug);
    assert_impl_all!(gpubind::blas::LtArgs<'static, f32>: Debug);
    assert_impl_all!(gpubind::blas::CaptureLtArgs<'static, f32>: Debug);
    assert_impl_all!(gpubind::blas::MatmulError: Debug, Send, Sync);
    assert_impl_all!(gpubind::blas::Gemv: Debug, Copy, Send, Sync);
    assert_impl_all!(gpubind::blas::GemmGroup: Debug, Clone, Send, Sync);
    assert_impl_all!(f32: gpubind::blas::BlasFloat);
    assert_impl_all!(f64: gpubind::blas::BlasFloat);
    assert_not_impl_any!(half::f16: gpubind::blas::BlasFloat);
    assert_not_impl_any!(half::bf16: gpubind::blas::BlasFloat);
    assert_impl_all!(gpubind::blas::Blas: Send);
    assert_not_impl_any!(gpubind::blas::Blas: Sync);
}

#[cfg(feature = "collective")]
mod collective_api {
    use super::*;
    use gpubind::collective::*;
    assert_impl_all!(Backend: Debug);
    assert_impl_all!(CommOptions: Debug);
    assert_impl_all!(Communicator: Debug);
    assert_impl_all!(Group<'static, 'static>: Debug);
    assert_impl_all!(Op: Debug);
    assert_impl_all!(RankComm: Debug);
    assert_impl_all!(Transport: Debug);
}

#[cfg(feature = "dlpack")]
mod dlpack_api {
    use super::*;
    use gpubind::dlpack::*;
    assert_impl_all!(ExportedTensor: Debug);
    assert_impl_all!(ImportedTensor<f32>: Debug);
    assert_impl_all!(gpubind::dlpack::DLPackVersion: Debug);
    assert_impl_all!(gpubind::dlpack::DLDeviceType: Debug);
    assert_impl_all!(gpubind::dlpack::DLDevice: Debug);
    assert_impl_all!(gpubind::dlpack::DLDataType: Debug);
    assert_impl_all!(gpubind::dlpack::DLTensor: Debug);
    assert_impl_all!(gpubind::dlpack::DLManagedTensor: Debug);
    assert_impl_all!(gpubind::dlpack::DLManagedTensorVersioned: Debug);
}

#[cfg(feature = "ipc")]
mod ipc_api {
    use super::*;
    use gpubind::ipc::*;
    assert_impl_all!(BufferHandle: Debug);
    assert_impl_all!(LegacyIpcHandle: Debug);
    assert_impl_all!(PoolHandle: Debug);
    assert_impl_all!(gpubind::ipc::PoolId: Debug);
    assert_impl_all!(gpubind::ipc::PoolUsage: Debug);
    assert_impl_all!(PoolConfig: Debug);
    assert_impl_all!(MemoryPool: Debug);
    assert_impl_all!(PoolSlice<f32>: Debug);
    assert_impl_all!(ImportedPool: Debug);
    assert_impl_all!(ImportedSlice<f32>: Debug);
    assert_impl_all!(LegacySlice<f32>: Debug);
    assert_impl_all!(gpubind::ipc::Message: Debug);
    assert_impl_all!(gpubind::ipc::PeerCredentials: Debug);
    assert_impl_all!(gpubind::ipc::PeerPolicy: Debug);
    assert_impl_all!(gpubind::ipc::TransportOptions: Debug);
    // Writable by a kernel: this process's pool slices and imports, and lent imports;
    // buffers shared for reading with another process are not (passed by `&` only).
    assert_impl_all!(PoolSlice<f32>: WritableArg);
    assert_impl_all!(ImportedSlice<f32>: WritableArg);
    assert_impl_all!(LegacySlice<f32>: WritableArg);
    assert_impl_all!(LentImport<f32>: WritableArg);
    assert_impl_all!(Shared<f32>: KernelArg);
    assert_impl_all!(SharedImport<f32>: KernelArg);
    assert_not_impl_any!(Shared<f32>: WritableArg);
    assert_not_impl_any!(SharedImport<f32>: WritableArg);
}

// Plain data only.
assert_impl_all!(f32: DeviceRepr);
assert_impl_all!([u16; 3]: DeviceRepr);
assert_not_impl_any!(bool: DeviceRepr);
assert_not_impl_any!(char: DeviceRepr);

#[test]
fn token_is_one_per_thread() {
    let main_token = ThreadContext::acquire().expect("first token");
    assert_eq!(
        ThreadContext::acquire().unwrap_err(),
        Error::ThreadContextTaken
    );
    // Another thread has its own slot, free while this one is taken.
    std::thread::spawn(|| {
        let t = ThreadContext::acquire().expect("other thread's token");
        assert_eq!(
            ThreadContext::acquire().unwrap_err(),
            Error::ThreadContextTaken
        );
        drop(t);
        ThreadContext::acquire().expect("re-acquire after drop");
    })
    .join()
    .unwrap();
    drop(main_token);
    let again = ThreadContext::acquire().expect("slot freed by drop");
    drop(again);
}

#[test]
fn error_messages_name_the_problem() {
    let e = Error::BadOrdinal {
        ordinal: 3,
        count: 1,
    };
    assert_eq!(
        e.to_string(),
        "device ordinal 3 is out of range: 1 CUDA device(s) are visible"
    );
    let e = Error::WrongDevice {
        what: "source slice",
        bound: 1,
        found: 0,
    };
    assert_eq!(
        e.to_string(),
        "wrong device: source slice lives on device 0, but device 1 is bound"
    );
    assert!(
        Error::NoDriver
            .to_string()
            .starts_with("no CUDA driver found")
    );
    assert!(
        Error::ThreadContextTaken
            .to_string()
            .contains("already holds a ThreadContext")
    );
}

/// Driver result codes are gpubind's own type: names and values as in `cuda.h`, Display
/// as the name, and the raw conversions to and from cudarc's `CUresult` round-trip.
#[test]
fn cudarc_driver_errors_convert_to_driver_errors() {
    use gpubind::cudarc::driver::{DriverError, sys::CUresult};
    fn fails() -> Result<()> {
        Err(DriverError(CUresult::CUDA_ERROR_INVALID_VALUE))?;
        Ok(())
    }
    match fails() {
        Err(Error::Driver {
            call, code, name, ..
        }) => {
            assert_eq!(call, "a cudarc driver call");
            assert_eq!(code, DriverErrorCode::INVALID_VALUE);
            assert_eq!(name, "CUDA_ERROR_INVALID_VALUE");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn driver_error_codes_have_names_and_values() {
    use gpubind::cudarc::driver::sys::CUresult;
    let codes = [
        (
            DriverErrorCode::INVALID_VALUE,
            1,
            "CUDA_ERROR_INVALID_VALUE",
        ),
        (
            DriverErrorCode::OUT_OF_MEMORY,
            2,
            "CUDA_ERROR_OUT_OF_MEMORY",
        ),
        (
            DriverErrorCode::NOT_INITIALIZED,
            3,
            "CUDA_ERROR_NOT_INITIALIZED",
        ),
        (DriverErrorCode::NO_DEVICE, 100, "CUDA_ERROR_NO_DEVICE"),
        (
            DriverErrorCode::STREAM_CAPTURE_UNSUPPORTED,
            900,
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        ),
        (
            DriverErrorCode::STREAM_CAPTURE_INVALIDATED,
            901,
            "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        ),
        (
            DriverErrorCode::STREAM_CAPTURE_UNJOINED,
            904,
            "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
        ),
        (
            DriverErrorCode::INVALID_DEVICE,
            101,
            "CUDA_ERROR_INVALID_DEVICE",
        ),
        (
            DriverErrorCode::INVALID_CONTEXT,
            201,
            "CUDA_ERROR_INVALID_CONTEXT",
        ),
        (
            DriverErrorCode::INVALID_HANDLE,
            400,
            "CUDA_ERROR_INVALID_HANDLE",
        ),
        (DriverErrorCode::NOT_FOUND, 500, "CUDA_ERROR_NOT_FOUND"),
        (
            DriverErrorCode::ILLEGAL_ADDRESS,
            700,
            "CUDA_ERROR_ILLEGAL_ADDRESS",
        ),
        (
            DriverErrorCode::LAUNCH_OUT_OF_RESOURCES,
            701,
            "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        ),
        (
            DriverErrorCode::LAUNCH_TIMEOUT,
            702,
            "CUDA_ERROR_LAUNCH_TIMEOUT",
        ),
        (
            DriverErrorCode::PEER_ACCESS_ALREADY_ENABLED,
            704,
            "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        ),
        (DriverErrorCode::ASSERT, 710, "CUDA_ERROR_ASSERT"),
        (
            DriverErrorCode::LAUNCH_FAILED,
            719,
            "CUDA_ERROR_LAUNCH_FAILED",
        ),
        (
            DriverErrorCode::NOT_PERMITTED,
            800,
            "CUDA_ERROR_NOT_PERMITTED",
        ),
        (
            DriverErrorCode::NOT_SUPPORTED,
            801,
            "CUDA_ERROR_NOT_SUPPORTED",
        ),
        (DriverErrorCode::UNKNOWN, 999, "CUDA_ERROR_UNKNOWN"),
    ];
    for (code, raw, name) in codes {
        assert_eq!(code.raw(), raw, "{name}");
        assert_eq!(code.name(), name);
        assert_eq!(code.to_string(), name);
        assert_eq!(DriverErrorCode::from(code.as_cudarc()), code);
    }
    assert_eq!(
        DriverErrorCode::from(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
        DriverErrorCode::ILLEGAL_ADDRESS
    );
    assert_ne!(DriverErrorCode::ASSERT, DriverErrorCode::ILLEGAL_ADDRESS);
    assert_eq!(
        format!("{:?}", DriverErrorCode::ILLEGAL_ADDRESS),
        "DriverErrorCode(CUDA_ERROR_ILLEGAL_ADDRESS = 700)"
    );

    // The error's message is unchanged: call, name, description.
    let e = Error::Driver {
        call: "cuMemAlloc_v2",
        code: DriverErrorCode::OUT_OF_MEMORY,
        name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        description: "out of memory".into(),
    };
    assert_eq!(
        e.to_string(),
        "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
    );
    assert_eq!(e.driver_code(), Some(DriverErrorCode::OUT_OF_MEMORY));
    assert_eq!(Error::NoDriver.driver_code(), None);
    // Built from cudarc's code of a direct driver call; the name even without a driver.
    let e = Error::driver("cuMemAlloc_v2", CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert!(
        matches!(&e, Error::Driver { code, name, .. }
            if *code == DriverErrorCode::OUT_OF_MEMORY && name == "CUDA_ERROR_OUT_OF_MEMORY"),
        "{e:?}"
    );
}

/// Device attributes are gpubind's own enum; each maps to the cudarc value of its name.
#[test]
fn device_attributes_map_to_the_driver_names() {
    use gpubind::cudarc::driver::sys::CUdevice_attribute as Raw;
    assert_eq!(
        Raw::from(DeviceAttribute::MaxThreadsPerBlock),
        Raw::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK
    );
    assert_eq!(
        DeviceAttribute::ComputeCapabilityMajor.to_string(),
        "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"
    );
    let mut names = std::collections::HashSet::new();
    for &a in DeviceAttribute::ALL {
        // cudarc's Debug is the C name: the mapping and `name` agree for every attribute.
        assert_eq!(a.name(), format!("{:?}", Raw::from(a)));
        assert_eq!(a.to_string(), a.name());
        assert!(names.insert(a.name()), "{a:?} listed twice");
    }
    assert_eq!(names.len(), 55);
}

#[test]
fn feature_disabled_names_the_feature() {
    let e = Error::FeatureDisabled {
        feature: "nccl",
        what: "the NCCL backend",
    };
    assert_eq!(
        e.to_string(),
        "the NCCL backend needs gpubind's `nccl` feature, which this build leaves out \
         (enable it: gpubind = { features = [\"nccl\"] })"
    );
}

/// Collectives without the `nccl` feature: the NCCL backend is a typed error at run time.
#[cfg(all(feature = "collective", not(feature = "nccl")))]
#[test]
fn nccl_backend_without_its_feature_is_a_typed_error() {
    assert!(!gpubind::collective::nccl_available());
    let e = gpubind::collective::nccl_version().unwrap_err();
    assert!(
        matches!(
            e,
            Error::FeatureDisabled {
                feature: "nccl",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn no_driver_is_a_typed_error_not_a_panic() {
    if gpubind::driver_available() {
        println!("a CUDA driver is present: nothing to check here");
        return;
    }
    assert_eq!(Device::count().unwrap_err(), Error::NoDriver);
    assert_eq!(Device::get(0).unwrap_err(), Error::NoDriver);
    assert_eq!(Device::all().unwrap_err(), Error::NoDriver);
    assert_eq!(gpubind::init().unwrap_err(), Error::NoDriver);
}

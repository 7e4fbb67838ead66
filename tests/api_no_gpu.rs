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
assert_impl_all!(Error: Send, Sync, Clone, std::error::Error);

// Every public type is `Debug` (handles print their device and identity, never memory
// contents or raw pointers' targets). `#![warn(missing_debug_implementations)]` in lib.rs
// catches a new type in the library; this list fails the test build if one regresses.
assert_impl_all!(ThreadContext: Debug);
assert_impl_all!(BoundDevice<'static>: Debug);
assert_impl_all!(BoundStream<'static>: Debug);
assert_impl_all!(Device: Debug);
assert_impl_all!(DeviceAttribute: Debug);
assert_impl_all!(Uuid: Debug);
assert_impl_all!(gpubind::DriverVersion: Debug, Send, Sync, Copy, Ord, std::fmt::Display);
assert_impl_all!(gpubind::compat::EntryPointStatus: Debug, Send, Sync, Clone);
assert_impl_all!(Error: Debug);
assert_impl_all!(Stream: Debug);
assert_impl_all!(Event: Debug);
assert_impl_all!(Module: Debug);
assert_impl_all!(Function<'static>: Debug);
assert_impl_all!(LaunchBuilder<'static, 'static>: Debug);
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
assert_impl_all!(gpubind::blas::Blas: Debug);
assert_impl_all!(gpubind::blas::Matmul: Debug);
assert_impl_all!(Backend: Debug);
assert_impl_all!(CommOptions: Debug);
assert_impl_all!(Communicator: Debug);
assert_impl_all!(Group<'static, 'static>: Debug);
assert_impl_all!(Op: Debug);
assert_impl_all!(RankComm: Debug);
assert_impl_all!(Transport: Debug);
assert_impl_all!(ExportedTensor: Debug);
assert_impl_all!(ImportedTensor<f32>: Debug);
assert_impl_all!(gpubind::dlpack::DLPackVersion: Debug);
assert_impl_all!(gpubind::dlpack::DLDeviceType: Debug);
assert_impl_all!(gpubind::dlpack::DLDevice: Debug);
assert_impl_all!(gpubind::dlpack::DLDataType: Debug);
assert_impl_all!(gpubind::dlpack::DLTensor: Debug);
assert_impl_all!(gpubind::dlpack::DLManagedTensor: Debug);
assert_impl_all!(gpubind::dlpack::DLManagedTensorVersioned: Debug);
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

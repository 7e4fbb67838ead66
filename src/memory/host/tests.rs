//! Unit tests of page-locked host memory that need no GPU: a poisoned, unopened device
//! refuses every driver call, so each test fails before reaching the driver.

use super::{LockedRange, PageLockedView, RegisterOptions};
use crate::access::{AccessTracker, StreamRef};
use crate::context::BoundDevice;
use crate::copy::MemoryKind;
use crate::device::Device;
use crate::error::Error;
use cudarc::driver::sys::CUresult;
use std::ptr::NonNull;
use std::sync::Arc;

fn poisoned_device() -> Arc<Device> {
    let device = Arc::new(Device::unopened_for_test(0));
    device.poison_with("cuTestCall", CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    device
}

/// A range over `data` (not page-locked: nothing here reaches the driver) whose tracker
/// holds one pending write on the poisoned device's legacy stream when `pending`.
fn range_over(data: &mut [u32], device: &Arc<Device>, pending: bool) -> LockedRange<u32> {
    LockedRange {
        device: Arc::clone(device),
        ptr: NonNull::from(&mut *data).cast(),
        len: data.len(),
        dptr: 0,
        portable: false,
        kind: MemoryKind::Pinned,
        tracker: if pending {
            AccessTracker::written_on(StreamRef::Legacy(Arc::clone(device)))
        } else {
            AccessTracker::default()
        },
    }
}

#[test]
fn a_failed_registration_gives_the_vec_back() {
    let gpu = BoundDevice::without_context_for_test(poisoned_device());
    let mut data = Vec::with_capacity(40);
    data.extend(0..32u32);
    let (addr, cap) = (data.as_ptr(), data.capacity());
    let failed = gpu
        .register_vec(data, RegisterOptions::default())
        .expect_err("a poisoned device registers nothing");
    assert!(
        matches!(failed.error, Error::ContextPoisoned { .. }),
        "{}",
        failed.error
    );
    let data = failed.input;
    assert_eq!(
        (data.as_ptr(), data.len(), data.capacity()),
        (addr, 32, cap)
    );
    assert_eq!(data, (0..32).collect::<Vec<u32>>());
    // An empty Vec comes back too.
    let failed = gpu
        .register_vec(Vec::<u64>::with_capacity(8), RegisterOptions::default())
        .expect_err("refused");
    assert_eq!((failed.input.len(), failed.input.capacity()), (0, 8));
}

#[test]
fn try_as_slice_returns_the_failed_wait_and_forgets_nothing() {
    let device = poisoned_device();
    let mut data: Vec<u32> = (0..8).collect();
    let mut range = range_over(&mut data, &device, true);
    for _ in 0..2 {
        // The pending write stays: each read waits (and fails) again.
        assert!(matches!(
            range.try_as_slice(),
            Err(Error::ContextPoisoned { .. })
        ));
        assert!(matches!(
            range.try_as_mut_slice(),
            Err(Error::ContextPoisoned { .. })
        ));
    }
    let view = PageLockedView {
        range: &range,
        start: 2,
        len: 3,
    };
    assert!(matches!(
        view.try_as_slice(),
        Err(Error::ContextPoisoned { .. })
    ));
    // The aborting path hands the memory out on a poisoned context (no work runs).
    assert_eq!(range.as_slice(), [0, 1, 2, 3, 4, 5, 6, 7]);
}

#[test]
fn try_as_slice_with_nothing_pending_reads_the_contents() {
    let device = poisoned_device();
    let mut data: Vec<u32> = (0..8).collect();
    let mut range = range_over(&mut data, &device, false);
    range.try_as_mut_slice().expect("nothing pending")[0] = 42;
    assert_eq!(range.try_as_slice().expect("nothing pending")[..2], [42, 1]);
    let view = PageLockedView {
        range: &range,
        start: 6,
        len: 2,
    };
    assert_eq!(view.try_as_slice().expect("nothing pending"), [6, 7]);
}

/// `into_vec` on a poisoned context (which runs no more work) gives the `Vec` back with
/// its contents, although the wait for its pending write fails.
#[test]
fn into_vec_on_a_poisoned_context_gives_the_vec_back() {
    let device = poisoned_device();
    let mut data = std::mem::ManuallyDrop::new((0..16u32).collect::<Vec<_>>());
    let (ptr, cap) = (data.as_mut_ptr(), data.capacity());
    let reg = super::RegisteredHost::<'static, u32> {
        range: range_over(
            // SAFETY: the Vec's 16 elements, owned by `reg` from here (ManuallyDrop).
            unsafe { std::slice::from_raw_parts_mut(ptr, 16) },
            &device,
            true,
        ),
        owned_capacity: Some(cap),
        _borrow: std::marker::PhantomData,
    };
    let v = reg
        .into_vec()
        .expect("a poisoned context hands the memory back")
        .expect("an owned Vec");
    assert_eq!((v.as_ptr(), v.capacity()), (ptr as *const u32, cap));
    assert_eq!(v, (0..16).collect::<Vec<u32>>());
}

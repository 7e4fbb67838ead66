//! Non-GPU checks of by-value kernel arguments: one `unsafe impl DeviceRepr` makes a
//! `#[repr(C)]` struct a [`KernelArg`] whose bytes are the struct's own.

use gpubind::{DeviceRepr, DeviceSlice, KernelArg, WritableArg};
use static_assertions::{assert_impl_all, assert_not_impl_any};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
struct Params {
    scale: f32,
    shift: f32,
    n: u32,
    flags: u32,
    origin: [f64; 2],
}
// SAFETY: repr(C); 4 + 4 + 4 + 4 + 16 bytes with no padding (the f64s start at offset
// 16); every bit pattern is a valid value; no owned resources.
unsafe impl DeviceRepr for Params {}

// Plain data is passed the same by `&` and `&mut`.
assert_impl_all!(Params: KernelArg, WritableArg);
assert_impl_all!([Params; 3]: KernelArg, DeviceRepr);
assert_impl_all!(u32: KernelArg);
assert_impl_all!(half::bf16: KernelArg);
// Buffers stay address arguments (claimed by the launch), never plain data.
assert_impl_all!(DeviceSlice<Params>: KernelArg);
assert_not_impl_any!(DeviceSlice<f32>: DeviceRepr, Copy);
assert_not_impl_any!(bool: KernelArg);

/// The bytes a launch hands the driver for `arg`.
fn param_bytes<A: KernelArg + ?Sized>(arg: &A) -> Vec<u8> {
    // SAFETY: the KernelArg contract: `param_ptr` points to `param_size` readable bytes
    // while `arg` is borrowed.
    unsafe { std::slice::from_raw_parts(arg.param_ptr() as *const u8, arg.param_size()) }.to_vec()
}

#[test]
fn a_device_repr_struct_is_passed_as_its_own_bytes() {
    let p = Params {
        scale: 2.5,
        shift: -1.0,
        n: 1000,
        flags: 0xdead_beef,
        origin: [0.25, -8.0],
    };
    assert_eq!(p.param_size(), 32);
    assert_eq!(p.param_size(), std::mem::size_of::<Params>());
    assert_eq!(p.param_ptr() as *const Params, &p as *const Params);
    let mut expected = Vec::new();
    expected.extend_from_slice(&2.5f32.to_ne_bytes());
    expected.extend_from_slice(&(-1.0f32).to_ne_bytes());
    expected.extend_from_slice(&1000u32.to_ne_bytes());
    expected.extend_from_slice(&0xdead_beefu32.to_ne_bytes());
    expected.extend_from_slice(&0.25f64.to_ne_bytes());
    expected.extend_from_slice(&(-8.0f64).to_ne_bytes());
    assert_eq!(param_bytes(&p), expected);
    assert!(p.arg_device().is_none(), "plain data has no device");
    assert!(
        p.describe().ends_with("Params"),
        "described as {:?}",
        p.describe()
    );
}

#[test]
fn scalars_and_arrays_keep_their_sizes() {
    assert_eq!(param_bytes(&7u8), [7]);
    assert_eq!(param_bytes(&0x0102_0304u32), 0x0102_0304u32.to_ne_bytes());
    assert_eq!(param_bytes(&-3i64), (-3i64).to_ne_bytes());
    assert_eq!(param_bytes(&half::f16::ONE), half::f16::ONE.to_ne_bytes());
    assert_eq!(param_bytes(&[1u16, 2, 3]).len(), 6);
    assert_eq!(42u32.describe(), "u32");
}

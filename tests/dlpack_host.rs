//! DLPack tests that need no GPU: struct layouts against dlpack.h (x86-64 values), host
//! export/import round trips, and imports of hand-built tensors with a counting deleter.

use gpubind::dlpack::{
    self, DLDataType, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPACK_FLAG_BITMASK_READ_ONLY, DLPackVersion, DLTensor, ImportedTensor, type_code,
};
use gpubind::{CopyDest, Error, MemoryKind};
use proptest::prelude::*;
use std::ffi::c_void;
use std::mem::{align_of, offset_of, size_of};
use std::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn layouts_match_dlpack_h() {
    // typedef struct { uint32_t major; uint32_t minor; } DLPackVersion;
    assert_eq!(
        (size_of::<DLPackVersion>(), align_of::<DLPackVersion>()),
        (8, 4)
    );
    assert_eq!(offset_of!(DLPackVersion, major), 0);
    assert_eq!(offset_of!(DLPackVersion, minor), 4);
    // DLDeviceType is a C enum (int32_t).
    assert_eq!(
        (size_of::<DLDeviceType>(), align_of::<DLDeviceType>()),
        (4, 4)
    );
    // typedef struct { DLDeviceType device_type; int32_t device_id; } DLDevice;
    assert_eq!((size_of::<DLDevice>(), align_of::<DLDevice>()), (8, 4));
    assert_eq!(offset_of!(DLDevice, device_type), 0);
    assert_eq!(offset_of!(DLDevice, device_id), 4);
    // typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
    assert_eq!((size_of::<DLDataType>(), align_of::<DLDataType>()), (4, 2));
    assert_eq!(offset_of!(DLDataType, code), 0);
    assert_eq!(offset_of!(DLDataType, bits), 1);
    assert_eq!(offset_of!(DLDataType, lanes), 2);
    // DLTensor: data, device, ndim, dtype, shape, strides, byte_offset.
    assert_eq!((size_of::<DLTensor>(), align_of::<DLTensor>()), (48, 8));
    assert_eq!(offset_of!(DLTensor, data), 0);
    assert_eq!(offset_of!(DLTensor, device), 8);
    assert_eq!(offset_of!(DLTensor, ndim), 16);
    assert_eq!(offset_of!(DLTensor, dtype), 20);
    assert_eq!(offset_of!(DLTensor, shape), 24);
    assert_eq!(offset_of!(DLTensor, strides), 32);
    assert_eq!(offset_of!(DLTensor, byte_offset), 40);
    // DLManagedTensor: dl_tensor, manager_ctx, deleter.
    assert_eq!(
        (size_of::<DLManagedTensor>(), align_of::<DLManagedTensor>()),
        (64, 8)
    );
    assert_eq!(offset_of!(DLManagedTensor, dl_tensor), 0);
    assert_eq!(offset_of!(DLManagedTensor, manager_ctx), 48);
    assert_eq!(offset_of!(DLManagedTensor, deleter), 56);
    // DLManagedTensorVersioned: version, manager_ctx, deleter, flags, dl_tensor.
    assert_eq!(
        (
            size_of::<DLManagedTensorVersioned>(),
            align_of::<DLManagedTensorVersioned>()
        ),
        (80, 8)
    );
    assert_eq!(offset_of!(DLManagedTensorVersioned, version), 0);
    assert_eq!(offset_of!(DLManagedTensorVersioned, manager_ctx), 8);
    assert_eq!(offset_of!(DLManagedTensorVersioned, deleter), 16);
    assert_eq!(offset_of!(DLManagedTensorVersioned, flags), 24);
    assert_eq!(offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
    // A nullable function pointer is one pointer wide.
    assert_eq!(
        size_of::<Option<unsafe extern "C" fn(*mut DLManagedTensor)>>(),
        8
    );
}

#[test]
fn enum_values_match_dlpack_h() {
    assert_eq!(DLDeviceType::CPU.0, 1);
    assert_eq!(DLDeviceType::CUDA.0, 2);
    assert_eq!(DLDeviceType::CUDA_HOST.0, 3);
    assert_eq!(DLDeviceType::ROCM.0, 10);
    assert_eq!(DLDeviceType::CUDA_MANAGED.0, 13);
    assert_eq!(DLDeviceType::MAIA.0, 17);
    assert_eq!(
        (type_code::INT, type_code::UINT, type_code::FLOAT),
        (0, 1, 2)
    );
    assert_eq!(
        (type_code::BFLOAT, type_code::COMPLEX, type_code::BOOL),
        (4, 5, 6)
    );
    assert_eq!(DLPACK_FLAG_BITMASK_READ_ONLY, 1);
    assert_eq!(dlpack::DLPACK_FLAG_BITMASK_IS_COPIED, 2);
    assert_eq!(dlpack::DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, 4);
    assert_eq!(
        (dlpack::DLPACK_MAJOR_VERSION, dlpack::DLPACK_MINOR_VERSION),
        (1, 3)
    );
    use gpubind::dlpack::DlpackDtype;
    assert_eq!(
        f32::DTYPE,
        DLDataType {
            code: 2,
            bits: 32,
            lanes: 1
        }
    );
    assert_eq!(
        i64::DTYPE,
        DLDataType {
            code: 0,
            bits: 64,
            lanes: 1
        }
    );
    assert_eq!(
        u8::DTYPE,
        DLDataType {
            code: 1,
            bits: 8,
            lanes: 1
        }
    );
    assert_eq!(
        half::bf16::DTYPE,
        DLDataType {
            code: 4,
            bits: 16,
            lanes: 1
        }
    );
    assert_eq!(
        half::f16::DTYPE,
        DLDataType {
            code: 2,
            bits: 16,
            lanes: 1
        }
    );
}

#[test]
fn export_vec_fills_every_field() {
    let data: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let base = data.as_ptr();
    let t = dlpack::export(data, &[2, 3, 4]).unwrap();
    let m = t.managed();
    assert_eq!(m.version, DLPackVersion { major: 1, minor: 3 });
    assert_eq!(m.flags, 0);
    assert!(!m.manager_ctx.is_null());
    assert!(m.deleter.is_some());
    let dl = t.tensor();
    assert_eq!(
        dl.data as *const f32, base,
        "the Vec's buffer is exported, not copied"
    );
    assert_eq!(
        dl.device,
        DLDevice {
            device_type: DLDeviceType::CPU,
            device_id: 0
        }
    );
    assert_eq!(dl.ndim, 3);
    assert_eq!(
        dl.dtype,
        DLDataType {
            code: 2,
            bits: 32,
            lanes: 1
        }
    );
    assert_eq!(dl.byte_offset, 0);
    // SAFETY: the exported tensor is alive; shape/strides hold ndim values.
    let (shape, strides) = unsafe {
        (
            std::slice::from_raw_parts(dl.shape, 3),
            std::slice::from_raw_parts(dl.strides, 3),
        )
    };
    assert_eq!(shape, [2, 3, 4]);
    assert_eq!(strides, [12, 4, 1]);
}

#[test]
fn export_rejects_bad_shapes() {
    let failed = dlpack::export(vec![0u8; 6], &[4, 2]).unwrap_err();
    assert!(matches!(
        failed.error,
        Error::SizeMismatch {
            expected: 6,
            found: 8,
            ..
        }
    ));
    let failed = dlpack::export(vec![0u8; 6], &[-1, -6]).unwrap_err();
    assert!(matches!(failed.error, Error::InvalidArgument(_)));
    let failed = dlpack::export_legacy(vec![0u8; 6], &[7]).unwrap_err();
    assert!(matches!(failed.error, Error::SizeMismatch { .. }));
    // Scalars (ndim 0) have one element.
    assert!(dlpack::export(vec![7i32], &[]).is_ok());
    assert!(dlpack::export(Vec::<i32>::new(), &[0, 5]).is_ok());
}

/// A refused export gives the caller's buffer back unchanged (same allocation, contents
/// and capacity), and it exports once the shape is right.
#[test]
fn a_refused_export_gives_the_buffer_back() {
    let mut data = Vec::with_capacity(32);
    data.extend(0..24i32);
    let (addr, cap) = (data.as_ptr(), data.capacity());
    let failed = dlpack::export(data, &[5, 5]).unwrap_err();
    assert!(failed.to_string().contains("the input is given back"));
    let (data, error) = failed.into_parts();
    assert!(matches!(error, Error::SizeMismatch { .. }), "{error}");
    assert_eq!((data.as_ptr(), data.capacity()), (addr, cap));
    assert_eq!(data, (0..24).collect::<Vec<i32>>());
    let t = dlpack::export(data, &[2, 3, 4]).unwrap();
    assert_eq!(t.tensor().data as *const i32, addr);
    // `?` gives the error alone, in a function returning gpubind::Result.
    let via_question_mark = || -> gpubind::Result<()> {
        dlpack::export(vec![0u8; 3], &[2])?;
        Ok(())
    };
    assert!(matches!(
        via_question_mark(),
        Err(Error::SizeMismatch { .. })
    ));
}

#[test]
fn versioned_export_import_round_trip() {
    let data: Vec<i32> = (0..60).map(|i| i * 7 - 3).collect();
    let raw = dlpack::export(data.clone(), &[3, 4, 5]).unwrap().into_raw();
    // SAFETY: `raw` is a live exported tensor we own and hand over.
    let imported = unsafe { ImportedTensor::<i32>::from_raw_cpu(raw) }.unwrap();
    assert_eq!(imported.shape(), [3, 4, 5]);
    assert_eq!(imported.kind(), MemoryKind::Pageable);
    assert_eq!(imported.as_slice().unwrap(), &data[..]);
    drop(imported); // runs our own deleter, which frees the Vec
}

#[test]
fn legacy_export_import_round_trip() {
    let data: Vec<u16> = (0..10).collect();
    let raw = dlpack::export_legacy(data.clone(), &[10])
        .unwrap()
        .into_raw();
    // SAFETY: as above, legacy struct.
    let imported = unsafe { ImportedTensor::<u16, DLManagedTensor>::from_raw_cpu(raw) }.unwrap();
    assert_eq!(imported.as_slice().unwrap(), &data[..]);
}

/// A hand-built foreign tensor whose deleter counts its calls.
struct Fake {
    managed: DLManagedTensorVersioned,
    _data: Vec<u8>,
    shape: Vec<i64>,
    strides: Vec<i64>,
    calls: &'static AtomicUsize,
}

unsafe extern "C" fn fake_deleter(p: *mut DLManagedTensorVersioned) {
    // SAFETY: `p` is the managed field of a leaked Box<Fake>, whose pointer is manager_ctx.
    let fake = unsafe { Box::from_raw((*p).manager_ctx.cast::<Fake>()) };
    fake.calls.fetch_add(1, Ordering::SeqCst);
}

/// Builds a foreign tensor over `data` (bytes) described as `dtype`, `shape`, `strides`.
fn fake(
    data: Vec<u8>,
    dtype: DLDataType,
    shape: &[i64],
    strides: Option<&[i64]>,
    device: DLDevice,
    calls: &'static AtomicUsize,
) -> *mut DLManagedTensorVersioned {
    let mut f = Box::new(Fake {
        managed: DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 1 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(fake_deleter),
            flags: 0,
            dl_tensor: DLTensor {
                data: std::ptr::null_mut(),
                device,
                ndim: shape.len() as i32,
                dtype,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        _data: data,
        shape: shape.to_vec(),
        strides: strides.map(|s| s.to_vec()).unwrap_or_default(),
        calls,
    });
    f.managed.dl_tensor.data = f._data.as_mut_ptr().cast::<c_void>();
    f.managed.dl_tensor.shape = f.shape.as_mut_ptr();
    if strides.is_some() {
        f.managed.dl_tensor.strides = f.strides.as_mut_ptr();
    }
    let p = Box::into_raw(f);
    // SAFETY: `p` is the live box just leaked.
    unsafe {
        (*p).managed.manager_ctx = p.cast();
        std::ptr::addr_of_mut!((*p).managed)
    }
}

const CPU: DLDevice = DLDevice {
    device_type: DLDeviceType::CPU,
    device_id: 0,
};
const F32: DLDataType = DLDataType {
    code: 2,
    bits: 32,
    lanes: 1,
};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

#[test]
fn import_calls_the_deleter_once_on_drop() {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let values = [1.5f32, -2.0, 3.25, 4.0, 5.0, 6.5];
    let p = fake(f32_bytes(&values), F32, &[2, 3], Some(&[3, 1]), CPU, &CALLS);
    // SAFETY: `p` is a live tensor we own and hand over.
    let t = unsafe { ImportedTensor::<f32>::from_raw_cpu(p) }.unwrap();
    assert_eq!(t.as_slice().unwrap(), values);
    assert_eq!(
        CALLS.load(Ordering::SeqCst),
        0,
        "not deleted while imported"
    );
    drop(t);
    assert_eq!(CALLS.load(Ordering::SeqCst), 1);
}

#[test]
fn failed_imports_call_the_deleter_once_and_say_why() {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let data = f32_bytes(&[0.0; 6]);
    let cases: Vec<(*mut DLManagedTensorVersioned, &str)> = vec![
        // wrong dtype for f32
        (
            fake(
                data.clone(),
                DLDataType {
                    code: 0,
                    bits: 32,
                    lanes: 1,
                },
                &[6],
                None,
                CPU,
                &CALLS,
            ),
            "dtype",
        ),
        // transposed (non-contiguous) strides
        (
            fake(data.clone(), F32, &[2, 3], Some(&[1, 2]), CPU, &CALLS),
            "layout",
        ),
        // device memory where host memory was asked for
        (
            fake(
                data.clone(),
                F32,
                &[6],
                None,
                DLDevice {
                    device_type: DLDeviceType::CUDA,
                    device_id: 0,
                },
                &CALLS,
            ),
            "device",
        ),
    ];
    for (i, (p, what)) in cases.into_iter().enumerate() {
        // SAFETY: each `p` is a live tensor we own and hand over.
        let err = unsafe { ImportedTensor::<f32>::from_raw_cpu(p) }.unwrap_err();
        match err {
            Error::DlpackMismatch { what: w, .. } => assert_eq!(w, what, "case {i}"),
            other => panic!("case {i}: unexpected {other}"),
        }
        assert_eq!(
            CALLS.load(Ordering::SeqCst),
            i + 1,
            "deleter once per failure"
        );
    }
    // More bytes than any allocation holds (the element count fits usize; the bytes do
    // not fit isize), and a range that wraps the address space: refused before a slice
    // or a copy is sized by them.
    let p = fake(data.clone(), F32, &[1 << 62], None, CPU, &CALLS);
    // SAFETY: handed over; nothing past the error reads the data.
    let err = unsafe { ImportedTensor::<f32>::from_raw_cpu(p) }.unwrap_err();
    assert!(
        matches!(err, Error::DlpackMismatch { what: "layout", .. }),
        "{err}"
    );
    let p = fake(data.clone(), F32, &[6], None, CPU, &CALLS);
    // SAFETY: `p` is live and ours; the offset makes the range end past u64::MAX.
    unsafe { (*p).dl_tensor.byte_offset = u64::MAX - 7 - (*p).dl_tensor.data as u64 };
    // SAFETY: handed over; nothing past the error reads the data.
    let err = unsafe { ImportedTensor::<f32>::from_raw_cpu(p) }.unwrap_err();
    assert!(
        matches!(err, Error::DlpackMismatch { what: "layout", .. }),
        "{err}"
    );
    assert_eq!(CALLS.load(Ordering::SeqCst), 5);
    // A major version we do not know: only the deleter may be touched.
    let p = fake(data, F32, &[6], None, CPU, &CALLS);
    // SAFETY: `p` is live and ours.
    unsafe { (*p).version.major = 2 };
    // SAFETY: handed over.
    let err = unsafe { ImportedTensor::<f32>::from_raw_cpu(p) }.unwrap_err();
    assert!(
        matches!(
            err,
            Error::DlpackMismatch {
                what: "version",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(CALLS.load(Ordering::SeqCst), 6);
    // Null is an error, not a crash.
    // SAFETY: null is allowed by the contract.
    let null = unsafe { ImportedTensor::<f32>::from_raw_cpu(std::ptr::null_mut()) };
    assert!(matches!(null, Err(Error::InvalidArgument(_))));
}

#[test]
fn import_accepts_unit_strides_offsets_and_honours_read_only() {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let values: Vec<f32> = (0..8).map(|i| i as f32 * 0.5).collect();
    // Shape [1, 6] with a junk stride on the unit dimension, and byte_offset 8 (skip 2).
    let p = fake(
        f32_bytes(&values),
        F32,
        &[1, 6],
        Some(&[999, 1]),
        CPU,
        &CALLS,
    );
    // SAFETY: `p` is live and ours.
    unsafe {
        (*p).dl_tensor.byte_offset = 8;
        (*p).flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    }
    // SAFETY: handed over.
    let mut t = unsafe { ImportedTensor::<f32>::from_raw_cpu(p) }.unwrap();
    assert_eq!(t.as_slice().unwrap(), &values[2..8]);
    assert!(t.is_read_only());
    assert!(t.as_mut_slice().is_none());
    assert!(matches!(t.dest(), Err(Error::ReadOnly { .. })));
    drop(t);
    assert_eq!(CALLS.load(Ordering::SeqCst), 1);
}

#[test]
fn writable_import_is_mutable() {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let p = fake(f32_bytes(&[1.0; 4]), F32, &[4], None, CPU, &CALLS);
    // SAFETY: handed over.
    let mut t = unsafe { ImportedTensor::<f32>::from_raw_cpu(p) }.unwrap();
    t.as_mut_slice().unwrap()[2] = 9.0;
    assert_eq!(t.as_slice().unwrap(), [1.0, 1.0, 9.0, 1.0]);
    assert!(t.dest().is_ok());
}

proptest! {
    #[test]
    fn export_import_round_trips_any_shape(
        shape in proptest::collection::vec(0i64..5, 0..5),
        seed in any::<u64>(),
    ) {
        let n: i64 = shape.iter().product();
        let data: Vec<u64> = (0..n as u64).map(|i| i.wrapping_mul(seed | 1)).collect();
        let exported = dlpack::export(data.clone(), &shape).unwrap();
        let dl = exported.tensor();
        if !shape.is_empty() {
            // SAFETY: the exported tensor is alive; strides hold ndim values.
            let strides = unsafe { std::slice::from_raw_parts(dl.strides, shape.len()) };
            // Compact row-major: the last stride is 1, each other is the product of later extents.
            for i in 0..shape.len() {
                let later: i64 = shape[i + 1..].iter().map(|&d| d.max(1)).product();
                prop_assert_eq!(strides[i], later);
            }
        }
        prop_assert_eq!(dl.data.is_null(), n == 0);
        let raw = exported.into_raw();
        // SAFETY: handed over.
        let imported = unsafe { ImportedTensor::<u64>::from_raw_cpu(raw) }.unwrap();
        prop_assert_eq!(imported.shape(), &shape[..]);
        prop_assert_eq!(imported.as_slice().unwrap(), &data[..]);
    }
}

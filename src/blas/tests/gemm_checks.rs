//! The checks every GEMM passes before cuBLAS is called (`plan::check_gemm`, shared by
//! the eager and the captured products), on devices and allocations that call no driver.

use crate::access::AccessTracker;
use crate::blas::plan::{Gemm, Operand, Plan, check_devices, check_gemm};
use crate::blas::types::DataType;
use crate::blas::{Batch, Matmul, MatmulError};
use crate::device::Device;
use crate::error::Error;
use crate::memory::ByteSpan;

/// Devices 0 (bound) and 1, and three allocations on device 0.
struct Fixture {
    dev: [Device; 2],
    alloc: [AccessTracker; 3],
}

fn fixture() -> Fixture {
    Fixture {
        dev: [Device::unopened_for_test(0), Device::unopened_for_test(1)],
        alloc: Default::default(),
    }
}

/// `len` f32 elements at byte `addr` of allocation `alloc` on `device`.
fn f32s<'a>(device: &'a Device, alloc: &'a AccessTracker, addr: u64, len: usize) -> Operand<'a> {
    Operand {
        tracker: alloc,
        device,
        len,
        span: ByteSpan::new(alloc, addr, 4 * len as u64),
    }
}

fn f32_gemm<'a>(shape: &'a Matmul, batch: Option<&'a Batch>) -> Gemm<'a> {
    Gemm {
        shape,
        batch,
        dtypes: [DataType::F32; 2],
    }
}

impl Fixture {
    /// A (2×3), B (3×2) and C (2×2), f32, each in its own allocation on device 0.
    fn matrices(&self) -> [Operand<'_>; 3] {
        let d = &self.dev[0];
        [
            f32s(d, &self.alloc[0], 0, 6),
            f32s(d, &self.alloc[1], 0, 6),
            f32s(d, &self.alloc[2], 0, 4),
        ]
    }

    /// Checks a 2×2×3 f32 product of `ops` with `scales` on device 0, handle on 0.
    fn check(&self, ops: [Operand<'_>; 3], scales: Option<Operand<'_>>) -> crate::Result<Plan> {
        let shape = Matmul::new(2, 2, 3);
        let d = &self.dev[0];
        check_gemm(d, d, f32_gemm(&shape, None), ops, scales)
    }
}

fn matmul_error(r: crate::Result<Plan>) -> MatmulError {
    match r {
        Err(Error::Matmul(e)) => e,
        other => panic!("expected Error::Matmul, got {other:?}"),
    }
}

/// The refusal is `WrongDevice` naming `what`, device 1 found while 0 is bound.
fn assert_wrong_device(r: crate::Result<Plan>, what: &str) {
    match r {
        Err(e @ Error::WrongDevice { .. }) => {
            let Error::WrongDevice {
                what: w,
                bound,
                found,
            } = &e
            else {
                unreachable!()
            };
            assert_eq!((*w, *bound, *found), (what, 0, 1));
            assert_eq!(
                e.to_string(),
                format!("wrong device: {what} lives on device 1, but device 0 is bound")
            );
        }
        other => panic!("expected WrongDevice for {what}, got {other:?}"),
    }
}

#[test]
fn a_fitting_product_is_planned_as_plan_does() {
    let f = fixture();
    let p = f.check(f.matrices(), None).expect("fits");
    let direct = crate::blas::plan::plan(&Matmul::new(2, 2, 3), DataType::F32, None, [6, 6, 4]);
    assert_eq!(p, direct.expect("fits"));
    assert!(!p.empty);
}

#[test]
fn the_handle_and_each_matrix_must_be_on_the_bound_device() {
    let f = fixture();
    let (d0, d1) = (&f.dev[0], &f.dev[1]);
    let shape = Matmul::new(2, 2, 3);
    let r = check_gemm(d0, d1, f32_gemm(&shape, None), f.matrices(), None);
    assert_wrong_device(r, "cuBLAS handle");
    for (i, what) in ["matrix A", "matrix B", "matrix C"].into_iter().enumerate() {
        let mut ops = f.matrices();
        ops[i].device = d1;
        assert_wrong_device(f.check(ops, None), what);
    }
}

#[test]
fn buffers_that_do_not_fit_the_shape_are_refused() {
    let f = fixture();
    let mut ops = f.matrices();
    ops[0].len = 5;
    let e = matmul_error(f.check(ops, None));
    assert!(
        matches!(
            e,
            MatmulError::BufferSize {
                operand: "A",
                expected: 6,
                found: 5,
                exact: true,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("A (2×3 row-major, ld 3) needs exactly 6"),
        "{e}"
    );
}

#[test]
fn leading_dimensions_below_the_inner_dimension_are_refused() {
    let f = fixture();
    let shape = Matmul::new(2, 2, 3).with_ld(2, 2, 2);
    let d = &f.dev[0];
    let e = matmul_error(check_gemm(d, d, f32_gemm(&shape, None), f.matrices(), None));
    assert_eq!(
        e,
        MatmulError::LeadingDimension {
            operand: "A",
            ld: 2,
            min: 3
        }
    );
    assert!(
        e.to_string()
            .contains("leading dimension of A is 2, at least 3"),
        "{e}"
    );
}

#[test]
fn batches_whose_outputs_overlap_are_refused() {
    let f = fixture();
    let shape = Matmul::new(2, 2, 3);
    let batch = Batch::new(2, 6, 6, 3);
    let d = &f.dev[0];
    let ops = [
        f32s(d, &f.alloc[0], 0, 12),
        f32s(d, &f.alloc[1], 0, 12),
        f32s(d, &f.alloc[2], 0, 7),
    ];
    let e = matmul_error(check_gemm(d, d, f32_gemm(&shape, Some(&batch)), ops, None));
    assert_eq!(
        e,
        MatmulError::BatchOverlap {
            stride: 3,
            matrix: 4
        }
    );
    assert!(
        e.to_string().contains("the batch's outputs would overlap"),
        "{e}"
    );
}

#[test]
fn c_must_not_overlap_a_or_b() {
    let f = fixture();
    for (i, input) in [(0, "A"), (1, "B")] {
        let mut ops = f.matrices();
        // C's 16 bytes start 8 bytes into the input's allocation.
        ops[2].span = ByteSpan::new(&f.alloc[i], 8, 16);
        let e = matmul_error(f.check(ops, None));
        assert_eq!(e, MatmulError::Aliasing { output: "C", input });
        assert!(
            e.to_string().contains(&format!("C overlaps {input}")),
            "{e}"
        );
    }
    // Adjacent bytes of one allocation do not overlap.
    let mut ops = f.matrices();
    ops[2].span = ByteSpan::new(&f.alloc[0], 24, 16);
    f.check(ops, None).expect("C after A in one allocation");
}

#[test]
fn output_types_and_tf32_the_inputs_do_not_take_are_refused() {
    let f = fixture();
    let d = &f.dev[0];
    let shape = Matmul::new(2, 2, 3);
    let f64_into_f32 = Gemm {
        shape: &shape,
        batch: None,
        dtypes: [DataType::F64, DataType::F32],
    };
    let e = matmul_error(check_gemm(d, d, f64_into_f32, f.matrices(), None));
    assert!(
        matches!(&e, MatmulError::Unsupported { what, dtype: "f64" } if what == "f32 output"),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("f32 output is not supported for f64"),
        "{e}"
    );
    let tf32 = Matmul::new(2, 2, 3).allow_tf32();
    let f64s = Gemm {
        shape: &tf32,
        batch: None,
        dtypes: [DataType::F64; 2],
    };
    let e = matmul_error(check_gemm(d, d, f64s, f.matrices(), None));
    assert!(
        matches!(&e, MatmulError::Unsupported { what, dtype: "f64" } if what == "tf32"),
        "{e:?}"
    );
}

#[test]
fn device_scalars_are_two_elements_on_the_device_apart_from_c() {
    let f = fixture();
    let scales = AccessTracker::default();
    let (d0, d1) = (&f.dev[0], &f.dev[1]);
    f.check(f.matrices(), Some(f32s(d0, &scales, 0, 2)))
        .expect("two scalars");
    assert_wrong_device(
        f.check(f.matrices(), Some(f32s(d1, &scales, 0, 2))),
        "alpha and beta",
    );
    let e = matmul_error(f.check(f.matrices(), Some(f32s(d0, &scales, 0, 3))));
    assert_eq!(e, MatmulError::ScalarBuffer { found: 3 });
    assert!(e.to_string().contains("holds 3 elements, exactly 2"), "{e}");
    // The scalars in C's allocation, on C's last element.
    let e = matmul_error(f.check(f.matrices(), Some(f32s(d0, &f.alloc[2], 12, 2))));
    assert_eq!(
        e,
        MatmulError::Aliasing {
            output: "C",
            input: "alpha and beta"
        }
    );
}

#[test]
fn the_matrices_are_checked_before_the_scalars() {
    let f = fixture();
    let mut ops = f.matrices();
    ops[1].len = 7;
    let bad_scales = f32s(&f.dev[1], &f.alloc[0], 0, 5);
    let e = matmul_error(f.check(ops, Some(bad_scales)));
    assert!(
        matches!(e, MatmulError::BufferSize { operand: "B", .. }),
        "{e:?}"
    );
}

#[test]
fn check_devices_names_the_first_buffer_off_the_device() {
    let f = fixture();
    let (d0, d1) = (&f.dev[0], &f.dev[1]);
    check_devices(d0, d0, &[("vector x", d0)]).expect("all on device 0");
    let r = check_devices(
        d0,
        d0,
        &[("matrix A", d0), ("vector x", d1), ("vector y", d1)],
    );
    match r {
        Err(Error::WrongDevice {
            what,
            bound: 0,
            found: 1,
        }) => assert_eq!(what, "vector x"),
        other => panic!("expected WrongDevice for vector x, got {other:?}"),
    }
}

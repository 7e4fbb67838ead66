//! Host-only tests: shape and stride checks, leading-dimension math, the column-major
//! mapping, epilogue operands and the constants passed to cuBLAS and cuBLASLt.

use super::epilogue::{Role, check_operands, check_type, needed_len};
use super::lt::{LtKey, alignment};
use super::plan::{Plan, check_output, plan};
use super::sys;
use super::types::DataType;
use super::{Batch, Epilogue, Layout, Matmul, MatmulError};

fn ok(shape: &Matmul, dtype: DataType, batch: Option<&Batch>, lens: [usize; 3]) -> Plan {
    plan(shape, dtype, batch, lens).unwrap_or_else(|e| panic!("{shape:?}: {e}"))
}

#[test]
fn row_major_swaps_the_operands_for_cublas() {
    let p = ok(&Matmul::new(3, 5, 7), DataType::F32, None, [21, 35, 15]);
    // Cᵀ (5×3) = Bᵀ (5×7) · Aᵀ (7×3) in column-major: cuBLAS's A is our B.
    assert!(p.swapped);
    assert_eq!((p.m, p.n, p.k), (5, 3, 7));
    assert_eq!((p.lda, p.ldb, p.ldc), (5, 7, 5));
    assert_eq!((p.transa, p.transb), (false, false));
    let t = ok(
        &Matmul::new(3, 5, 7).transpose_a(),
        DataType::F32,
        None,
        [21, 35, 15],
    );
    // A stored 7×3 row-major: ld 3; it is cuBLAS's B, transposed.
    assert_eq!((t.transa, t.transb), (false, true));
    assert_eq!((t.lda, t.ldb), (5, 3));
}

#[test]
fn column_major_is_passed_through() {
    let s = Matmul::new(3, 5, 7).col_major().transpose_b();
    let p = ok(&s, DataType::F64, None, [21, 35, 15]);
    assert!(!p.swapped);
    assert_eq!((p.m, p.n, p.k), (3, 5, 7));
    // A 3×7 column-major: ld 3; B stored 5×7: ld 5; C 3×5: ld 3.
    assert_eq!((p.lda, p.ldb, p.ldc), (3, 5, 3));
    assert_eq!((p.transa, p.transb), (false, true));
}

#[test]
fn packed_buffers_must_match_exactly_and_say_so() {
    let e = plan(&Matmul::new(2, 2, 3), DataType::F32, None, [6, 6, 5]).unwrap_err();
    assert_eq!(
        e,
        MatmulError::BufferSize {
            operand: "C",
            shape: "2×2 row-major, ld 2".into(),
            expected: 4,
            found: 5,
            exact: true
        }
    );
    assert_eq!(
        e.to_string(),
        "matmul: C (2×2 row-major, ld 2) needs exactly 4 elements, the buffer has 5"
    );
    let e = plan(&Matmul::new(2, 2, 3), DataType::F32, None, [5, 6, 4]).unwrap_err();
    assert!(matches!(
        e,
        MatmulError::BufferSize {
            operand: "A",
            expected: 6,
            found: 5,
            ..
        }
    ));
}

#[test]
fn leading_dimensions_are_checked_and_set_the_span() {
    // A 4×3 row-major inside rows of 8: at least 3·8 + 3 = 27 elements.
    let s = Matmul::new(4, 2, 3).with_ld(8, 2, 2);
    assert!(plan(&s, DataType::F32, None, [27, 6, 8]).is_ok());
    assert!(plan(&s, DataType::F32, None, [32, 6, 8]).is_ok());
    let e = plan(&s, DataType::F32, None, [26, 6, 8]).unwrap_err();
    assert!(
        matches!(
            e,
            MatmulError::BufferSize {
                operand: "A",
                expected: 27,
                found: 26,
                exact: false,
                ..
            }
        ),
        "{e}"
    );
    // Too small: rows of 3 need ld ≥ 3.
    let e = plan(
        &Matmul::new(4, 2, 3).with_ld(2, 2, 2),
        DataType::F32,
        None,
        [12, 6, 8],
    );
    assert_eq!(
        e.unwrap_err(),
        MatmulError::LeadingDimension {
            operand: "A",
            ld: 2,
            min: 3
        }
    );
    // Column-major: the column length (rows) bounds it.
    let e = plan(
        &Matmul::new(4, 2, 3).col_major().with_ld(4, 3, 3),
        DataType::F32,
        None,
        [12, 6, 8],
    );
    assert_eq!(
        e.unwrap_err(),
        MatmulError::LeadingDimension {
            operand: "C",
            ld: 3,
            min: 4
        }
    );
    // An empty inner dimension still needs ld ≥ 1 (cuBLAS's rule).
    let p = ok(&Matmul::new(3, 4, 0), DataType::F32, None, [0, 0, 12]);
    assert_eq!((p.lda, p.ldb), (4, 1));
}

#[test]
fn batches_reach_the_last_matrix_and_outputs_must_not_overlap() {
    let s = Matmul::new(4, 4, 2);
    let b = Batch::packed(3, &s);
    assert_eq!(b, Batch::new(3, 8, 8, 16));
    let p = ok(&s, DataType::F16, Some(&b), [24, 24, 48]);
    assert_eq!((p.count, p.stride_a, p.stride_b, p.stride_c), (3, 8, 8, 16));
    let e = plan(&s, DataType::F16, Some(&b), [24, 24, 47]).unwrap_err();
    assert!(matches!(
        e,
        MatmulError::BufferSize {
            operand: "C",
            expected: 48,
            exact: true,
            ..
        }
    ));
    // A broadcast (stride 0) B needs one matrix only.
    let bcast = Batch::new(3, 8, 0, 16);
    assert!(plan(&s, DataType::F16, Some(&bcast), [24, 8, 48]).is_ok());
    // Outputs closer than one matrix overlap.
    let e = plan(
        &s,
        DataType::F16,
        Some(&Batch::new(3, 8, 8, 15)),
        [24, 24, 48],
    )
    .unwrap_err();
    assert_eq!(
        e,
        MatmulError::BatchOverlap {
            stride: 15,
            matrix: 16
        }
    );
    assert!(e.to_string().contains("15 elements"));
    // One product in a batch, or an empty batch, cannot overlap.
    assert!(plan(&s, DataType::F16, Some(&Batch::new(1, 0, 0, 0)), [8, 8, 16]).is_ok());
    assert!(ok(&s, DataType::F16, Some(&Batch::new(0, 8, 8, 16)), [0, 0, 0]).empty);
}

#[test]
fn options_the_type_does_not_take_are_refused() {
    let s = Matmul::new(2, 2, 2).allow_tf32();
    assert!(plan(&s, DataType::F32, None, [4, 4, 4]).is_ok());
    let e = plan(&s, DataType::Bf16, None, [4, 4, 4]).unwrap_err();
    assert_eq!(
        e,
        MatmulError::Unsupported {
            what: "tf32".into(),
            dtype: "bf16"
        }
    );
    assert!(check_type(Epilogue::Gelu, DataType::F64).is_err());
    assert!(check_type(Epilogue::Default, DataType::F64).is_ok());
    assert!(check_type(Epilogue::DGeluBGrad, DataType::Bf16).is_ok());
    assert_eq!(
        e.to_string(),
        "matmul: tf32 is not supported for bf16 products"
    );
}

#[test]
fn mixed_outputs_are_f32_of_16_bit_inputs_only() {
    use DataType::*;
    for t in [F16, Bf16, F32, F64] {
        assert_eq!(check_output(t, t), Ok(()), "{t:?}");
    }
    assert_eq!(check_output(Bf16, F32), Ok(()));
    assert_eq!(check_output(F16, F32), Ok(()));
    for (input, output) in [(F32, Bf16), (F32, F64), (F64, F32), (Bf16, F16), (F16, F64)] {
        let e = check_output(input, output).unwrap_err();
        assert_eq!(
            e,
            MatmulError::Unsupported {
                what: format!("{} output", output.name()),
                dtype: input.name(),
            }
        );
    }
    assert_eq!(
        check_output(F64, F32).unwrap_err().to_string(),
        "matmul: f32 output is not supported for f64 products"
    );
}

#[test]
fn dimensions_beyond_cublas_are_refused() {
    let big = 1usize << 31;
    let e = plan(&Matmul::new(1, big, 0), DataType::F32, None, [0, 0, big]).unwrap_err();
    assert!(
        matches!(e, MatmulError::TooLarge { value, .. } if value == big),
        "{e}"
    );
    let e = plan(
        &Matmul::new(usize::MAX, 2, 2),
        DataType::F32,
        None,
        [0, 4, 0],
    )
    .unwrap_err();
    assert!(matches!(e, MatmulError::TooLarge { .. }), "{e}");
}

#[test]
fn aux_leading_dimensions_follow_cublaslt() {
    let s = Matmul::new(5, 13, 7);
    // Row-major C 5×13: rows of 13 padded to 16 (GELU aux) and to 128 bits (ReLU mask).
    assert_eq!((s.gelu_aux_ld(), s.gelu_aux_len()), (16, 80));
    assert_eq!((s.relu_mask_ld(), s.relu_mask_len()), (128, 80));
    let c = Matmul::new(130, 3, 7).col_major();
    assert_eq!((c.gelu_aux_ld(), c.gelu_aux_len()), (136, 408));
    assert_eq!((c.relu_mask_ld(), c.relu_mask_len()), (256, 96));
    assert_eq!(Epilogue::GeluAux.aux_ld(&s), Some(16));
    assert_eq!(Epilogue::DRelu.aux_ld(&s), Some(128));
    assert_eq!(Epilogue::Bias.aux_ld(&s), None);
}

#[test]
fn each_epilogue_uses_at_most_two_operands_and_checks_them() {
    let s = Matmul::new(6, 10, 4);
    let p = ok(&s, DataType::F32, None, [24, 40, 60]);
    for e in Epilogue::ALL {
        let used: Vec<Role> = Role::ALL.into_iter().filter(|&r| e.uses(r)).collect();
        assert!(used.len() <= 2, "{e:?} uses {used:?}");
        let given: Vec<(Role, usize)> = used
            .iter()
            .map(|&r| (r, needed_len(e, r, &s, &p)))
            .collect();
        assert_eq!(check_operands(e, &s, &p, &given), Ok(()), "{e:?}");
        // An addend is optional for every epilogue (its length is checked against C's
        // where C is known, in `LtCall::check`).
        assert!(!e.uses(Role::Addend) && !Role::Addend.writes(), "{e:?}");
        let mut with_addend = given.clone();
        with_addend.push((Role::Addend, 60));
        assert_eq!(
            check_operands(e, &s, &p, &with_addend),
            Ok(()),
            "{e:?} + addend"
        );
        if let Some(&(role, len)) = given.first() {
            // Missing.
            let e2 = check_operands(e, &s, &p, &given[1..]).unwrap_err();
            assert!(
                matches!(e2, MatmulError::EpilogueOperand { missing: true, operand, .. } if operand == role.name()),
                "{e:?}: {e2}"
            );
            // Wrong length.
            let mut wrong = given.clone();
            wrong[0].1 = len + 1;
            let e3 = check_operands(e, &s, &p, &wrong).unwrap_err();
            assert!(
                matches!(e3, MatmulError::BufferSize { found, .. } if found == len + 1),
                "{e3}"
            );
        }
        // Unexpected: a bias gradient where none is written (or a bias where none is read).
        let extra = if e.uses(Role::BiasGrad) {
            Role::Bias
        } else {
            Role::BiasGrad
        };
        let mut more = given.clone();
        more.push((extra, 10));
        let e4 = check_operands(e, &s, &p, &more).unwrap_err();
        assert!(
            matches!(e4, MatmulError::EpilogueOperand { missing: false, .. }),
            "{e:?}: {e4}"
        );
    }
}

#[test]
fn bias_lengths_follow_the_output_features() {
    // Row-major C 6×10: the bias has one element per column (10), BGradA m (6),
    // BGradB n (10); column-major: one per row (6).
    let s = Matmul::new(6, 10, 4);
    let p = ok(&s, DataType::F32, None, [24, 40, 60]);
    assert_eq!(needed_len(Epilogue::Bias, Role::Bias, &s, &p), 10);
    assert_eq!(needed_len(Epilogue::DGeluBGrad, Role::BiasGrad, &s, &p), 10);
    assert_eq!(needed_len(Epilogue::BGradA, Role::BiasGrad, &s, &p), 6);
    assert_eq!(needed_len(Epilogue::BGradB, Role::BiasGrad, &s, &p), 10);
    let c = s.col_major();
    let pc = ok(&c, DataType::F32, None, [24, 40, 60]);
    assert_eq!(needed_len(Epilogue::ReluBias, Role::Bias, &c, &pc), 6);
    assert_eq!(needed_len(Epilogue::BGradA, Role::BiasGrad, &c, &pc), 6);
    assert_eq!(needed_len(Epilogue::BGradB, Role::BiasGrad, &c, &pc), 10);
}

#[test]
fn epilogue_codes_match_cublaslt() {
    use cudarc::cublaslt::sys::cublasLtEpilogue_t as E;
    let want = |e: Epilogue| match e {
        Epilogue::Default => E::CUBLASLT_EPILOGUE_DEFAULT,
        Epilogue::Relu => E::CUBLASLT_EPILOGUE_RELU,
        Epilogue::Gelu => E::CUBLASLT_EPILOGUE_GELU,
        Epilogue::Bias => E::CUBLASLT_EPILOGUE_BIAS,
        Epilogue::ReluBias => E::CUBLASLT_EPILOGUE_RELU_BIAS,
        Epilogue::GeluBias => E::CUBLASLT_EPILOGUE_GELU_BIAS,
        Epilogue::ReluAux => E::CUBLASLT_EPILOGUE_RELU_AUX,
        Epilogue::ReluAuxBias => E::CUBLASLT_EPILOGUE_RELU_AUX_BIAS,
        Epilogue::GeluAux => E::CUBLASLT_EPILOGUE_GELU_AUX,
        Epilogue::GeluAuxBias => E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        Epilogue::DRelu => E::CUBLASLT_EPILOGUE_DRELU,
        Epilogue::DReluBGrad => E::CUBLASLT_EPILOGUE_DRELU_BGRAD,
        Epilogue::DGelu => E::CUBLASLT_EPILOGUE_DGELU,
        Epilogue::DGeluBGrad => E::CUBLASLT_EPILOGUE_DGELU_BGRAD,
        Epilogue::BGradA => E::CUBLASLT_EPILOGUE_BGRADA,
        Epilogue::BGradB => E::CUBLASLT_EPILOGUE_BGRADB,
    };
    for e in Epilogue::ALL {
        assert_eq!(e.code(false), want(e) as u32, "{e:?}");
        assert!(format!("{:?}", want(e)).ends_with(e.name()), "{e:?}");
    }
    // Row-major products swap the operands: A's bias gradient is cuBLAS's BGRADB.
    assert_eq!(
        Epilogue::BGradA.code(true),
        E::CUBLASLT_EPILOGUE_BGRADB as u32
    );
    assert_eq!(
        Epilogue::BGradB.code(true),
        E::CUBLASLT_EPILOGUE_BGRADA as u32
    );
    assert_eq!(Epilogue::GeluAux.code(true), Epilogue::GeluAux.code(false));
}

#[test]
fn type_and_attribute_constants_match_the_headers() {
    use cudarc::cublaslt::sys as lt;
    use lt::cublasComputeType_t as C;
    use lt::cudaDataType_t as D;
    assert_eq!(DataType::F32.cuda(), D::CUDA_R_32F as i32);
    assert_eq!(DataType::F64.cuda(), D::CUDA_R_64F as i32);
    assert_eq!(DataType::F16.cuda(), D::CUDA_R_16F as i32);
    assert_eq!(DataType::Bf16.cuda(), D::CUDA_R_16BF as i32);
    assert_eq!(DataType::Bf16.scale_cuda(), D::CUDA_R_32F as i32);
    assert_eq!(DataType::F64.scale_cuda(), D::CUDA_R_64F as i32);
    assert_eq!(DataType::F32.compute(false), C::CUBLAS_COMPUTE_32F as i32);
    assert_eq!(
        DataType::F32.compute(true),
        C::CUBLAS_COMPUTE_32F_FAST_TF32 as i32
    );
    assert_eq!(DataType::F16.compute(false), C::CUBLAS_COMPUTE_32F as i32);
    assert_eq!(DataType::F64.compute(false), C::CUBLAS_COMPUTE_64F as i32);
    use lt::cublasLtMatmulDescAttributes_t as A;
    assert_eq!(sys::DESC_TRANSA, A::CUBLASLT_MATMUL_DESC_TRANSA as i32);
    assert_eq!(sys::DESC_TRANSB, A::CUBLASLT_MATMUL_DESC_TRANSB as i32);
    assert_eq!(sys::DESC_EPILOGUE, A::CUBLASLT_MATMUL_DESC_EPILOGUE as i32);
    assert_eq!(
        sys::DESC_BIAS_POINTER,
        A::CUBLASLT_MATMUL_DESC_BIAS_POINTER as i32
    );
    assert_eq!(
        sys::DESC_EPILOGUE_AUX_POINTER,
        A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER as i32
    );
    assert_eq!(
        sys::DESC_EPILOGUE_AUX_LD,
        A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD as i32
    );
    use lt::cublasLtMatmulPreferenceAttributes_t as P;
    assert_eq!(
        sys::PREF_MAX_WORKSPACE_BYTES,
        P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES as i32
    );
    // The four alignment attributes are consecutive, A first.
    assert_eq!(
        sys::PREF_MIN_ALIGNMENT_A_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES as i32
    );
    assert_eq!(
        sys::PREF_MIN_ALIGNMENT_A_BYTES + 3,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES as i32
    );
    // The heuristic result as gpubind declares it has cuBLASLt's size.
    assert_eq!(
        size_of::<sys::LtHeuristic>(),
        size_of::<lt::cublasLtMatmulHeuristicResult_t>()
    );
    assert_eq!(
        size_of::<sys::LtAlgo>(),
        size_of::<lt::cublasLtMatmulAlgo_t>()
    );
}

#[test]
fn alignment_is_the_largest_power_of_two_up_to_256() {
    assert_eq!(alignment(0x7f00_0000_0000), 256);
    assert_eq!(alignment(0x7f00_0000_0080), 128);
    assert_eq!(alignment(0x7f00_0000_0002), 2);
    assert_eq!(alignment(0), 256);
}

#[test]
fn the_lt_key_tells_alignments_and_layouts_apart() {
    use super::lt::{EpiloguePtrs, LtProblem};
    let s = Matmul::new(64, 64, 64);
    let p = ok(&s, DataType::Bf16, None, [4096; 3]);
    let key = |ptrs, e| -> LtKey {
        LtProblem::new(p, &s, DataType::Bf16, e, ptrs, EpiloguePtrs::default()).key
    };
    let base = key((0x1000, 0x2000, 0x3000), Epilogue::Default);
    assert_eq!(base, key((0x5000, 0x6000, 0x7000), Epilogue::Default));
    assert_ne!(base, key((0x1002, 0x2000, 0x3000), Epilogue::Default));
    assert_ne!(base, key((0x1000, 0x2000, 0x3000), Epilogue::Relu));
    let c = s.col_major();
    let pc = ok(&c, DataType::Bf16, None, [4096; 3]);
    let kc = LtProblem::new(
        pc,
        &c,
        DataType::Bf16,
        Epilogue::Default,
        (0x1000, 0x2000, 0x3000),
        EpiloguePtrs::default(),
    )
    .key;
    // Square and untransposed: the column-major problem differs only by the swap,
    // which changes which pointer is cuBLAS's A (same alignment here): same key.
    assert_eq!(kc, base);
    assert_eq!(Layout::default(), Layout::RowMajor);
}

#[test]
fn gemv_maps_row_major_to_the_other_transpose() {
    use super::Gemv;
    use super::vector::plan_gemv;
    // A 2×3 row-major is column-major Aᵀ (3×2, ld 3): cuBLAS transposes it back.
    let p = plan_gemv(&Gemv::new(2, 3), DataType::F32, [6, 3, 2]).unwrap();
    assert_eq!((p.trans, p.rows, p.cols, p.lda), (true, 3, 2, 3));
    let t = plan_gemv(&Gemv::new(2, 3).transpose(), DataType::F32, [6, 2, 3]).unwrap();
    assert_eq!((t.trans, t.rows, t.cols), (false, 3, 2));
    let c = plan_gemv(&Gemv::new(2, 3).col_major(), DataType::F64, [6, 3, 2]).unwrap();
    assert_eq!((c.trans, c.rows, c.cols, c.lda), (false, 2, 3, 2));
    // Increments: at least the last element reached.
    let g = Gemv::new(2, 3).with_inc(2, 3).with_lda(4);
    let p = plan_gemv(&g, DataType::F32, [7, 5, 4]).unwrap();
    assert_eq!((p.incx, p.incy, p.lda), (2, 3, 4));
    let e = plan_gemv(&g, DataType::F32, [7, 4, 4]).unwrap_err();
    assert!(
        matches!(
            e,
            MatmulError::BufferSize {
                operand: "x",
                expected: 5,
                exact: false,
                ..
            }
        ),
        "{e}"
    );
    let e = plan_gemv(&g.with_inc(1, 0), DataType::F32, [7, 3, 4]).unwrap_err();
    assert!(
        matches!(e, MatmulError::ZeroIncrement { operand: "y", .. }),
        "{e}"
    );
    let e = plan_gemv(&Gemv::new(2, 0), DataType::F32, [0, 0, 2]).unwrap_err();
    assert!(matches!(e, MatmulError::Unsupported { .. }), "{e}");
    assert!(
        plan_gemv(&Gemv::new(0, 3), DataType::F32, [0, 3, 0])
            .unwrap()
            .empty
    );
}

#[test]
fn grouped_gemm_checks_every_product_and_builds_one_entry_per_group() {
    use super::GemmGroup;
    use super::grouped::plan_grouped;
    let a = Matmul::new(2, 3, 4);
    let b = Matmul::new(5, 1, 2).col_major().scaled(0.5, 1.0);
    let groups = [
        GemmGroup::new(a).problem(0, 0, 0).problem(8, 12, 6),
        GemmGroup::new(Matmul::new(0, 3, 4)).problem(0, 0, 0),
        GemmGroup::new(b).problem(16, 24, 12),
    ];
    let call = plan_grouped(&groups, DataType::Bf16, [26, 26, 17]).unwrap();
    assert_eq!(call.size, [2, 1]);
    assert_eq!(
        (call.m.clone(), call.n.clone(), call.k.clone()),
        (vec![3, 5], vec![2, 1], vec![4, 2])
    );
    assert_eq!(
        (call.alpha.clone(), call.beta.clone()),
        (vec![1.0, 0.5], vec![0.0, 1.0])
    );
    assert_eq!(call.offsets.len(), 3);
    assert!(call.offsets[0].1 && !call.offsets[2].1);
    let e = plan_grouped(&groups, DataType::Bf16, [26, 26, 16]).unwrap_err();
    assert!(
        matches!(&e, MatmulError::InGroup { group: 2, problem: 0, error } if matches!(**error, MatmulError::BufferSize { operand: "C", expected: 17, .. })),
        "{e}"
    );
    let e = plan_grouped(&groups, DataType::F64, [26, 26, 17]).unwrap_err();
    assert!(
        matches!(e, MatmulError::Unsupported { dtype: "f64", .. }),
        "{e}"
    );
    let overlap = [
        GemmGroup::new(a).problem(0, 0, 0),
        GemmGroup::new(a).problem(0, 0, 5),
    ];
    let e = plan_grouped(&overlap, DataType::F16, [8, 12, 12]).unwrap_err();
    assert!(matches!(e, MatmulError::InGroup { group: 1, .. }), "{e}");
}

#[test]
fn pointer_modes_match_the_headers() {
    use cudarc::cublas::sys::cublasPointerMode_t as P;
    assert_eq!(sys::POINTER_MODE_HOST, P::CUBLAS_POINTER_MODE_HOST as i32);
    assert_eq!(
        sys::POINTER_MODE_DEVICE,
        P::CUBLAS_POINTER_MODE_DEVICE as i32
    );
}

mod gemm_checks;

/// A timing's scratch covers everything the product's own buffers hold, for every layout,
/// transpose, leading dimension and epilogue operand: A and B (in cuBLAS's order, which
/// swaps them for row-major products), C, the bias (or bias gradient) and the aux operand.
#[test]
fn timing_scratch_covers_every_operand() {
    use super::lt::scratch_parts;
    use super::plan::operands;
    let (m, n, k) = (37, 53, 29);
    let base = [
        Matmul::new(m, n, k),
        Matmul::new(m, n, k).transpose_a(),
        Matmul::new(m, n, k).transpose_b(),
        Matmul::new(m, n, k).transpose_a().transpose_b(),
    ];
    let mut shapes = Vec::new();
    for s in base {
        shapes.push(s);
        shapes.push(s.col_major());
        // Leading dimensions past the inner size of whichever layout.
        shapes.push(s.with_ld(m.max(k) + 3, n.max(k) + 5, m.max(n) + 7));
        shapes.push(
            s.col_major()
                .with_ld(m.max(k) + 9, n.max(k) + 1, m.max(n) + 2),
        );
    }
    let epilogues = [
        Epilogue::Default,
        Epilogue::Bias,
        Epilogue::GeluAuxBias,
        Epilogue::DGelu,
        Epilogue::ReluAuxBias,
        Epilogue::DRelu,
        Epilogue::BGradA,
        Epilogue::BGradB,
    ];
    for dtype in [DataType::Bf16, DataType::F32] {
        let el = dtype.bytes();
        for s in &shapes {
            let spans = operands(s, None).unwrap().map(|o| o.matrix_span().unwrap());
            let p = ok(s, dtype, None, spans);
            for e in epilogues {
                let aux_ld = e.aux_ld(s).map_or(0, |l| l as i64);
                let parts = scratch_parts(&p, dtype, aux_ld, 1 << 20);
                let (first, second) = if p.swapped {
                    (spans[1], spans[0])
                } else {
                    (spans[0], spans[1])
                };
                let what = format!("{dtype:?} {s:?} {}", e.name());
                assert!(parts[0] >= first * el, "A: {what}");
                assert!(parts[1] >= second * el, "B: {what}");
                assert!(parts[2] >= spans[2] * el, "C: {what}");
                for role in [Role::Bias, Role::BiasGrad] {
                    if e.uses(role) {
                        assert!(parts[3] >= needed_len(e, role, s, &p) * 8, "bias: {what}");
                    }
                }
                for role in [Role::Aux, Role::AuxOut, Role::ReluMask, Role::ReluMaskOut] {
                    if e.uses(role) {
                        assert!(parts[4] >= needed_len(e, role, s, &p) * el, "aux: {what}");
                    }
                }
                assert_eq!(parts[5], 1 << 20);
            }
        }
    }
}

#[test]
fn an_addend_needs_a_beta_that_is_not_zero_where_cublas_takes_it() {
    use super::call::beta_is_zero;
    // f16, bf16 and f32 products take beta as an f32: 1e-46 is 0 there, not in f64.
    for dtype in [DataType::F16, DataType::Bf16, DataType::F32] {
        assert!(
            beta_is_zero(dtype, 0.0) && beta_is_zero(dtype, 1e-46),
            "{dtype:?}"
        );
        assert!(
            !beta_is_zero(dtype, 1.0) && !beta_is_zero(dtype, 1e-30),
            "{dtype:?}"
        );
    }
    assert!(beta_is_zero(DataType::F64, 0.0));
    assert!(!beta_is_zero(DataType::F64, 1e-46));
}

#[test]
fn the_lt_key_takes_cublas_c_from_the_addend_and_d_from_c() {
    use super::lt::{EpiloguePtrs, LtProblem};
    let s = Matmul::new(64, 64, 64);
    let p = ok(&s, DataType::Bf16, None, [4096; 3]);
    let key = |c: u64, addend: u64| -> LtKey {
        let ptrs = EpiloguePtrs {
            addend,
            ..EpiloguePtrs::default()
        };
        let abc = (0x1000, 0x2000, c);
        LtProblem::new(p, &s, DataType::Bf16, Epilogue::Default, abc, ptrs).key
    };
    // Aligned alike: an addend changes nothing.
    assert_eq!(key(0x3000, 0), key(0x3000, 0x9000));
    // A 2-byte aligned addend is cuBLAS's C only: D keeps its alignment.
    assert_ne!(key(0x3000, 0x9002), key(0x3002, 0));
    assert_ne!(key(0x3000, 0x9002), key(0x3000, 0));
    // Without an addend C is D: both take C's alignment, which an aligned addend lifts.
    assert_ne!(key(0x3002, 0), key(0x3002, 0x9000));
}

"""Tests of scripts/profile_gpt_summary.py (no GPU): python3 -m unittest scripts/test_profile_gpt_summary.py"""
import glob
import os
import re
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import profile_gpt_summary as S  # noqa: E402

# Nsight Compute's output for a train_gpt gpt2 bf16 batch-8 run: the program's output and
# ncu's lines, then the CSV of a 700-kernel window (the last 16 of step 1, 684 of step 2).
NCU_SAMPLE = os.path.join(ROOT, "benches/results/2026-12-04/train_gpt-gpt2-bf16-b8-ncu.csv")

# Kernel names as PyTorch's profiler reports them on an H100/H200 (bf16 autocast, SDPA).
TORCH_NAMES = {
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT": "GEMM (cuBLAS/cuBLASLt)",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas": "GEMM (cuBLAS/cuBLASLt)",
    "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn": "GEMM (cuBLAS/cuBLASLt)",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)": "GEMM (cuBLAS/cuBLASLt)",
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, 0, float, __nv_bfloat16, __nv_bfloat16, 1, 0, 0, 0>(cublasLt::cublasSplitKParams<float>)": "GEMM (cuBLAS/cuBLASLt)",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, true, false, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)": "attention",
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t>, true, false, false, false, false, true, false, false>(pytorch_flash::Flash_bwd_params)": "attention",
    "void pytorch_flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<64, 128, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t> >(pytorch_flash::Flash_bwd_params)": "attention",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)": "attention",
    "cudnn_generated_fortran_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0": "attention",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)": "layernorm",
    "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float>(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, c10::BFloat16*, int)": "layernorm",
    "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel2<c10::BFloat16, float>(long, long, c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16*, c10::BFloat16*)": "layernorm",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)": "GELU / bias",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, at::detail::Array<char*, 3> >(int, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, at::detail::Array<char*, 3>)": "GELU / bias",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)": "softmax / cross-entropy",
    "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, float*, float const*, long const*, float const*, bool, long, long, long, long)": "softmax / cross-entropy",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::PointwiseOpScalarFunctor<float, 4, 3, 3>, std::multiplies<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::PointwiseOpScalarFunctor<float, 4, 3, 3>, std::multiplies<float>, float)": "optimizer (clip + AdamW)",
    "void at::native::lpnorm_cleanup<float, (at::native::NormType)1, float>(float const*, at::native::TensorListAddresses, int)": "optimizer (clip + AdamW)",
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<float const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned int, long)": "embedding",
    "void at::native::(anonymous namespace)::compute_grad_weight<float, long>(long const*, float const*, long const*, long, long, long const*, long const*, at::acc_type<float, true>*, long)": "embedding",
    "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<at_cuda_detail::cub::DeviceRadixSortPolicy<long, long, int>::Policy900, false, long, long, int, int, at_cuda_detail::cub::detail::identity_decomposer_t>(int*, int*, int*, int const*, long*, long const*, long*, long const*, int, int, int, at_cuda_detail::cub::detail::identity_decomposer_t)": "embedding",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)": "elementwise / copy / reduce",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4>)": "elementwise / copy / reduce",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1>)": "elementwise / copy / reduce",
    "Memcpy HtoD (Pageable -> Device)": "memcpy/memset (not kernels)",
    "Memset (Device)": "memcpy/memset (not kernels)",
}


def train_gpt_kernels():
    """The `extern "C" __global__` functions of examples/train_gpt/*.cu."""
    names = set()
    for path in glob.glob(os.path.join(ROOT, "examples/train_gpt/*.cu")):
        src = S.read(path)
        decl = r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\('
        names.update(re.findall(decl, src))
    return names


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def ncu_csv(rows, unit="ns"):
    """A minimal ncu --csv output for (name, value) rows, with a preamble."""
    head = ('"ID","Process ID","Process Name","Kernel Name","Metric Name","Metric Unit","Metric Value"')
    lines = ["train_gpt: model gpt2", "==PROF== Connected to process 1 (train_gpt)", head]
    for i, (name, value) in enumerate(rows):
        lines.append(f'"{i}","1","train_gpt","{name}","gpu__time_duration.sum","{unit}","{value}"')
    return "\n".join(lines + ["==PROF== Disconnected from process 1"]) + "\n"


class Classification(unittest.TestCase):
    def test_every_train_gpt_kernel_has_a_class(self):
        names = train_gpt_kernels()
        # The kernels of kernels.cu, attention.cu and attention_mma.cu: a parse that found
        # few would make this test vacuous.
        self.assertGreaterEqual(len(names), 25, sorted(names))
        for must in ("encoder_fwd", "adamw", "attn_fwd", "attn_bwd_dkdv", "layernorm_bwd_dx"):
            self.assertIn(must, names)
        unclassified = sorted(n for n in names if S.classify(n) in (S.OTHER, S.CLASSES[0][0]))
        self.assertEqual(unclassified, [], "train_gpt kernels in no class")

    def test_train_gpt_kernels_land_in_their_classes(self):
        expect = {
            "attn_fwd": "attention", "attn_bwd_d": "attention", "softmax_causal_fwd": "attention",
            "permute_qkv": "attention", "unpermute": "attention",
            "layernorm_fwd": "layernorm", "residual_layernorm_fwd": "layernorm",
            "layernorm_bwd": "layernorm", "layernorm_bwd_dx": "layernorm",
            "layernorm_bwd_wb": "layernorm",
            "colsum_finish": "layernorm", "colsum_finish_qkv": "attention",
            "gelu_fwd": "GELU / bias", "gelu_bwd": "GELU / bias", "bias_add": "GELU / bias",
            "colsum_partial": "GELU / bias", "xent": "softmax / cross-entropy",
            "adamw": "optimizer (clip + AdamW)", "sumsq_partial": "optimizer (clip + AdamW)",
            "encoder_fwd": "embedding", "encoder_bwd_wte_partial": "embedding",
            "sum_finish": "elementwise / copy / reduce",
        }
        for name, cls in expect.items():
            self.assertEqual(S.classify(name), cls, name)

    def test_torch_and_cublas_names(self):
        for name, cls in TORCH_NAMES.items():
            self.assertEqual(S.classify(name), cls, name)
        self.assertEqual(S.classify("some_new_kernel"), S.OTHER)


class NcuParse(unittest.TestCase):
    def test_the_recorded_h200_output(self):
        text = S.read(NCU_SAMPLE)
        rows = S.ncu_rows(text)
        self.assertEqual(len(rows), 700)
        self.assertEqual(rows[0], ("adamw", 19520.0))  # "19,520" ns
        # The window holds the end of step 1 and 684 kernels of step 2.
        table, counts = S.ncu_side(text, 0, 1)
        self.assertEqual(counts, [684])
        self.assertEqual(sum(c for c, _ in table.values()), 684)
        total_ms = sum(ns for _, ns in table.values()) / 1e6
        self.assertAlmostEqual(total_ms, 23.876, places=2)
        classes = S.by_class(table)
        self.assertEqual(classes.get(S.OTHER, 0.0), 0.0, [n for n in table if S.classify(n) == S.OTHER])
        self.assertGreater(classes["GEMM (cuBLAS/cuBLASLt)"], classes["layernorm"])
        with self.assertRaises(S.SummaryError):
            S.ncu_side(text, 1, 1)  # only one step starts in the window

    def test_warmup_and_initialisation_are_dropped(self):
        step = [("encoder_fwd", 10), ("nvjet_x", 100), ("adamw", 5)]
        rows = [("cast_weights", 1000)] + step * 3  # start-up, then 3 steps
        table, counts = S.ncu_side(ncu_csv(rows, unit="usecond"), 1, 2)
        self.assertEqual(counts, [3, 3])
        self.assertEqual(table["nvjet_x"], [2, 200e3])
        self.assertNotIn("cast_weights", table)
        for warmup, steps in [(0, 2), (2, 2), (3, 1)]:
            with self.assertRaises(S.SummaryError):
                S.ncu_side(ncu_csv(rows), warmup, steps)

    def test_no_csv_is_an_error(self):
        with self.assertRaises(S.SummaryError):
            S.ncu_rows("==ERROR== the profiler failed\n")


class Summary(unittest.TestCase):
    def test_both_sides_in_one_table(self):
        torch_csv = "name,calls,total_us\n" + "".join(
            f'"{n}",4,{10.0 * (i + 1)}\n' for i, n in enumerate(TORCH_NAMES))
        rows = [("encoder_fwd", 1000), ("nvjet_a", 30000), ("attn_fwd", 8000), ("adamw", 2000)] * 3
        with tempfile.TemporaryDirectory() as d:
            paths = {k: os.path.join(d, k) for k in ("ncu", "torch", "meta", "ge", "te", "md")}
            write(paths["ncu"], ncu_csv(rows))
            write(paths["torch"], torch_csv)
            write(paths["meta"], '{"model": "gpt2", "batch": 4, "context": 1024}')
            write(paths["ge"], "RESULT impl=gpubind mode=eager tokens_per_s=102400 mfu=0.2\n")
            write(paths["te"], "step 1 loss 5\nRESULT impl=torch tokens_per_s=204800 mfu=0.3\n")
            argv = ["--ncu", paths["ncu"], "--torch", paths["torch"], "--warmup", "1", "--steps", "2",
                    "--meta", paths["meta"], "--gpubind-eager-log", paths["ge"],
                    "--torch-log", paths["te"], "--out", paths["md"]]
            import contextlib
            import io
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(S.main(argv), 0)
            md = S.read(paths["md"])
        # gpubind: 41 µs per step (1 + 30 + 8 + 2); GEMM 30 µs.
        self.assertIn("| **all GPU activity** | **0.04** |", md)
        self.assertIn("| GEMM (cuBLAS/cuBLASLt) | 0.03 |", md)
        # torch: 4096 tokens at 204800 tokens/s = 20 ms per step; gpubind 40 ms.
        self.assertRegex(md, r"\| step time, eager \(unprofiled run\) \| 40\.00 \|.*\| 20\.00 \|.*\| 2\.00 \|")
        self.assertIn("kernels per step | 4 |", md)
        self.assertIn("### torch: top 15 kernels", md)
        self.assertNotIn("| other |", md)

    def test_a_missing_side_shows_dashes(self):
        md = S.render(None, {"nvjet_a": [2, 4e6]}, None, 2, 1, None, {})
        self.assertIn("| GEMM (cuBLAS/cuBLASLt) | - | - | 2.00 | 100.0 % | - |", md)


if __name__ == "__main__":
    unittest.main()

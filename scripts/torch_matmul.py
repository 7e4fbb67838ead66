#!/usr/bin/env python3
"""Times torch.matmul on the shapes and dtypes of examples/bench_blas.rs.

Rows: 4096^3 GEMM in bf16, f16, f32 with TF32, f32; bf16 GELU+bias as
torch.nn.functional.linear + gelu(approximate="tanh") (what cuBLASLt's
GELU_BIAS epilogue fuses; PyTorch may or may not fuse it); batched bf16
attention shapes (96 x 1024x1024x64 scores, 96 x 1024x64x1024 P.V). CUDA
events around a loop of about 20 ms, after a warm-up; the median of --reps
runs gives TFLOP/s. Prints a markdown table to compare with bench_blas's.

Run: python3 scripts/torch_matmul.py [--reps 9]  (needs torch with CUDA)
"""

import argparse
import statistics

import torch


def time_ms(fn, reps):
    """Median milliseconds per call of fn over reps runs of ~20 ms each."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    end.synchronize()
    probe = start.elapsed_time(end) / 3
    iters = max(3, min(500, int(20.0 / max(probe, 1e-3)) + 1))
    runs = []
    for _ in range(reps):
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / iters)
    return statistics.median(runs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED torch_matmul: torch sees no CUDA device")
        return
    dev = torch.device("cuda", 0)
    n = 4096
    rows = []

    def gemm(name, dtype, tf32):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        c = torch.empty(n, n, device=dev, dtype=dtype)
        ms = time_ms(lambda: torch.matmul(a, b, out=c), args.reps)
        rows.append((f"GEMM {name}", "4096×4096×4096", 2 * n**3 / (ms * 1e-3) / 1e12))

    gemm("bf16", torch.bfloat16, False)
    gemm("f16", torch.float16, False)
    gemm("f32 TF32", torch.float32, True)
    gemm("f32", torch.float32, False)
    torch.backends.cuda.matmul.allow_tf32 = False

    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    bias = torch.randn(n, device=dev, dtype=torch.bfloat16)
    ms = time_ms(
        lambda: torch.nn.functional.gelu(
            torch.nn.functional.linear(x, w, bias), approximate="tanh"
        ),
        args.reps,
    )
    rows.append(("linear + gelu(tanh) bf16", "4096×4096×4096", 2 * n**3 / (ms * 1e-3) / 1e12))

    count = 96
    for name, (m, nn, k) in [
        ("batched bf16 Q·Kᵀ", (1024, 1024, 64)),
        ("batched bf16 P·V", (1024, 64, 1024)),
    ]:
        a = torch.randn(count, m, k, device=dev, dtype=torch.bfloat16)
        if name.endswith("Kᵀ"):
            b = torch.randn(count, nn, k, device=dev, dtype=torch.bfloat16).transpose(1, 2)
        else:
            b = torch.randn(count, k, nn, device=dev, dtype=torch.bfloat16)
        c = torch.empty(count, m, nn, device=dev, dtype=torch.bfloat16)
        ms = time_ms(lambda: torch.matmul(a, b, out=c), args.reps)
        rows.append((name, f"{count} × {m}×{nn}×{k}", 2 * m * nn * k * count / (ms * 1e-3) / 1e12))

    print("| product | shape | torch.matmul TFLOP/s |")
    print("|---|---|---:|")
    for name, shape, tflops in rows:
        print(f"| {name} | {shape} | {tflops:.1f} |")
    print(
        f"\ntorch {torch.__version__} (CUDA {torch.version.cuda}) on "
        f"{torch.cuda.get_device_name(dev)}; median of {args.reps} runs (CUDA events)."
    )


if __name__ == "__main__":
    main()

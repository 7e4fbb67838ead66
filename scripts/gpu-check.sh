#!/usr/bin/env bash
# Runs on the GPU machine over binaries built by scripts/build-gpu-bins.sh (carried in
# .gpu-bin/). Every GPU suite, the examples, and the benches, in one call; all output goes
# to stdout and to $OUT/gpu-check.log.
#   GPU_CHECK_ONLY="gpu_core quickstart" limits what runs (names of binaries; the capped
#   reruns are named capped-12.2-gpu_core and capped-12.2-gpu_memory_kinds).
#   GPU_CHECK_TRAIN_COMPARE=1 adds scripts/compare-train.sh (train_mlp against PyTorch
#   eager and CUDA graph at batch 4096 and 65536; needs torch; named compare-train).
#   GPU_CHECK_GPT_COMPARE=1 adds scripts/compare-gpt.sh (train_gpt against PyTorch: fp32
#   losses, 500-step bf16 loss, throughput table, loss-curve plot; needs torch and
#   matplotlib; named compare-gpt).
#   GPU_CHECK_SANITIZE_ATTENTION=1 adds train_gpt --check-attention-quick under
#   compute-sanitizer's memcheck, racecheck and synccheck (named sanitize-attention-TOOL;
#   the tool refuses the device under gVisor).
#   GPU_CHECK_SHARD=K/N runs only every N-th of the wanted runs, starting at the K-th
#   (K = 1..N): N calls with K = 1..N together run everything once, each within a
#   per-call time limit.
set -u
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export GPUBENCH=$PWD/.gpu-bin/examples/gpubench
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LOG=${OUT:-/tmp}/gpu-check.log
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }
wanted() { [[ -z "${GPU_CHECK_ONLY:-}" ]] || [[ " $GPU_CHECK_ONLY " == *" $1 "* ]]; }
SHARD=${GPU_CHECK_SHARD:-1/1}
SHARD_K=${SHARD%/*} SHARD_N=${SHARD#*/} RUN_INDEX=0
if ! [[ $SHARD_K =~ ^[0-9]+$ && $SHARD_N =~ ^[0-9]+$ ]] || ((SHARD_K < 1 || SHARD_K > SHARD_N)); then
  echo "GPU_CHECK_SHARD=$SHARD: expected K/N with 1 <= K <= N" >&2
  exit 2
fi
in_shard() { # counts every wanted run; true for this shard's
  RUN_INDEX=$((RUN_INDEX + 1))
  (((RUN_INDEX - 1) % SHARD_N == SHARD_K - 1))
}
run() { # name timeout cmd...
  local name=$1 t=$2; shift 2
  wanted "$name" || return 0
  in_shard || return 0
  say "=== $name: $*"
  local start=$SECONDS
  timeout "$t" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  say "=== $name: exit $rc after $((SECONDS - start)) s"
  [[ $rc == 0 ]] || FAILED="$FAILED $name"
}
FAILED=""
say "$(date -u) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4)"
for t in .gpu-bin/tests/gpu_*; do run "$(basename "$t")" "${GPU_TEST_TIMEOUT:-180}" "$t"; done
# Old-driver paths on this (new) driver, docs/compat.md: suites again with the driver
# version gpubind assumes capped at its floor, CUDA 12.2 (gpu_compat runs its own capped
# children above). GPU_CHECK_CAPPED=0 leaves these out.
if [[ ${GPU_CHECK_CAPPED:-1} != 0 ]]; then
  [[ -x .gpu-bin/tests/gpu_core ]] && GPUBIND_ASSUME_DRIVER_VERSION=12020 \
    run capped-12.2-gpu_core "${GPU_TEST_TIMEOUT:-180}" .gpu-bin/tests/gpu_core
  [[ -x .gpu-bin/tests/gpu_memory_kinds ]] && GPUBIND_ASSUME_DRIVER_VERSION=12020 \
    GPUBIND_TEST_FILTER=managed \
    run capped-12.2-gpu_memory_kinds "${GPU_TEST_TIMEOUT:-180}" .gpu-bin/tests/gpu_memory_kinds
fi
# Examples, with the arguments they are checked with.
ex() { local name=$1; shift; [[ -x .gpu-bin/examples/$name ]] && run "$name" "$@"; }
ex quickstart 60 .gpu-bin/examples/quickstart
ex cudarc_interop 60 .gpu-bin/examples/cudarc_interop
ex multi_gpu 120 .gpu-bin/examples/multi_gpu
ex multi_gpu 120 .gpu-bin/examples/multi_gpu --devices 0,0
ex ipc_workers 120 .gpu-bin/examples/ipc_workers 4
ex train_mlp 300 .gpu-bin/examples/train_mlp --epochs 10
ex train_mlp 300 .gpu-bin/examples/train_mlp --epochs 5 --devices 0,0
ex train_mlp 300 .gpu-bin/examples/train_mlp --epochs 5 --devices 0,0 --graph
# One process per rank (docs/collective.md, "A complete training program"): the built-in
# spawner and torchrun, 2 processes on GPU 0 with the own kernels across processes.
ex train_mlp 300 .gpu-bin/examples/train_mlp --spawn 2 --backend kernels --devices 0,0 --epochs 3
# A GPT on byte-level text (the Python standard library): fp32 eager with validation and
# a greedy sample; a checkpoint resumed mid-run that must repeat the losses; the step as
# a CUDA graph that must repeat the eager losses; two ranks on GPU 0 (batch 4 each) that
# must give the one-rank losses within 1e-3 relative; bf16, eager and graph. First the
# fused attention against the unfused one (fp32 and bf16, output and gradients). fp32
# defaults to the unfused attention and bf16 to the mma one, so the resume, graph and
# ranks checks also run with the others: bf16 mma with a resume, fp32 tiled over two
# ranks and bf16 tiled in a graph, those two with the bias and GELU kernels in place of
# the cuBLASLt epilogues.
ex train_gpt 300 .gpu-bin/examples/train_gpt --check-attention
ex train_gpt 300 .gpu-bin/examples/train_gpt --model small --steps 50 --eval-every 25 --sample 64
ex train_gpt 300 .gpu-bin/examples/train_gpt --model small --steps 20 --check-resume
ex train_gpt 300 .gpu-bin/examples/train_gpt --model small --steps 50 --eval-every 25 --check-graph
ex train_gpt 300 .gpu-bin/examples/train_gpt --model small --steps 20 --devices 0,0 --check-dp
ex train_gpt 300 .gpu-bin/examples/train_gpt --model small --steps 50 --precision bf16 --check-graph
ex train_gpt 300 .gpu-bin/examples/train_gpt --model small --steps 20 --precision bf16 --check-resume
ex train_gpt 300 .gpu-bin/examples/train_gpt --model small --steps 20 --attention fused \
  --epilogues off --devices 0,0 --check-dp
ex train_gpt 300 .gpu-bin/examples/train_gpt --model small --steps 50 --precision bf16 \
  --attention tiled --epilogues off --check-graph
if command -v torchrun >/dev/null; then
  ex train_gpt 300 torchrun --standalone --nproc-per-node 2 --no-python .gpu-bin/examples/train_gpt \
    --launcher env --devices 0,0 --model small --steps 20
fi
if command -v torchrun >/dev/null; then
  ex train_mlp 300 torchrun --standalone --nproc-per-node 2 --no-python .gpu-bin/examples/train_mlp \
    --launcher env --backend kernels --devices 0,0 --epochs 3
elif wanted train_mlp; then
  say "=== train_mlp under torchrun: SKIPPED (torchrun not on PATH)"
fi
[[ -f .gpu-bin/examples/libdlpack_torch.so ]] &&
  run dlpack_torch 120 python3 scripts/dlpack_torch.py .gpu-bin/examples/libdlpack_torch.so
# Benchmarks last: their tables are what docs/performance.md quotes.
ex gpubench 150 .gpu-bin/examples/gpubench --markdown
ex bench_blas 300 .gpu-bin/examples/bench_blas --reps 7
if python3 -c 'import torch' 2>/dev/null; then
  run torch_matmul 300 python3 scripts/torch_matmul.py --reps 7
elif wanted torch_matmul; then
  say "=== torch_matmul: SKIPPED (python3 cannot import torch)"
fi
ex bench_copy 120 .gpu-bin/examples/bench_copy
ex bench_collective 150 .gpu-bin/examples/bench_collective --reps 10
# train_mlp against PyTorch, docs/performance.md ("train_mlp against PyTorch"): optional.
[[ ${GPU_CHECK_TRAIN_COMPARE:-0} == 1 ]] && run compare-train 900 bash scripts/compare-train.sh
# train_gpt against PyTorch, scripts/compare-gpt.sh: optional.
[[ ${GPU_CHECK_GPT_COMPARE:-0} == 1 ]] && run compare-gpt 1800 bash scripts/compare-gpt.sh
for extra in ${GPU_CHECK_EXTRA:-}; do run "$(basename "${extra%% *}")" 300 $extra; done
# compute-sanitizer over GPU suites: GPU_CHECK_SANITIZE="memcheck:gpu_core,gpu_soundness
# racecheck:gpu_soundness ..." (tool:suite,suite; "all" = every suite). memcheck runs with
# the leak check. Driver API errors are reported (--report-api-errors explicit) but do not
# fail the run: the suites provoke them on purpose (bad-input tests, the
# cuFuncGetParamInfo probe that ends past the last parameter). scripts/sanitizer_summary.py
# lists them by call, code and test (docs/faults.md explains each) and fails the run on
# anything else: a memory error, a leak, a race hazard, a barrier error, a missing summary.
# "all" leaves out gpu_perf and gpu_read_args (timings), gpu_soak (a 50 s host-memory soak that
# measures the process, not the device) and gpu_faults (its child process faults a kernel on
# purpose, which memcheck rightly reports). GPU_CHECK_ONLY does not apply to these runs.
SAN=/usr/local/cuda/bin/compute-sanitizer
for spec in ${GPU_CHECK_SANITIZE:-}; do
  tool=${spec%%:*}
  extra=""; [[ $tool == memcheck ]] && extra="--leak-check full"
  suites=${spec#*:}
  [[ $suites == all ]] && suites=$(cd .gpu-bin/tests && ls gpu_* | grep -v -x -e gpu_perf -e gpu_read_args -e gpu_soak -e gpu_faults | tr '\n' ,)
  for suite in $(echo "$suites" | tr , ' '); do
    name="sanitize-$tool-$suite"
    slog=${OUT:-/tmp}/$name.log
    say "=== $name"
    start=$SECONDS
    GPUBIND_TEST_TIMEOUT=600 timeout "${GPU_SANITIZE_TIMEOUT:-590}" "$SAN" --tool "$tool" $extra \
      --report-api-errors explicit --print-limit 100000 --show-backtrace "${GPU_SANITIZE_BACKTRACE:-yes}" \
      .gpu-bin/tests/"$suite" >"$slog" 2>&1
    rc=$?
    grep -E "^(test |test result|=========.*(SUMMARY|Invalid|Race|Barrier|Leaked))" "$slog" |
      grep -v "Program hit" | tail -60 | tee -a "$LOG"
    # gpu_ipc's leaks that are not leaks (docs/faults.md, "Sanitizer findings"): pool
    # imports unmapped with cuMemFree, which compute-sanitizer does not count as freed
    # (gpu_ipc asserts the address is unmapped after the drop), and the exporter child
    # that dies without freeing on purpose.
    explained=()
    [[ $tool == memcheck && $suite == gpu_ipc ]] && explained=(--explained cuMemPoolImportPointer
      --explained cuMemAllocFromPoolAsync@importer_closes_after_exporter_died)
    python3 scripts/sanitizer_summary.py "$slog" "${explained[@]}" | tee -a "$LOG"
    src=${PIPESTATUS[0]}
    say "=== $name: suite exit $rc, sanitizer summary exit $src after $((SECONDS - start)) s"
    [[ $rc == 0 && $src == 0 ]] || FAILED="$FAILED $name"
  done
done
# The fused attention kernels under compute-sanitizer (small shapes, untimed): optional.
if [[ ${GPU_CHECK_SANITIZE_ATTENTION:-0} == 1 ]]; then
  for tool in memcheck racecheck synccheck; do
    run sanitize-attention-$tool 600 "$SAN" --tool "$tool" --error-exitcode 1 \
      --report-api-errors no .gpu-bin/examples/train_gpt --check-attention-quick
  done
fi
say "=== failed:${FAILED:- none}"
[[ -z "$FAILED" ]]

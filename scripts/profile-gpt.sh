#!/usr/bin/env bash
# Where train_gpt and PyTorch spend their GPU time per training step, side by side by kind
# of kernel (GEMM, attention, layer norm, GELU/bias, cross-entropy, optimizer, embedding,
# elementwise), on one GPU, from the same initial weights and batches
# (train_gpt --dump-init, as scripts/compare-gpt.sh).
#
#  1. train_gpt eager (every kernel its own launch, so each is attributable) under Nsight
#     Compute, collecting only each kernel's duration (gpu__time_duration.sum, one pass, no
#     replay), for PROFILE_WARMUP + PROFILE_STEPS steps. Clocks and caches are left alone
#     (--clock-control none --cache-control none): kernels run at the clocks of a real run
#     and find the L2 as the previous kernel left it; ncu still serialises them.
#  2. scripts/torch_gpt.py eager (SDPA attention, bf16 autocast) for the same steps,
#     profiling the last PROFILE_STEPS with torch.profiler (--profile).
#  3. Unprofiled runs of PROFILE_TIMED_STEPS steps (train_gpt eager and --graph, torch
#     eager) for each side's step time, so the table shows how busy the GPU is.
#  4. scripts/profile_gpt_summary.py: milliseconds per step by class, both sides and their
#     ratio, and the top 15 kernels of each, printed and written to $OUT/profile-gpt.md.
#
# Warm-up: ncu profiles every kernel of the train_gpt run, start-up included. Every train
# step launches encoder_fwd exactly once, as its first kernel (no --eval-every, no
# --sample here), so the summary splits the kernels at each encoder_fwd, drops those
# before the first (start-up) and the first PROFILE_WARMUP steps', and fails unless it
# finds exactly PROFILE_WARMUP + PROFILE_STEPS steps: a truncated profile, an extra
# forward pass or a renamed kernel cannot shift kernels between steps unnoticed, and
# nothing depends on how many kernels start-up or a step launches (it also reports
# profiled steps whose kernel counts differ). torch_gpt.py synchronises the device before
# starting the profiler at its first profiled step and before stopping it after its last.
#
# Runs on the GPU machine from the repository root, over .gpu-bin/examples/train_gpt
# (scripts/build-gpu-bins.sh). Environment: PROFILE_MODEL (gpt2), PROFILE_BATCH (32),
# PROFILE_PRECISION (bf16), PROFILE_STEPS (profiled steps, 2), PROFILE_WARMUP (2),
# PROFILE_TIMED_STEPS (20; 0 leaves step 3 out), PROFILE_GPT_ARGS (more train_gpt
# arguments, e.g. "--attention unfused"), PROFILE_TIMEOUT (seconds per run, 240),
# TRAIN_GPT (the binary), PYTHON (with torch), NCU (/usr/local/cuda/bin/ncu), OUT
# (/tmp/profile-gpt: the raw ncu output, torch's CSV, every log and the table).
# Exit status 1 naming each command that failed; the table still covers the runs that
# succeeded.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${TRAIN_GPT:-.gpu-bin/examples/train_gpt}
PY=${PYTHON:-python3}
NCU=${NCU:-/usr/local/cuda/bin/ncu}
MODEL=${PROFILE_MODEL:-gpt2}
BATCH=${PROFILE_BATCH:-32}
PREC=${PROFILE_PRECISION:-bf16}
STEPS=${PROFILE_STEPS:-2}
WARMUP=${PROFILE_WARMUP:-2}
TIMED=${PROFILE_TIMED_STEPS:-20}
LIMIT=${PROFILE_TIMEOUT:-240}
read -ra EXTRA <<<"${PROFILE_GPT_ARGS:-}"
DEST=${OUT:-/tmp/profile-gpt}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p "$DEST"
rm -f "$DEST/profile-gpt.md"
[[ -x $BIN ]] || { echo "profile-gpt: no $BIN (run scripts/build-gpu-bins.sh)" >&2; exit 1; }
[[ -x $NCU ]] || { echo "profile-gpt: no Nsight Compute at $NCU (set NCU)" >&2; exit 1; }
(( STEPS >= 1 && WARMUP >= 1 )) || { echo "profile-gpt: PROFILE_STEPS and PROFILE_WARMUP must be at least 1" >&2; exit 1; }
RUN=$((WARMUP + STEPS))
failed=()

# Runs a command with its output in a log; on failure names it and shows the log's end.
run() { # log command...
  local log=$1
  shift
  echo "+ $*"
  local t0=$SECONDS
  timeout "$LIMIT" "$@" >"$log" 2>&1
  local rc=$?
  if ((rc != 0)); then
    echo "profile-gpt: FAILED (exit $rc$( ((rc == 124)) && echo ", timed out after ${LIMIT}s")): $*"
    tail -15 "$log" | sed 's/^/    /'
    failed+=("$*")
    return 1
  fi
  echo "  done in $((SECONDS - t0)) s (log: $log)"
}

{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -1
  "$NCU" --version 2>&1 | tail -1
  "$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -1
} | tee "$DEST/versions.txt"

init=$DEST/init
dump_steps=$(( RUN > TIMED ? RUN : TIMED ))
run "$DEST/dump-init.log" "$BIN" --model "$MODEL" --batch "$BATCH" --steps "$dump_steps" \
  --dump-init "$init" || exit 1

echo "=== 1. train_gpt eager under Nsight Compute: $WARMUP warm-up + $STEPS profiled steps"
ncu_args=(--metrics gpu__time_duration.sum --csv --print-units base --clock-control none
  --cache-control none --target-processes all)
gb_args=(--model "$MODEL" --batch "$BATCH" --precision "$PREC" --log-every 1000 "${EXTRA[@]}")
have_ncu=()
run "$DEST/train_gpt-ncu.csv" "$NCU" "${ncu_args[@]}" "$BIN" "${gb_args[@]}" --steps "$RUN" \
  && have_ncu=(--ncu "$DEST/train_gpt-ncu.csv")

echo "=== 2. torch_gpt.py eager under torch.profiler: the last $STEPS of $RUN steps"
tc_args=(scripts/torch_gpt.py --init "$init" --precision "$PREC")
have_torch=()
run "$DEST/torch-profile.log" "$PY" "${tc_args[@]}" --steps "$RUN" --profile "$STEPS" \
  --profile-csv "$DEST/torch-gpu-activity.csv" && have_torch=(--torch "$DEST/torch-gpu-activity.csv")

timed=()
if ((TIMED > 0)); then
  echo "=== 3. unprofiled step times: $TIMED steps each"
  run "$DEST/train_gpt-eager.log" "$BIN" "${gb_args[@]}" --steps "$TIMED" \
    && timed+=(--gpubind-eager-log "$DEST/train_gpt-eager.log")
  run "$DEST/train_gpt-graph.log" "$BIN" "${gb_args[@]}" --steps "$TIMED" --graph \
    && timed+=(--gpubind-graph-log "$DEST/train_gpt-graph.log")
  run "$DEST/torch-eager.log" "$PY" "${tc_args[@]}" --steps "$TIMED" \
    && timed+=(--torch-log "$DEST/torch-eager.log")
fi

echo "=== 4. summary"
if ((${#have_ncu[@]} + ${#have_torch[@]} > 0)); then
  "$PY" scripts/profile_gpt_summary.py "${have_ncu[@]}" "${have_torch[@]}" --warmup "$WARMUP" \
    --steps "$STEPS" --meta "$init/meta.json" "${timed[@]}" --out "$DEST/profile-gpt.md" \
    || failed+=("scripts/profile_gpt_summary.py (on $DEST)")
  [[ -f $DEST/profile-gpt.md ]] && printf 'Run on: %s\n' "$(paste -sd';' "$DEST/versions.txt")" \
    | tee -a "$DEST/profile-gpt.md"
fi
if ((${#failed[@]} > 0)); then
  echo "profile-gpt: ${#failed[@]} command(s) failed:"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "profile-gpt: wrote $DEST/profile-gpt.md"

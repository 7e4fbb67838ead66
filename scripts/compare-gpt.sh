#!/usr/bin/env bash
# gpubind's train_gpt against PyTorch (scripts/torch_gpt.py) on one GPU: the same GPT,
# initial weights, batches, optimizer and schedule (train_gpt --dump-init).
#
#  1. fp32 (TF32 off), --model small, 50 steps: every loss of train_gpt within
#     COMPARE_FP32_TOL (relative, default 0.001) of PyTorch's.
#  2. 500 steps (COMPARE_LONG_STEPS): PyTorch bf16 autocast against train_gpt in bf16 when
#     train_gpt takes --precision bf16, else in fp32; the last loss within 2 %.
#  3. Throughput at --model small and --model gpt2 (COMPARE_GPT2_BATCH, default max):
#     train_gpt eager (and --graph, when it takes it), PyTorch eager (SDPA) and
#     torch.compile, in fp32 and bf16: a markdown table of tokens/s, MFU, peak memory
#     and gpubind's step and submit times (no host synchronisation inside a step). A
#     batch of `max` is, for each precision, the largest power of two at or under
#     train_gpt --max-batch (the largest batch whose buffers fit in the free memory).
#  4. loss-curves.png (matplotlib) of step 2's runs, with the logs and the table, into
#     $OUT (default /tmp/compare-gpt).
#
# Runs on the GPU machine from the repository root, over .gpu-bin/examples/train_gpt
# (scripts/build-gpu-bins.sh). Environment: TRAIN_GPT (the binary), PYTHON (with torch),
# COMPARE_FP32_TOL, COMPARE_LONG_STEPS, COMPARE_BENCH_STEPS (default 30),
# COMPARE_GPT2_BATCH, COMPARE_SKIP_BENCH=1, COMPARE_SKIP_LOSSES=1 (steps 1, 2 and 4 left
# out), COMPARE_SPECS (the throughput runs' "model batch" pairs, comma-separated; default
# "small 8,small 32,gpt2 $COMPARE_GPT2_BATCH"), COMPARE_PRECISIONS (default "fp32 bf16").
# Exit status 1 when a check fails or a run fails.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${TRAIN_GPT:-.gpu-bin/examples/train_gpt}
PY=${PYTHON:-python3}
TOL=${COMPARE_FP32_TOL:-0.001}
LONG=${COMPARE_LONG_STEPS:-500}
BENCH_STEPS=${COMPARE_BENCH_STEPS:-30}
GPT2_BATCH=${COMPARE_GPT2_BATCH:-max}
SPECS=${COMPARE_SPECS:-small 8,small 32,gpt2 $GPT2_BATCH}
PRECISIONS=${COMPARE_PRECISIONS:-fp32 bf16}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
WORK=$(mktemp -d)
DEST=${OUT:-/tmp/compare-gpt}
mkdir -p "$DEST"
[[ -x $BIN ]] || { echo "compare-gpt: no $BIN (run scripts/build-gpu-bins.sh)" >&2; exit 1; }
failed=0
has_bf16=0
"$BIN" --precision bf16 --steps 1 --dump-init "$WORK/probe" >/dev/null 2>&1 && has_bf16=1
has_graph=0
"$BIN" --graph --steps 1 --dump-init "$WORK/probe" >/dev/null 2>&1 && has_graph=1

# Compares two `step S loss L` logs: every step within a relative tolerance, or only the
# last one.
compare() { # name gpubind.log torch.log tol all|last
  "$PY" - "$@" <<'PY'
import re, sys
name, a, b, tol, which = sys.argv[1:6]
def losses(p):
    return {int(m[1]): float(m[2]) for m in re.finditer(r"^step (\d+) loss (\S+)$", open(p).read(), re.M)}
x, y = losses(a), losses(b)
steps = sorted(set(x) & set(y))
if not steps:
    print(f"compare-gpt: {name}: no common steps"); sys.exit(1)
if which == "last":
    steps = steps[-1:]
worst = max(steps, key=lambda s: abs(x[s] - y[s]) / abs(y[s]))
rel = abs(x[worst] - y[worst]) / abs(y[worst])
ok = rel <= float(tol) and len(steps) > 0
print(f"compare-gpt: {name}: {len(steps)} step(s), worst step {worst}: gpubind {x[worst]:.6f} "
      f"torch {y[worst]:.6f} rel {rel:.2e} (tol {tol}) -> {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
}

if [[ ${COMPARE_SKIP_LOSSES:-0} != 1 ]]; then
echo "=== 1. fp32, small, 50 steps"
"$BIN" --model small --steps 50 --dump-init "$WORK/fp32" || failed=1
"$BIN" --model small --steps 50 --log-every 10 2>&1 | tee "$DEST/gpubind-fp32.log"
[[ ${PIPESTATUS[0]} == 0 ]] || failed=1
"$PY" scripts/torch_gpt.py --init "$WORK/fp32" --precision fp32 2>&1 | tee "$DEST/torch-fp32.log"
[[ ${PIPESTATUS[0]} == 0 ]] || failed=1
compare fp32-50 "$DEST/gpubind-fp32.log" "$DEST/torch-fp32.log" "$TOL" all || failed=1

echo "=== 2. $LONG steps: torch bf16 autocast"
prec=fp32
[[ $has_bf16 == 1 ]] && prec=bf16
"$BIN" --model small --steps "$LONG" --dump-init "$WORK/long" || failed=1
"$BIN" --model small --steps "$LONG" --precision $prec --log-every 50 2>&1 | tee "$DEST/gpubind-long.log"
[[ ${PIPESTATUS[0]} == 0 ]] || failed=1
"$PY" scripts/torch_gpt.py --init "$WORK/long" --precision bf16 2>&1 | tee "$DEST/torch-long.log"
[[ ${PIPESTATUS[0]} == 0 ]] || failed=1
compare "gpubind-$prec-vs-torch-bf16-$LONG" "$DEST/gpubind-long.log" "$DEST/torch-long.log" 0.02 last || failed=1

echo "=== 4. loss curves"
"$PY" - "$DEST/gpubind-long.log" "$DEST/torch-long.log" "$DEST/loss-curves.png" "$prec" <<'PY' || failed=1
import re, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
a, b, out, prec = sys.argv[1:5]
def losses(p):
    pts = [(int(m[1]), float(m[2])) for m in re.finditer(r"^step (\d+) loss (\S+)$", open(p).read(), re.M)]
    return [s for s, _ in pts], [l for _, l in pts]
plt.figure(figsize=(8, 5))
plt.plot(*losses(a), label=f"gpubind train_gpt ({prec})", lw=1)
plt.plot(*losses(b), label="PyTorch (bf16 autocast)", lw=1, alpha=0.8)
plt.xlabel("step"); plt.ylabel("training loss"); plt.yscale("log"); plt.legend(); plt.grid(alpha=0.3)
plt.title("GPT small, byte-level Python stdlib")
plt.savefig(out, dpi=120, bbox_inches="tight")
print(f"compare-gpt: wrote {out}")
PY
fi

if [[ ${COMPARE_SKIP_BENCH:-0} != 1 ]]; then
  echo "=== 3. throughput"
  rows=$WORK/rows
  : >"$rows"
  IFS=, read -ra specs <<<"$SPECS"
  for spec in "${specs[@]}"; do
    set -- $spec
    model=$1 want=$2
    for prec in $PRECISIONS; do
      batch=$want
      if [[ $want == max ]]; then
        # The largest power of two at or under train_gpt's largest batch: PyTorch's
        # caching allocator reserves somewhat more than gpubind's buffers at one batch.
        said=$("$BIN" --model "$model" --precision "$prec" --max-batch 2>&1)
        max=$(sed -n 's/^max-batch \([0-9]*\).*/\1/p' <<<"$said")
        [[ ${max:-0} -gt 0 ]] || { echo "compare-gpt: $model $prec: no batch to time: $said"; failed=1; continue; }
        batch=1
        while ((batch * 2 <= max)); do batch=$((batch * 2)); done
        echo "compare-gpt: $model $prec: largest batch $max, timing batch $batch"
      fi
      dir=$WORK/bench-$model-$batch
      [[ -d $dir ]] || "$BIN" --model "$model" --batch "$batch" --steps "$BENCH_STEPS" --dump-init "$dir" >/dev/null || { failed=1; continue; }
      runs=()
      if [[ $prec == fp32 || $has_bf16 == 1 ]]; then
        runs+=("gpubind-eager|$BIN --model $model --batch $batch --steps $BENCH_STEPS --precision $prec --log-every 1000")
        [[ $has_graph == 1 ]] && runs+=("gpubind-graph|$BIN --model $model --batch $batch --steps $BENCH_STEPS --precision $prec --graph --log-every 1000")
      fi
      runs+=("torch-eager|$PY scripts/torch_gpt.py --init $dir --precision $prec")
      runs+=("torch-compile|$PY scripts/torch_gpt.py --init $dir --precision $prec --compile")
      for r in "${runs[@]}"; do
        label=${r%%|*} cmd=${r#*|}
        line=$($cmd 2>&1 | tee "$WORK/$label-$model-$batch-$prec.log" | grep '^RESULT' | tail -1)
        if [[ -z $line ]]; then
          echo "compare-gpt: $label $model b$batch $prec failed (log: $(tail -3 "$WORK/$label-$model-$batch-$prec.log"))"
          failed=1
          continue
        fi
        tps=$(sed -n 's/.*tokens_per_s=\([^ ]*\).*/\1/p' <<<"$line")
        mfu=$(sed -n 's/.* mfu=\([^ ]*\).*/\1/p' <<<"$line")
        mem=$(sed -n 's/.*peak_mem_gib=\([^ ]*\).*/\1/p' <<<"$line")
        step=$(sed -n 's/.* step_ms=\([^ ]*\).*/\1/p' <<<"$line")
        submit=$(sed -n 's/.* submit_ms=\([^ ]*\).*/\1/p' <<<"$line")
        echo "$line"
        printf '| %s | %s | %s | %s | %s | %.1f %% | %s | %s |\n' "$model" "$batch" "$prec" "$label" "$tps" \
          "$(awk -v m="$mfu" 'BEGIN{print 100*m}')" "$mem" "${step:+$step / $submit}" >>"$rows"
      done
    done
  done
  {
    echo
    echo "| model | batch | precision | implementation | tokens/s | MFU | peak memory (GiB) | step / submit (ms) |"
    echo "|---|---|---|---|---|---|---|---|"
    cat "$rows"
    echo
    echo "MFU: fp32 against 67 TFLOP/s, bf16 against 989 TFLOP/s (H200 dense peaks)."
    echo "Peak memory: gpubind, device memory in use (cuMemGetInfo); torch, max_memory_reserved."
    echo "Step / submit: gpubind's wall time per step and the part of it train_step takes to enqueue the step."
  } | tee "$DEST/compare-gpt-table.md"
fi
rm -rf "$WORK"
exit $failed

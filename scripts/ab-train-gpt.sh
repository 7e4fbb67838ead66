#!/usr/bin/env bash
# Which of several train_gpt builds is fastest, on the GPU machine: for kernel work, where
# a change must be timed against the code it replaces in one run on one card.
#
#   bash scripts/ab-train-gpt.sh .gpu-bin/alt/train_gpt_base .gpu-bin/alt/train_gpt_new ...
#
# Build the binaries here with scripts/build-gpt-builds.sh. Each build first runs three
# quick checks (--check-attention-quick: the fused attention kernels against the unfused
# path; --model small: --precision bf16 --check-graph, and --devices 0,0 --check-dp);
# those that pass are timed at --model gpt2 --batch 32 --precision bf16
# --graph (AB_ARGS replaces these), AB_ROUNDS rounds (default 2) interleaved so that clock
# and thermal drift fall on every build alike, AB_STEPS steps each (default 30, the first
# 5 untimed). Prints each run's RESULT line and, last, `ab-train-gpt: fastest NAME
# (mean T tokens/s)`; with AB_PICK set, copies the fastest to that path. Exit status 1
# when no build passes its checks.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
ROUNDS=${AB_ROUNDS:-2} STEPS=${AB_STEPS:-30}
ARGS=${AB_ARGS:---model gpt2 --batch 32 --precision bf16 --graph}
(($# > 0)) || { echo "usage: $0 TRAIN_GPT_BINARY..." >&2; exit 2; }
ok=()
for b in "$@"; do
  a="check-attention-quick: FAIL"
  timeout 120 "$b" --check-attention-quick >/dev/null 2>&1 && a="check-attention-quick: PASS"
  g=$(timeout 60 "$b" --model small --steps 50 --precision bf16 --check-graph 2>&1 | grep -E "check-graph|rror" | tail -1)
  d=$(timeout 60 "$b" --model small --steps 20 --devices 0,0 --check-dp 2>&1 | grep -E "check-dp|rror" | tail -1)
  echo "ab-train-gpt: $b: $a | $g | $d"
  [[ $a == *PASS* && $g == *PASS* && $d == *PASS* ]] && ok+=("$b")
done
((${#ok[@]} > 0)) || { echo "ab-train-gpt: no build passed its checks"; exit 1; }
declare -A sum
for ((round = 1; round <= ROUNDS; round++)); do
  for b in "${ok[@]}"; do
    line=$(timeout 120 "$b" $ARGS --steps "$STEPS" --log-every 1000 2>&1 | grep '^RESULT' | tail -1)
    echo "ab-train-gpt: round $round $b: ${line:-FAILED}"
    tps=$(sed -n 's/.*tokens_per_s=\([0-9]*\).*/\1/p' <<<"$line")
    sum[$b]=$((${sum[$b]:-0} + ${tps:-0}))
  done
done
best=${ok[0]}
for b in "${ok[@]}"; do ((sum[$b] > sum[$best])) && best=$b; done
echo "ab-train-gpt: fastest $best (mean $((sum[$best] / ROUNDS)) tokens/s)"
[[ -n ${AB_PICK:-} ]] && cp "$best" "$AB_PICK"
exit 0

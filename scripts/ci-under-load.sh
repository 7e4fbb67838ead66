#!/usr/bin/env bash
# Runs the test suites of .ci/run (every `cargo test` in it) RUNS times in a row while
# LOAD busy loops keep the machine's cores occupied, and reports each run's outcome.
# Shows that the suites do not depend on an idle machine: their wall-clock bounds come
# from the timeouts they configure.
#
#   scripts/ci-under-load.sh            # 5 runs, one busy loop per core
#   RUNS=3 LOAD=4 scripts/ci-under-load.sh
#
# The suites are built before the first run (not timed, not under load). Each run's
# output is kept in target/ci-under-load/run-N.log. Exits non-zero if any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
LOAD=${LOAD:-$(nproc)}
ALL_FEATURES=$(awk '/^\[features\]/ { f = 1; next } /^\[/ { f = 0 }
    f && /^[A-Za-z0-9_-]+ *=/ && $1 != "default" && $1 !~ /^cuda-/ { print $1 }' Cargo.toml |
    paste -sd, -)
CORE="--no-default-features --features cuda-13000"
# Every suite runs, also after one fails, so a run reports all its failures.
suites() {
    local status=0
    cargo test --features "$ALL_FEATURES" || status=1
    cargo test --test layers || status=1
    cargo test --example gpubench || status=1
    cargo test --example train_mlp || status=1
    cargo test --example train_gpt || status=1
    cargo test $CORE || status=1
    cargo test $CORE,collective --lib --test api_no_gpu || status=1
    return $status
}
echo "building the suites"
suites >/dev/null 2>&1 || { echo "the suites fail without load; run them alone first" >&2; exit 1; }
out=target/ci-under-load
mkdir -p "$out"
pids=()
for _ in $(seq "$LOAD"); do (while :; do :; done) & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
failed=0
for run in $(seq "$RUNS"); do
    start=$(date +%s)
    if suites >"$out/run-$run.log" 2>&1; then verdict=passed; else verdict=FAILED; failed=1; fi
    passed=$(grep -o '[0-9]* passed' "$out/run-$run.log" | awk '{ s += $1 } END { print s + 0 }')
    echo "run $run/$RUNS: $verdict in $(( $(date +%s) - start )) s ($passed tests passed, $LOAD busy loops)"
    [ "$verdict" = FAILED ] && grep -E '^test .* FAILED' "$out/run-$run.log"
done
exit "$failed"

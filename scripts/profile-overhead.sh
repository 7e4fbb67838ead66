#!/usr/bin/env bash
# Host instructions per operation, gpubind against the bare driver call, counted by
# callgrind (repeatable: instructions, not seconds). Runs without a GPU: a stand-in
# libcuda (scripts/stub-cuda/stub_cuda.c, every call succeeds at once) replaces the
# driver, so what is counted is gpubind's own work plus cudarc's lazy symbol lookup, which
# the raw column pays too. With a real driver (STUB=0) the driver's own host work is
# counted as well.
#   bash scripts/profile-overhead.sh            # every case
#   CASES="launch3" bash scripts/profile-overhead.sh
# Each case runs twice (1000 and 3000 iterations); per-op = difference / 2000, so set-up
# and tear-down cancel. Writes callgrind files to target/profile-overhead/ for
# `callgrind_annotate --inclusive=no FILE SOURCE.rs`, SOURCE.rs a file of the path under
# study (line numbers need CARGO_PROFILE_RELEASE_DEBUG=line-tables-only, set below).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "profile-overhead: SKIPPED (valgrind not found)"; exit 0; }
out=target/profile-overhead
mkdir -p "$out"
libdir=""
if [[ ${STUB:-1} == 1 ]]; then
  libdir=$PWD/$out/stub
  mkdir -p "$libdir"
  gcc -O2 -Wall -shared -fPIC -o "$libdir/libcuda.so.1" scripts/stub-cuda/stub_cuda.c
  ln -sf libcuda.so.1 "$libdir/libcuda.so"
fi
CARGO_PROFILE_RELEASE_DEBUG=line-tables-only CARGO_TARGET_DIR=target/profile-build \
  cargo build --release --bench host_ops 2>&1 | grep -E "^error" -A5 || true
bin=$(ls -t target/profile-build/release/deps/host_ops-* | grep -v '\.d$' | head -1)
printf "%-10s %10s %10s %8s\n" case gpubind raw extra
for c in ${CASES:-memset handoff launch0 launch3 temporary}; do
  declare -A per
  for i in gpubind raw; do
    t=()
    for n in 1000 3000; do
      t+=("$(LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} valgrind --tool=callgrind \
        --callgrind-out-file="$out/$c-$i.$n.cg" "$bin" "$c-$i" "$n" 2>&1 |
        awk '/Collected/ {print $4}')")
    done
    per[$i]=$(( (t[1] - t[0]) / 2000 ))
  done
  printf "%-10s %10s %10s %8s\n" "$c" "${per[gpubind]}" "${per[raw]}" "$(( per[gpubind] - per[raw] ))"
done

#!/usr/bin/env bash
# Builds every GPU test binary and example (gpubench included) in release mode and copies
# them, stripped, into .gpu-bin/ (ignored by git) so they can be carried to a GPU machine that
# has no cargo. Then run `bash scripts/gpu-check.sh` there (see README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu-bin && mkdir -p .gpu-bin/tests .gpu-bin/examples
# Test binaries (GPU suites are tests/gpu_*.rs).
cargo test --release --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        name = m["target"]["name"]
        if name.startswith("gpu_"):
            shutil.copy(m["executable"], ".gpu-bin/tests/" + name)
'
# Examples (gpubench is one: the crate has no binaries of its own, so `cargo install`
# installs nothing). Only the unhashed names: the hashed ones are cargo's copies.
# test-seams: bench_collective's table 5 measures the agreement on a made-up collective.
cargo build --release --examples --features test-seams 2>&1 | grep -E "^(error|warning: unused)" || true
for f in target/release/examples/*; do
  [[ -x "$f" && -f "$f" && "$(basename "$f")" != *-* && "$f" != *.d ]] && cp "$f" .gpu-bin/examples/
done
strip .gpu-bin/tests/* .gpu-bin/examples/* 2>/dev/null || true
du -sh .gpu-bin; ls -R .gpu-bin

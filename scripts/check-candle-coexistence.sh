#!/usr/bin/env bash
# Checks that gpubind builds in one dependency tree with a crate that enables cudarc's
# `dynamic-linking`, as candle-core's `cuda` feature does (candle's workspace names
# cudarc 0.19 with default-features = false and features std, cublas, cublaslt, curand,
# driver, nvrtc, f16, cuda-version-from-build-system, dynamic-linking). A scratch crate
# in a temporary directory depends on gpubind (this checkout, by path) and on cudarc
# with those features; `cargo check` proves that cudarc's build script accepts the
# combination (gpubind asks for `fallback-dynamic-loading`, which yields) and that
# gpubind uses nothing that exists only under `dynamic-loading`. Linking would need
# libcuda (and nvcc for cuda-version-from-build-system, which gpubind's default
# cuda-13000 feature overrides here): `cargo check` needs neither.
#   CANDLE_CHECK_GPUBIND=", default-features = false, features = [\"cuda-12040\"]" picks
#   gpubind's features (default: its defaults).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src"
gpubind_features=${CANDLE_CHECK_GPUBIND:-}
cat >"$tmp/Cargo.toml" <<TOML
[package]
name = "candle-like"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
gpubind = { path = "$root" $gpubind_features }
cudarc = { version = "0.19", default-features = false, features = ["std", "cublas", "cublaslt", "curand", "driver", "nvrtc", "f16", "cuda-version-from-build-system", "dynamic-linking"] }

[workspace]
TOML
cat >"$tmp/src/main.rs" <<'RS'
// Both crates' views of the one cudarc: gpubind's API and cudarc's safe API.
fn main() {
    let _ = gpubind::driver_version();
    let _ = cudarc::driver::CudaContext::device_count();
}
RS
cp "$root/Cargo.lock" "$tmp/Cargo.lock"
cd "$tmp"
# The scratch crate shares this checkout's target directory (its dependencies are built).
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" cargo check --quiet "$@"
echo "candle coexistence: gpubind + cudarc dynamic-linking: cargo check ok"

#!/usr/bin/env bash
# Shows gpubind's NVRTC choice (`gpubind::libs`) on a machine without a GPU: the CUDA 12 and
# 13 NVRTC wheels from PyPI side by side, the unversioned libnvrtc.so pointing at 13 (as
# a CUDA 13 dev install leaves it), and a stand-in libcuda whose cuDriverGetVersion says
# $FAKE_CUDA_VERSION. Expect libnvrtc.so.12 for a 12.x driver, libnvrtc.so.13 for 13.x,
# and the override's file with GPUBIND_NVRTC_PATH. Needs pip, gcc and cargo.
set -eu
cd "$(dirname "$0")/.."
W=${NVRTC_WHEELS:-/tmp/gpubind-nvrtc-wheels}
if [[ ! -d $W/cu12 || ! -d $W/cu13 ]]; then
  python3 -m pip download --no-deps -d "$W" nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvrtc
  for w in "$W"/*.whl; do
    case $w in *cu12*) d=$W/cu12 ;; *) d=$W/cu13 ;; esac
    mkdir -p "$d" && (cd "$d" && python3 -m zipfile -e "$w" .)
  done
fi
D12=$(dirname "$(find "$W/cu12" -name 'libnvrtc.so.12' | head -1)")
D13=$(dirname "$(find "$W/cu13" -name 'libnvrtc.so.13' | head -1)")
F=$W/fakecuda && mkdir -p "$F"
printf '#include <stdlib.h>\nint cuDriverGetVersion(int *v) { const char *s = getenv("FAKE_CUDA_VERSION"); *v = s ? atoi(s) : 12080; return 0; }\n' >"$F/fake.c"
gcc -shared -fPIC -o "$F/libcuda.so.1" "$F/fake.c" && ln -sf libcuda.so.1 "$F/libcuda.so"
ln -sf "$D13/libnvrtc.so.13" "$F/libnvrtc.so"
export LD_LIBRARY_PATH=$F:$D13:$D12
for v in 12080 13000; do
  echo "== driver $v"
  FAKE_CUDA_VERSION=$v cargo test -q --test nvrtc_no_gpu -- --nocapture 2>&1 | grep -E "NVRTC:|test result"
done
echo "== driver 13000, GPUBIND_NVRTC_PATH=$D12/libnvrtc.so.12"
FAKE_CUDA_VERSION=13000 GPUBIND_NVRTC_PATH=$D12/libnvrtc.so.12 \
  cargo test -q --test nvrtc_no_gpu -- --nocapture 2>&1 | grep -E "NVRTC:|test result"

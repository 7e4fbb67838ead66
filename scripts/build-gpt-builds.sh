#!/usr/bin/env bash
# Builds train_gpt (release, --features test-seams, stripped) of several git revisions
# into .gpu-bin/alt/train_gpt_NAME, for scripts/ab-train-gpt.sh on the GPU machine:
#
#   bash scripts/build-gpt-builds.sh base=main new=my-branch both=my-merge
#
# Each revision is built in a temporary worktree with this checkout's target directory
# (the dependencies are built once; gpubind and the example again for each). Carry
# .gpu-bin/alt (and .gpu-bin/examples) to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
(($# > 0)) || { echo "usage: $0 NAME=REVISION..." >&2; exit 2; }
root=$PWD
mkdir -p .gpu-bin/alt
for spec in "$@"; do
  name=${spec%%=*} rev=${spec#*=}
  wt=$(mktemp -d)
  trap 'git worktree remove --force "$wt" 2>/dev/null' EXIT
  git worktree add -q --detach "$wt" "$rev"
  (cd "$wt" && CARGO_TARGET_DIR=$root/target cargo build -q --release \
    --example train_gpt --features test-seams)
  cp "$root/target/release/examples/train_gpt" ".gpu-bin/alt/train_gpt_$name"
  strip ".gpu-bin/alt/train_gpt_$name"
  git worktree remove --force "$wt"
  echo "build-gpt-builds: .gpu-bin/alt/train_gpt_$name = $rev ($(git rev-parse --short "$rev"))"
done

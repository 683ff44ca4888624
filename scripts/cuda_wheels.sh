#!/usr/bin/env bash
# Fetch, here, the wheels the GPU machine needs into .whl/ (git-ignored), the way the device
# tool's README says: pip download for CPython 3.12 on manylinux x86-64, no dependencies
# pulled implicitly (each needed one is listed in scripts/cuda_wheels.txt).
#
#   bash scripts/cuda_wheels.sh            # the small pure-Python wheels of cuda_wheels.txt
#   bash scripts/cuda_wheels.sh --torch    # also torch 2.13.0 for CUDA (see the size check)
#
# Then, on the device tool: run `bash scripts/test_cuda.sh` with carry [".whl"].
# Everything that travels (the work tree plus .whl) must stay under 64 MiB: this script
# refuses to leave a larger .whl behind and says what to do instead.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUTCORE_WHEELS:-.whl}
LIMIT=$((64 * 1024 * 1024))
PIP=(python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
     --platform manylinux1_x86_64 -d "$OUT")

# keep .whl/ out of git in every worktree (the exclude file is shared by worktrees)
exclude="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qx "/$OUT/" "$exclude" 2>/dev/null || echo "/$OUT/" >>"$exclude"
mkdir -p "$OUT"

grep -v '^#' scripts/cuda_wheels.txt | while read -r spec _module; do
  [ -n "$spec" ] || continue
  "${PIP[@]}" -q "$spec"
done

if [ "${1:-}" = "--torch" ]; then
  # torch's own CUDA wheel: its dependencies (nvidia-*, triton) are on the GPU image already
  "${PIP[@]}" -q "torch==2.13.0"
fi

size=$(du -sb "$OUT" | cut -f1)
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
echo "cuda_wheels: $(ls "$OUT" | wc -l) wheels, $((size / 1024)) KiB in $OUT; work tree $((tree / 1024)) KiB"
if [ $((size + tree)) -gt $LIMIT ]; then
  echo "cuda_wheels: $OUT and the work tree come to more than the device tool's 64 MiB;" \
       "removing the wheels over the limit (torch's CUDA wheel alone is GBs). Without them" \
       "scripts/test_cuda.sh uses the GPU image's own CUDA torch and says which version." >&2
  find "$OUT" -name 'torch-*.whl' -delete
  exit 1
fi

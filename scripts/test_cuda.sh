#!/usr/bin/env bash
# make test-cuda: the CUDA test suite on a machine with an NVIDIA GPU (docs/cuda.md).
#
# 1. A venv of its own (.venv-cuda, or $OUTCORE_CUDA_VENV) that sees the machine Python's
#    packages (a .pth file: a venv made from another venv would not see them otherwise).
# 2. torch 2.13 with CUDA in it, from the first source that has it:
#    a. the machine Python already has torch 2.13.x with CUDA: used as it is;
#    b. a torch-2.13*.whl in .whl/ (scripts/cuda_wheels.sh --torch), installed offline;
#    c. the package index (not tried with OUTCORE_OFFLINE=1): pip install torch==2.13.0,
#       the CUDA build on Linux x86-64;
#    d. otherwise the machine's own CUDA torch of another version, said loudly at the start
#       and the end of the run (OUTCORE_CUDA_STRICT=1 refuses instead).
# 3. Any test dependency the machine Python lacks, from .whl/ (scripts/cuda_wheels.sh).
# 4. pytest on tests/cuda and tests/devices with OUTCORE_REQUIRE_CUDA=1 (a GPU test that
#    would skip fails instead), outcore from src/ (no install step, no network).
#    Extra arguments go to pytest, e.g. `bash scripts/test_cuda.sh -k oracle -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${OUTCORE_CUDA_VENV:-.venv-cuda}
WHEELS=${OUTCORE_WHEELS:-.whl}
WANT=2.13
say() { echo "test-cuda: $*" >&2; }

if ! nvidia-smi -L >/dev/null 2>&1; then
  say "no NVIDIA GPU here (nvidia-smi -L failed): the CUDA suite needs one; make test skips it"
  exit 2
fi
nvidia-smi -L >&2

# 1. the venv (no pip of its own: the machine Python's pip installs into it, offline-safe)
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --without-pip "$VENV"
fi
VPY=$VENV/bin/python
site=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$PY" -c 'import site, sys; print("\n".join(p for p in site.getsitepackages() + [site.getusersitepackages()] if p))' >"$site/_machine_site.pth"

torch_is() {  # torch_is PREFIX: the venv's torch has CUDA, sees a GPU, version starts PREFIX
  "$VPY" - "$1" <<'PYEOF' 2>/dev/null
import sys, torch
ok = torch.version.cuda is not None and torch.cuda.is_available()
sys.exit(0 if ok and torch.__version__.startswith(sys.argv[1]) else 1)
PYEOF
}

# 2. torch 2.13 with CUDA
if torch_is "$WANT."; then
  say "using the machine's torch $WANT (CUDA)"
elif ls "$WHEELS"/torch-$WANT.*.whl >/dev/null 2>&1; then
  "$VPY" -m pip install -q --no-index --no-deps --no-compile "$WHEELS"/torch-$WANT.*.whl
elif [ -z "${OUTCORE_OFFLINE:-}" ] &&
     "$VPY" -m pip install -q --timeout 20 --retries 0 "torch==$WANT.0" 2>/dev/null; then
  say "installed torch $WANT.0 from the package index"
fi
if ! torch_is "$WANT."; then
  if [ -n "${OUTCORE_CUDA_STRICT:-}" ] || ! torch_is ""; then
    say "no CUDA build of torch $WANT here, none in $WHEELS, none from the index"
    "$VPY" -c 'import torch; print("machine torch:", torch.__version__, torch.version.cuda)' >&2 || true
    exit 3
  fi
  OTHER=$("$VPY" -c 'import torch; print(torch.__version__)')
  say "WARNING: torch $OTHER, not $WANT: no $WANT CUDA wheel could reach this machine" \
      "(the device tool carries 64 MiB; the wheel is GBs). Results hold for torch $OTHER."
fi

# 3. test dependencies the machine lacks, from the carried wheels
grep -v '^#' scripts/cuda_wheels.txt | while read -r spec module; do
  [ -n "$spec" ] || continue
  if ! "$VPY" -c "import $module" 2>/dev/null; then
    name=${spec%%==*}
    say "installing $spec from $WHEELS"
    "$VPY" -m pip install -q --no-index --no-deps --no-compile --find-links "$WHEELS" "$spec" ||
      { say "$name is missing: run bash scripts/cuda_wheels.sh where pip works, carry .whl"; exit 4; }
  fi
done
for module in numpy scipy matplotlib pytest; do
  "$VPY" -c "import $module" || { say "$module is missing on this machine"; exit 4; }
done

# 4. the suite
"$VPY" - <<'PYEOF' >&2
import torch
p = torch.cuda.get_device_properties(0)
print(f"test-cuda: {p.name}, {p.total_memory / 2**30:.1f} GiB, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
PYEOF
status=0
OUTCORE_REQUIRE_CUDA=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONPATH="$PWD/src" \
  "$VPY" -m pytest -p no:cacheprovider -q -rs -m "not slow" tests/cuda tests/devices "$@" || status=$?
if [ -n "${OTHER:-}" ]; then
  say "WARNING: this run used torch $OTHER, not $WANT"
fi
exit $status

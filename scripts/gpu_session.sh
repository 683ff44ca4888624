#!/usr/bin/env bash
# One call of the workplace's device tool, prepared (docs/cuda.md): time-boxed stages run in
# order, each stage's whole log kept under $OUT/logs and packed into $OUT/gpu.tgz (the tool
# brings back at most 8 files), the tail of each printed.
#
#   bash scripts/gpu_session.sh env suite:240 speed:150 calibrate:80
#
# A stage is NAME[:SECONDS]; SECONDS bounds it (timeout, then SIGKILL 5 s later). Stages:
#   env        nvidia-smi, torch and CUDA versions, outcore imported from src/
#   suite      the CUDA suite, scripts/test_cuda.sh (xdist over $WORKERS, default 8); PYTEST_ARGS
#              adds (e.g. --ignore=tests/cuda/test_cuda_allocator_peak.py, run as allocpeak)
#   allocpeak  tests/cuda/test_cuda_allocator_peak.py alone, every test's result in the log
#   vs         benchmarks/vs_pytorch.py --device cuda $VS_ARGS (default: --large GPT, recompute
#              only, without the compile peer and the Inductor rows)
#   vsoffload  the same with --allow-offload (outcore's plans may use the host link)
#   vsm, vsoffloadm  vs and vsoffload with --measured-ops (outcore plans with each op's time
#              measured on the GPU in a step, not the catalogue profile's roofline)
#   speed      benchmarks/cuda_speed.py; SPEED_ARGS (default: GPT-2 at 50%, three policies)
#   calibrate  benchmarks/cuda_calibrate.py, profile written under $OUT/profiles
#   hostmem    benchmarks/host_memory.py --cuda --small
#   inductor   benchmarks/cuda_inductor_check.py $INDUCTOR_ARGS (default: the large GPT):
#              outcore.inductor_backend against eager and torch.compile's activation budget
#   py:FILE    PYTHONPATH=src python3 FILE (a prepared check)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT/logs" "$OUT/profiles"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src"
PY=python3

run_stage() {
  local spec=$1 name kind a b limit log start rc file=""
  IFS=: read -r kind a b <<<"$spec"
  name=$kind limit=${a:-300}
  if [ "$kind" = py ]; then file=$a name="py-$(basename "$a" .py)" limit=${b:-300}; fi
  log="$OUT/logs/$name.log"
  start=$(date +%s)
  echo "=== $name (limit ${limit}s) at $(date +%T)"
  case $spec in
    env*) timeout -k 5 "$limit" bash -c 'nvidia-smi; python3 -c "import torch, sys;
print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0),
torch.backends.cudnn.version()); import outcore; print(\"outcore\", outcore.__version__)"' \
      >"$log" 2>&1 ;;
    suite*) timeout -k 5 "$limit" bash scripts/test_cuda.sh -n "${WORKERS:-8}" -rfEs \
      --tb=short ${PYTEST_ARGS:-} >"$log" 2>&1 ;;
    allocpeak*) timeout -k 5 "$limit" bash scripts/test_cuda.sh -n "${WORKERS:-8}" -v -rfEs \
      --tb=short -k cuda_allocator_peak_never >"$log" 2>&1 ;;
    vsoffloadm*) timeout -k 5 "$limit" $PY benchmarks/vs_pytorch.py --device cuda --allow-offload \
      --measured-ops ${VS_ARGS:---large --models gpt --skip-compile --skip-inductor --rounds 11} \
      --json "$OUT/logs/vsoffloadm.json" >"$log" 2>&1 ;;
    vsm*) timeout -k 5 "$limit" $PY benchmarks/vs_pytorch.py --device cuda --measured-ops \
      ${VS_ARGS:---large --models gpt --skip-compile --skip-inductor --rounds 11} \
      --json "$OUT/logs/vsm.json" >"$log" 2>&1 ;;
    vsoffload*) timeout -k 5 "$limit" $PY benchmarks/vs_pytorch.py --device cuda --allow-offload \
      ${VS_ARGS:---large --models gpt --skip-compile --skip-inductor --rounds 11} \
      --json "$OUT/logs/vsoffload.json" >"$log" 2>&1 ;;
    vs*) timeout -k 5 "$limit" $PY benchmarks/vs_pytorch.py --device cuda \
      ${VS_ARGS:---large --models gpt --skip-compile --skip-inductor --rounds 11} \
      --json "$OUT/logs/vs.json" >"$log" 2>&1 ;;
    speed*) timeout -k 5 "$limit" $PY benchmarks/cuda_speed.py \
      ${SPEED_ARGS:---models gpt2 --budgets 0.5 --policies outcore-auto offload-all recompute-cheap --skip-compile --steps 5 --warmup 2} \
      --json "$OUT/logs/speed.json" >"$log" 2>&1 ;;
    calibrate*) timeout -k 5 "$limit" $PY benchmarks/cuda_calibrate.py --out "$OUT/profiles" \
      ${CALIBRATE_ARGS:-} >"$log" 2>&1 ;;
    inductor*) timeout -k 5 "$limit" $PY benchmarks/cuda_inductor_check.py \
      ${INDUCTOR_ARGS:---size large --rounds 11} --json "$OUT/logs/inductor.json" >"$log" 2>&1 ;;
    hostmem*) timeout -k 5 "$limit" $PY benchmarks/host_memory.py --cuda --small >"$log" 2>&1 ;;
    py:*) timeout -k 5 "$limit" $PY "$file" >"$log" 2>&1 ;;
    *) echo "unknown stage $spec" >"$log"; false ;;
  esac
  rc=$?
  echo "=== $name rc=$rc in $(( $(date +%s) - start ))s"
  tail -n "${TAIL:-25}" "$log"
}

for spec in "$@"; do
  run_stage "$spec"
done
tar -czf "$OUT/gpu.tgz" -C "$OUT" logs profiles 2>/dev/null
echo "=== packed $(du -h "$OUT/gpu.tgz" | cut -f1) into gpu.tgz"

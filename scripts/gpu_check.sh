#!/usr/bin/env bash
# The vLLM connector's GPU path on real CUDA tensors: layouts, staging, copies, bandwidth.
#
#   bash scripts/gpu_check.sh --fetch-wheels  # here, once: the wheels a torch-only GPU box lacks -> .whl/
#   bash scripts/gpu_check.sh                 # on the CUDA machine (torch, no vLLM), with .whl carried
#   bash scripts/gpu_check.sh --dry           # anywhere, no GPU: the same steps on CPU, small sizes
#
# On the GPU machine it (1) installs the carried wheels into a scratch dir, (2) runs the
# data-path unit tests (tests/vllm/test_transfer_units.py, test_worker_units.py) on cuda:
# vLLM 0.32's FlashAttention (LBNHC) and CPU (LBHNC) layouts and the old K/V-first one,
# pinned staging, the load stream, per-layer events, cancellation, a real sidecar;
# (3) measures save and load GB/s through a real sidecar next to a pinned host<->device
# copy_ of the same bytes (tests/vllm/bench_transfer.py) for the TTFT benchmark's model
# and an 8B-class layout (32 layers, 8 KV heads of 128, block 16, bf16: 1 GiB per 8k
# tokens); (4) prints a short report (also written to $OUT/gpu_check.md when $OUT is
# set). About 2-4 minutes on an H100-class machine. Exit status: 0 only if every step
# ran to its end (an abort is a failure) and, on the GPU, save and load reached 70% of a
# pinned device-to-host / host-to-device copy of the same bytes in every shape
# (scripts/gpu_check_eval.py decides; --dry prints the ratios without enforcing them).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
MODE=device
case "${1:-}" in
  --dry) MODE=dry ;;
  --fetch-wheels) MODE=fetch ;;
  "") ;;
  *) echo "usage: $0 [--dry | --fetch-wheels]" >&2; exit 2 ;;
esac

# What the GPU image lacks (or has too old for the generated gRPC/protobuf code), pinned
# to the versions the project's venv runs. Python 3.12 manylinux x86_64 wheels.
WHEELS="grpcio==1.85.3 protobuf==6.33.6 grpcio-health-checking==1.81.1 grpcio-reflection==1.81.1
cbor2==6.3.0 msgspec==0.23.0 pyzmq==27.3.0 redis==8.1.0 prometheus-client==0.26.0
pytest-asyncio==1.5.0 xxhash==4.1.0"

if [ "$MODE" = fetch ]; then
  # .whl/ is in .gitignore: it travels to the GPU machine only when carried.
  mkdir -p .whl
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl $WHEELS
  ls -la .whl
  du -sh .whl
  exit 0
fi

LINKS=()
cleanup() {
  for l in "${LINKS[@]:-}"; do
    if [ -n "$l" ]; then rm -f "$l"; fi
  done
  return 0
}
trap cleanup EXIT

if [ "$MODE" = dry ]; then
  PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
  DEVICE=cpu
  SHAPES=("--layout LBHNC --blocks 16 --layers 2 --heads 2 --head-dim 32 --block-size 32 --repeats 2"
          "--layout LBNHC --blocks 16 --layers 2 --heads 2 --head-dim 32 --block-size 32 --repeats 2")
  TESTS=(tests/vllm/test_transfer_units.py tests/vllm/test_worker_units.py
         -k "movers or staged or round_trip_in_every or another_engine")
else
  PY=${PYTHON:-python3}
  if ls .whl/*.whl >/dev/null 2>&1; then
    SITE=/tmp/kvstore-gpu-site
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
  # Without an editable install, kvstore.connectors / kvstore.policies are not mapped
  # onto connectors/ and policies/: link them (removed again on exit).
  if ! "$PY" -c "import kvstore.connectors.vllm.layout" >/dev/null 2>&1; then
    for pkg in connectors policies; do
      [ -e "kvstore/$pkg" ] || { ln -s "../$pkg" "kvstore/$pkg"; LINKS+=("kvstore/$pkg"); }
    done
  fi
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device here; run with --dry for the CPU form" >&2
    exit 1
  fi
  DEVICE=cuda
  SHAPES=("--layout LBNHC --dtype bfloat16"
          "--layout LBHNC --dtype bfloat16"
          "--layout LBNHC --dtype bfloat16 --layers 32 --heads 8 --head-dim 128 --block-size 16 --blocks 512 --dram 4GiB"
          "--layout kv-first --dtype bfloat16 --blocks 64")
  TESTS=(tests/vllm/test_transfer_units.py tests/vllm/test_worker_units.py tests/server/test_inplace.py)
fi

WORK=$(mktemp -d)
REPORT="$WORK/report.md"
{
  echo "# gpu_check ($MODE, device $DEVICE)"
  echo
  "$PY" - <<'EOF'
import platform, torch
dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA device: {dev}")
EOF
} | tee "$REPORT"

echo "== unit tests on $DEVICE" | tee -a "$REPORT"
# Each step leaves its exit status and output in $WORK; scripts/gpu_check_eval.py turns
# them into the verdict. A crash of any step is a failure, an abort (SIGABRT, rc 134)
# after every test passed included: what the process would have done after is unknown.
rc=0
PYTHONFAULTHANDLER=1 KVSTORE_TEST_DEVICE=$DEVICE "$PY" -m pytest -q -p no:cacheprovider \
    --basetemp "$WORK/tmp" --junitxml "$WORK/junit.xml" "${TESTS[@]}" \
    > "$WORK/pytest.log" 2>&1 || rc=$?
echo "$rc" > "$WORK/pytest.rc"
if [ "$rc" = 0 ]; then
  grep -E '[0-9]+ passed' "$WORK/pytest.log" | tail -1 | tee -a "$REPORT"
else
  tail -40 "$WORK/pytest.log" | tee -a "$REPORT"
  grep -m3 -E 'terminate called|Fatal Python error' "$WORK/pytest.log" | tee -a "$REPORT" || true
fi

echo "== save / load through a real sidecar vs plain copies" | tee -a "$REPORT"
: > "$WORK/bench.status"
for shape in "${SHAPES[@]}"; do
  rc=0
  # shellcheck disable=SC2086
  "$PY" tests/vllm/bench_transfer.py --device "$DEVICE" $shape > "$WORK/bench.out" \
      2> "$WORK/bench.err" || rc=$?
  echo "$rc $shape" >> "$WORK/bench.status"
  grep '^{' "$WORK/bench.out" >> "$WORK/bench.jsonl" || true
  if [ "$rc" != 0 ]; then
    echo "bench rc $rc: $shape" | tee -a "$REPORT"
    tail -20 "$WORK/bench.err" | tee -a "$REPORT"
  fi
done
rc=0
"$PY" scripts/gpu_check_eval.py "$WORK" --mode "$MODE" | tee -a "$REPORT" || rc=$?
status=$rc
echo "== gpu_check $([ $status = 0 ] && echo passed || echo FAILED)" | tee -a "$REPORT"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  cp "$REPORT" "$OUT/gpu_check.md"
  cp "$WORK/bench.jsonl" "$OUT/gpu_check_bench.jsonl" 2>/dev/null || true
  cp "$WORK/pytest.log" "$OUT/gpu_check_pytest.log"
fi
exit $status

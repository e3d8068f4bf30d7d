#!/usr/bin/env bash
# Set up from nothing and run the sidecar on its embedded defaults
# (DRAM + disk under ./kvstore-data, gRPC on 127.0.0.1:50051, metrics on :9100).
# Extra arguments go to `kvstore serve`. Installs only what the service needs into
# .venv-serve (no torch, vLLM, LMCache or test tools; scripts/test.sh builds those).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh --serve
exec .venv-serve/bin/kvstore serve "$@"

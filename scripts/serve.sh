#!/usr/bin/env bash
# Set up from nothing and run the sidecar on its embedded defaults
# (DRAM + disk under ./kvstore-data, gRPC on 127.0.0.1:50051, metrics on :9100).
# Extra arguments go to `kvstore serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
KVSTORE_SKIP_VLLM=1 bash scripts/setup-venv.sh
exec .venv/bin/kvstore serve "$@"

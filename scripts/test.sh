#!/usr/bin/env bash
# Set up from nothing and run the whole test suite (the README's test command;
# .ci/run calls exactly this). Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh || exit 1
if [ -x .venv-vllm/bin/python ] && [ "${KVSTORE_SKIP_VLLM:-0}" != "1" ]; then
  export KVSTORE_VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
fi
if [ -x .venv-lmcache/bin/python ] && [ "${KVSTORE_SKIP_LMCACHE:-0}" != "1" ]; then
  export KVSTORE_LMCACHE_PYTHON="$PWD/.venv-lmcache/bin/python"
fi
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"

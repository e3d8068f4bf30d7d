"""Fixtures for the event tests: block metadata, loopback endpoints, the vLLM interpreter."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvstore.hashing import PrefixHasher
from kvstore.types import BlockKey, BlockMeta

HERE = Path(__file__).parent
REPO = HERE.parent.parent

#: ZMQ binds loopback on a free port for ``tcp://127.0.0.1:*``.
LOOPBACK_ANY = "tcp://127.0.0.1:*"


def chain(tokens: list[int], block_size: int = 32, namespace: str = "m") -> list[BlockMeta]:
    """BlockMeta for each full block of ``tokens``, hashed like vLLM (seed "0")."""
    hasher = PrefixHasher(block_size, "sha256_cbor", seed="0")
    metas: list[BlockMeta] = []
    parent: bytes | None = None
    for i, h in enumerate(hasher.iter_hashes(tokens)):
        block = tuple(tokens[i * block_size : (i + 1) * block_size])
        metas.append(BlockMeta(BlockKey(namespace, h), parent, block, 1024, 0))
        parent = h
    return metas


@pytest.fixture(scope="session")
def vllm_py(vllm_python: str) -> str:
    """The vLLM interpreter (the top-level ``vllm_python`` fixture skips without one)."""
    return vllm_python


def vllm_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(
        PYTHONHASHSEED="0",
        PYTHONPATH=str(REPO),
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_LOGGING_LEVEL="WARNING",
    )
    return env


def run_golden(python: str, command: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    proc = subprocess.run(
        [python, str(HERE / "vllm_golden.py")],
        input=json.dumps(command),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=vllm_env(),
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"vllm_golden.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


__all__ = ["LOOPBACK_ANY", "REPO", "chain", "run_golden", "vllm_env"]

"""The committed stubs match proto/ and import under protobuf 6.x and 7.x."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

IMPORT = (
    "import google.protobuf as p; "
    "from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb, kvstore_pb2_grpc; "
    "m = pb.PutRequest(namespace='n', blocks=[pb.Block(payload=b'x')]); "
    "assert pb.PutRequest.FromString(m.SerializeToString()) == m; "
    "print(p.__version__)"
)


def _run(extra_path: str | None) -> str:
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join([extra_path, str(REPO)])
    out = subprocess.run([sys.executable, "-c", IMPORT], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_stubs_import_under_protobuf_6():
    assert _run(None).startswith("6.")


def test_stubs_import_under_protobuf_7():
    side = REPO / ".venv" / "protobuf7"
    if not side.exists():
        pytest.skip("no side install of protobuf 7 (scripts/setup-venv.sh makes .venv/protobuf7)")
    assert _run(str(side)).startswith("7.")


def test_stubs_are_generated_from_the_proto(tmp_path):
    pytest.importorskip("grpc_tools")
    out = tmp_path / "gen"
    out.mkdir()
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO / 'proto'}",
                    f"--python_out={out}", str(REPO / "proto/kvstore/v1/kvstore.proto")],
                   check=True, timeout=120)
    fresh = (out / "kvstore/v1/kvstore_pb2.py").read_text()
    committed = Path(REPO / "kvstore/_proto/kvstore/v1/kvstore_pb2.py").read_text()
    assert fresh == committed, "run scripts/gen_proto.sh after editing proto/"

#!/usr/bin/env bash
# Regenerate the committed gRPC stubs from proto/ (grpcio-tools 1.78.0, the test extra's
# pin: its code imports under protobuf 6.x and 7.x, and under grpcio 1.78.0, which
# LMCache 0.5.6 pins; a newer generator would demand a newer grpcio).
set -euo pipefail
cd "$(dirname "$0")/.."
out=kvstore/_proto
rm -rf "$out/kvstore"
python -m grpc_tools.protoc -Iproto --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  proto/kvstore/v1/kvstore.proto
# Generated code imports `kvstore.v1...`; make it package-relative.
sed -i 's/^from kvstore\.v1 import kvstore_pb2/from kvstore._proto.kvstore.v1 import kvstore_pb2/' \
  "$out/kvstore/v1/kvstore_pb2_grpc.py"
touch "$out/__init__.py" "$out/kvstore/__init__.py" "$out/kvstore/v1/__init__.py"

#!/usr/bin/env bash
# Regenerates the protobuf modules from npumanager/proto/v1/*.proto.
# The generated files are committed, so users need no protoc.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. npumanager/proto/v1/*.proto
echo "generated: $(ls npumanager/proto/v1/*_pb2.py | tr '\n' ' ')"

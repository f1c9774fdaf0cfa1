#!/usr/bin/env bash
# kvrail beside Mooncake Transfer Engine and NIXL on the same paged KV moves (tools/bench/versus.py;
# its --help says what runs and how it is measured). Builds kvraild, libkvrail.so and the Python
# package's protobuf modules with Bazel, gets the pinned PyPI venv from deploy/pyvenv.sh, and runs
# the benchmark with the venv's python. Scenario B needs root (network namespaces).
#   tools/bench/versus.sh [--scenario A|B|AB|C] [--quick] [--json F] [--plot F.png] [...]
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=$(deploy/pyvenv.sh)
bazel build //daemon:kvraild //client/c_api:libkvrail.so //python:protos >&2
bin=$PWD/bazel-bin  # the workspace's symlink: no second bazel call to queue behind others
stage=$(mktemp -d -t kvrail-versus-pkg.XXXXXX)
trap 'rm -rf "$stage"' EXIT
# The kvrail package as the runfiles have it: python/kvrail plus the generated kvrail/proto.
cp -r python/kvrail "$stage/"
cp "$bin"/python/kvrail/proto/*_pb2.py "$stage/kvrail/proto/"
"$venv/bin/python" tools/bench/versus.py --python "$venv/bin/python" \
  --kvraild "$bin/daemon/kvraild" --kvrail-lib "$bin/client/c_api/libkvrail.so" \
  --kvrail-python "$stage" "$@"

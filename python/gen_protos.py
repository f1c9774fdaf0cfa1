#!/usr/bin/env python3
"""Generates kvrail/proto/*_pb2.py from proto/kvrail/v1/*.proto with the system protoc.

Used by Bazel (//python:protos) and by setup.py when the package is built from the tree. protoc
names imports after the .proto paths ("from proto.kvrail.v1 import region_pb2"); they are
rewritten to the package ("from kvrail.proto import region_pb2"). The descriptors keep their
file names (proto/kvrail/v1/region.proto), the same as the C++ library's, so both can live in one
process.

  gen_protos.py --root REPO_ROOT --out DIR [PROTO...]   (PROTO relative to REPO_ROOT)
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

# The messages the Python package uses, and what they import (the client API only: the peer
# protocol, daemon to daemon, is not shipped).
DEFAULT_PROTOS = [
    "proto/kvrail/v1/region.proto",
    "proto/kvrail/v1/config.proto",
    "proto/kvrail/v1/topology.proto",
    "proto/kvrail/v1/transfer.proto",
    "proto/kvrail/v1/admin.proto",
]

_IMPORT = re.compile(r"^from proto\.kvrail\.v1 import (\w+_pb2)", re.MULTILINE)


def generate(root: str, out: str, protos: list) -> list:
    """Runs protoc over `protos`, writes the rewritten modules into `out`; returns their paths."""
    protoc = shutil.which("protoc")
    if protoc is None:
        raise RuntimeError("protoc not found (Debian: apt-get install protobuf-compiler)")
    os.makedirs(out, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([protoc, "-I" + root, "--python_out=" + tmp]
                       + [os.path.join(root, p) for p in protos], check=True)
        for proto in protos:
            module = os.path.basename(proto)[: -len(".proto")] + "_pb2.py"
            with open(os.path.join(tmp, os.path.dirname(proto), module)) as f:
                text = f.read()
            text = _IMPORT.sub(r"from kvrail.proto import \1", text)
            path = os.path.join(out, module)
            with open(path, "w") as f:
                f.write(text)
            written.append(path)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="repository root (holds proto/)")
    parser.add_argument("--out", required=True, help="where the *_pb2.py files go")
    parser.add_argument("protos", nargs="*", default=DEFAULT_PROTOS)
    args = parser.parse_args()
    generate(args.root, args.out, args.protos or DEFAULT_PROTOS)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build steps pyproject.toml cannot express: generate the protobuf modules and bundle
libkvrail.so, so an installed package finds both next to itself.

libkvrail.so comes from $KVRAIL_LIB, else the tree's Bazel output
(bazel-bin/client/c_api/libkvrail.so); the build fails naming both when neither exists.
"""
import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _library() -> str:
    candidates = [os.environ.get("KVRAIL_LIB", ""),
                  os.path.join(ROOT, "bazel-bin", "client", "c_api", "libkvrail.so")]
    for path in candidates:
        if path and os.path.isfile(path):
            return path
    raise SystemExit("libkvrail.so not found: build it (bazel build //client/c_api:libkvrail.so) "
                     "or set KVRAIL_LIB; looked at " + ", ".join(p for p in candidates if p))


class BuildPy(build_py):
    """build_py, then the generated protos and the library into the build tree."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "kvrail")
        sys.path.insert(0, HERE)
        import gen_protos  # noqa: E402 (next to this file)
        gen_protos.generate(ROOT, os.path.join(target, "proto"), gen_protos.DEFAULT_PROTOS)
        shutil.copyfile(_library(), os.path.join(target, "libkvrail.so"))


class BinaryDistribution(Distribution):
    """The wheel carries a native library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution)

#!/usr/bin/env python3
"""Finds debug and trace lines whose arguments are built whether or not the line is written.

spdlog::debug(...) and spdlog::trace(...) take their arguments already evaluated: a plan's
description, a joined list or a printed status is built on every call, below the level too (at
every transfer's admission, on the thread the client's acknowledgement waits for). Debug lines
go through KVRAIL_DEBUG (base/logging.h), which evaluates them only when debug is written.

Reads every git-tracked C++ and CUDA source (*.cc *.h *.cu *.cuh) but base/logging.h, where the
macro is defined, and base/logging_test.cc, which shows spdlog's own call writes nothing; prints
`FILE:LINE: spdlog::debug( ...` for each call found.

Usage:
  debug_log_lint.py --root DIR   every tracked source under DIR (git ls-files)
  debug_log_lint.py FILE...      just these files
Exits 1 when a call is found, 2 on a usage error or when DIR is not a git checkout.
"""
import argparse
import re
import sys

from lint_files import add_arguments, files_to_read

PATTERNS = ["*.cc", "*.h", "*.cu", "*.cuh"]
EXEMPT = {"base/logging.h", "base/logging_test.cc"}
CALL = re.compile(r"\bspdlog::(debug|trace)\s*\(")


def findings(path, shown):
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if CALL.search(line) and not line.lstrip().startswith("//"):
                out.append(f"{shown}:{number}: {line.strip()}")
    return out


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, "C++ source")
    args = parser.parse_args(argv)
    pairs = files_to_read(args, parser, "debug_log_lint.py", PATTERNS, EXEMPT)
    if pairs is None:
        return 2
    found = []
    for path, shown in pairs:
        found += findings(path, shown)
    for line in found:
        print(line + "   (use KVRAIL_DEBUG: its arguments are built only when debug is written)")
    print(f"{len(pairs)} files read, {len(found)} debug or trace calls outside KVRAIL_DEBUG")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

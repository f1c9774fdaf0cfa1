#!/usr/bin/env python3
"""Finds source files longer than the house style allows (files split long before 1,000 lines).

Reads every git-tracked source file (*.cc *.h *.cu *.cuh *.py *.sh *.proto) and prints
`FILE: N lines (most allowed M)` for each one over the limit, longest first. There is no
allowlist: a file past the limit is split by responsibility, never excused.

A line is what ends in a newline, plus a last line without one (so a file of 1,001 lines fails
whether or not it ends in a newline).

Usage:
  file_length_lint.py --root DIR [--max N]   every tracked source file under DIR (git ls-files)
  file_length_lint.py [--max N] FILE...      just these files (whatever their suffix)
Exits 1 when a file is over the limit, 2 on a usage error or when DIR is not a git checkout.
"""
import argparse
import sys

from lint_files import add_arguments, files_to_read

MAX_LINES = 1000
SOURCE_PATTERNS = ["*.cc", "*.h", "*.cu", "*.cuh", "*.py", "*.sh", "*.proto"]


def count_lines(path):
    with open(path, "rb") as f:
        data = f.read()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, "source file")
    parser.add_argument("--max", type=int, default=MAX_LINES, help="most lines allowed")
    args = parser.parse_args(argv)
    files = files_to_read(args, parser, "file_length_lint.py", SOURCE_PATTERNS)
    if files is None:
        return 2
    over = []
    for path, name in files:
        n = count_lines(path)
        if n > args.max:
            over.append((n, name))
    for n, name in sorted(over, key=lambda x: (-x[0], x[1])):
        print(f"{name}: {n} lines (most allowed {args.max}): split it by responsibility")
    print(f"{len(files)} files read, {len(over)} over {args.max} lines")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

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
import subprocess
import sys

MAX_LINES = 1000
SOURCE_PATTERNS = ["*.cc", "*.h", "*.cu", "*.cuh", "*.py", "*.sh", "*.proto"]


def count_lines(path):
    with open(path, "rb") as f:
        data = f.read()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def tracked_sources(root):
    """The tracked source files under `root`, relative to it; None when it is not a checkout."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--"] + SOURCE_PATTERNS,
                             check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="a git checkout: every tracked source file is read")
    parser.add_argument("--max", type=int, default=MAX_LINES, help="most lines allowed")
    parser.add_argument("files", nargs="*")
    args = parser.parse_args(argv)
    if bool(args.root) == bool(args.files):
        parser.print_usage(sys.stderr)
        print("file_length_lint.py: give --root DIR or files, not both", file=sys.stderr)
        return 2
    if args.root:
        paths = tracked_sources(args.root)
        if paths is None:
            print(f"file_length_lint.py: {args.root} is not a git checkout", file=sys.stderr)
            return 2
        shown = {f"{args.root}/{p}": p for p in paths}
    else:
        shown = {p: p for p in args.files}
    over = []
    for path, name in shown.items():
        try:
            n = count_lines(path)
        except OSError:
            continue  # tracked but deleted in the work tree: nothing to read
        if n > args.max:
            over.append((n, name))
    for n, name in sorted(over, key=lambda x: (-x[0], x[1])):
        print(f"{name}: {n} lines (most allowed {args.max}): split it by responsibility")
    print(f"{len(shown)} files read, {len(over)} over {args.max} lines")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

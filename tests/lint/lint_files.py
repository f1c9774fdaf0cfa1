"""What a checkout lint reads: the git-tracked files of a checkout that match its patterns
(--root DIR), or the files named on its command line. Shared by file_length_lint.py and
debug_log_lint.py (imported from beside them)."""
import argparse
import os
import subprocess
import sys
from typing import Iterable, List, Optional, Tuple


def tracked(root: str, patterns: List[str]) -> Optional[List[str]]:
    """The tracked files under `root` matching `patterns`, relative to it; None when it is not a
    git checkout."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--"] + patterns, check=True,
                             capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]


def add_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--root", help=f"a git checkout: every tracked {what} is read")
    parser.add_argument("files", nargs="*")


def files_to_read(args: argparse.Namespace, parser: argparse.ArgumentParser, tool: str,
                  patterns: List[str],
                  exempt: Iterable[str] = ()) -> Optional[List[Tuple[str, str]]]:
    """(path to open, name to show) of each file to read: with args.root, its tracked files
    matching `patterns` but `exempt` (a tracked file deleted from the work tree is not read);
    else args.files. None, after printing why, on a usage error or when the root is no
    checkout (the lint exits 2)."""
    if bool(args.root) == bool(args.files):
        parser.print_usage(sys.stderr)
        print(f"{tool}: give --root DIR or files, not both", file=sys.stderr)
        return None
    if not args.root:
        return [(p, p) for p in args.files]
    paths = tracked(args.root, patterns)
    if paths is None:
        print(f"{tool}: {args.root} is not a git checkout", file=sys.stderr)
        return None
    skip = set(exempt)
    return [(f"{args.root}/{p}", p) for p in paths
            if p not in skip and os.path.isfile(f"{args.root}/{p}")]

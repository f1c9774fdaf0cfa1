#!/usr/bin/env python3
"""Finds project history in code: tracker issue, session and wave numbers, helper names.

Code and its comments state contracts and reasons; where a figure or a decision came from belongs
in the tracker and the commit log, and current figures in docs/. This lint reads source files
(C++, CUDA, Python, shell, BUILD/bzl, proto, textproto, and the YAML under deploy/) and the paths
of every tracked file, and prints FILE:LINE: TEXT for each reference it finds:
  - an issue number: the word "issue" (or "issues") followed by a number, with or without a
    space, "#", "_" or "-" between ("issue N", "Issue #N", "issueN_bench", N a number);
  - a session number: "session" followed by a number of two or more digits. One digit is left
    alone: session 0 is the wire protocol's anonymous session and tests name sessions 1 and 2;
    the all-capitals SESSION token of the greeting is the wire format, never a hit;
  - a wave number: "wave" followed by a number;
  - a helper's name: "helper" followed by a number, or the word "agent" prefixed by "sub" (with
    or without a hyphen).
The word before must not end in a letter ("tissue" and a number is no hit). docs/*.md are not
read: pages may cite dates and commands. Their file names are still checked.

An allowlist holds the true exceptions, one a line: `PATH: MATCHED TEXT  # reason`. An entry
matches every hit in PATH whose matched text is exactly MATCHED TEXT (case as found); an entry
that matches nothing is itself a finding, so the list cannot go stale.

Usage:
  history_refs_lint.py --root DIR [--allowlist FILE]   every tracked file under DIR (git ls-files)
  history_refs_lint.py FILE...                          just these files (contents and names)
Exits 1 when anything is found, 2 on a usage error or when DIR is not a git checkout.
"""
import os
import re
import subprocess
import sys

PATTERNS = [
    ("issue number", re.compile(r"(?<![A-Za-z])issues?[ _#-]*\d+", re.I)),
    ("session number", re.compile(r"(?<![A-Za-z])(?:session|Session)[ _#-]?\d{2,}(?!\d)")),
    ("wave number", re.compile(r"(?<![A-Za-z])waves?[ _#-]*\d+", re.I)),
    ("helper name", re.compile(r"(?<![A-Za-z])(?:helper[ _-]?\d+|sub-?agents?)(?![A-Za-z])", re.I)),
]

SOURCE_SUFFIXES = (".cc", ".h", ".cu", ".cuh", ".c", ".cpp", ".hpp", ".py", ".pyi", ".sh",
                   ".bzl", ".bazel", ".proto", ".textproto")
SOURCE_NAMES = ("BUILD", "WORKSPACE", "MODULE.bazel")


def is_source(path):
    name = os.path.basename(path)
    if name in SOURCE_NAMES or path.endswith(SOURCE_SUFFIXES):
        return True
    return path.startswith("deploy/") and path.endswith((".yaml", ".yml"))


def hits_in(text):
    """(kind, matched text) for each reference in one line."""
    out = []
    for kind, pattern in PATTERNS:
        for m in pattern.finditer(text):
            out.append((kind, m.group(0)))
    return out


def scan(root, paths):
    """Every hit as (path, line, kind, matched, text); line 0 is the file's name."""
    found = []
    for path in paths:
        for kind, matched in hits_in(path):
            found.append((path, 0, kind, matched, path))
        if not is_source(path):
            continue
        full = os.path.join(root, path) if root else path
        try:
            with open(full, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except (FileNotFoundError, IsADirectoryError):
            continue  # deleted in the work tree but still tracked, or a submodule
        for number, line in enumerate(lines, 1):
            for kind, matched in hits_in(line):
                found.append((path, number, kind, matched, line.strip()))
    return found


def read_allowlist(path):
    entries = []
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip() or raw.lstrip().startswith("#"):
                continue
            line, sep, reason = raw.partition("  # ")
            if ": " not in line or not sep or not reason.strip():
                raise ValueError(
                    f"{path}:{number}: want `PATH: MATCHED TEXT  # reason`: {raw.strip()}")
            file_path, matched = line.split(": ", 1)
            entries.append((file_path.strip(), matched.strip(), number))
    return entries


def tracked_files(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                         stdout=subprocess.PIPE).stdout.decode("utf-8", "replace")
    return [p for p in out.split("\0") if p]


def main(argv):
    args = argv[1:]
    root, allowlist = None, None
    while args and args[0].startswith("--"):
        if args[0] == "--root" and len(args) > 1:
            root, args = args[1], args[2:]
        elif args[0] == "--allowlist" and len(args) > 1:
            allowlist, args = args[1], args[2:]
        else:
            print(__doc__, file=sys.stderr)
            return 2
    if root is None and not args:
        print(__doc__, file=sys.stderr)
        return 2
    if root is not None:
        if not os.path.isdir(os.path.join(root, ".git")) and not os.path.isfile(
                os.path.join(root, ".git")):
            print(f"history_refs_lint: {root} is not a git checkout", file=sys.stderr)
            return 2
        paths = tracked_files(root)
    else:
        paths = args
    found = scan(root, paths)
    entries = read_allowlist(allowlist) if allowlist else []
    used = set()
    problems = []
    allowed_hits = 0
    for path, number, kind, matched, text in found:
        allowed = [e for e in entries if e[0] == path and e[1] == matched]
        if allowed:
            used.update(e[2] for e in allowed)
            allowed_hits += 1
            continue
        where = f"{path}:{number}" if number else f"{path} (file name)"
        problems.append(f"{where}: {kind} {matched!r}: {text[:160]}")
    for file_path, matched, number in entries:
        if number not in used:
            problems.append(f"{allowlist}:{number}: allowlist entry matches nothing: "
                            f"{file_path}: {matched}")
    for line in problems:
        print(line)
    print(f"{len(paths)} files checked, {len(problems)} findings, {allowed_hits} allowlisted")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

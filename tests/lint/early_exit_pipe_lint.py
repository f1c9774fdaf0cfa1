#!/usr/bin/env python3
"""Flags pipelines that can fail by themselves in shell scripts run with errexit + pipefail.

`producer | grep -q PATTERN` (or `| head`, `| grep -m N`, `| awk '... exit'`): the reader exits at its first match; a
producer that writes again afterwards dies of SIGPIPE (status 141), and under pipefail the whole
pipeline is false although the pattern was there. Whether the producer writes again after the
reader left is a race, so such a check passes on one machine and fails on another (oci_test failed
in CI so: `tar -tvzf layer | grep -q ...`, tar writing one line per entry). The safe form reads
the whole output first: `grep -q PATTERN <<<"$(producer)"`.

Usage: early_exit_pipe_lint.py SCRIPT...; prints each finding as FILE:LINE and exits 1 if any.
Only scripts that set both errexit and pipefail are checked (elsewhere the status is not acted on).
"""
import re
import sys

STRICT = re.compile(r"^\s*set\s+-[a-z]*e[a-z]*o\s+pipefail|^\s*set\s+-o\s+errexit", re.M)
PIPEFAIL = re.compile(r"pipefail")
# A pipe (not ||) into a reader that may stop reading before the producer is done.
EARLY_READER = re.compile(
    r"(?<!\|)\|(?!\|)\s*(?:grep\s+(?:-[a-zA-Z]*[qm][a-zA-Z]*\b|--quiet|--max-count)|head\b|sed\s+-n\s+['\"]?\d*q|awk\b[^|]*\bexit\b)"
)


def joined_lines(text):
    """Lines with backslash and trailing-pipe continuations folded in, keeping the first number."""
    out, buf, start = [], "", None
    for number, line in enumerate(text.splitlines(), 1):
        if start is None:
            start = number
        buf += line
        stripped = line.rstrip()
        if stripped.endswith("\\") or (stripped.endswith("|") and not stripped.endswith("||")):
            buf = buf.rstrip("\\") + " "
            continue
        out.append((start, buf))
        buf, start = "", None
    if buf:
        out.append((start, buf))
    return out


def findings(path, text):
    if not (STRICT.search(text) and PIPEFAIL.search(text)):
        return []
    found = []
    for number, line in joined_lines(text):
        code = line.split("#", 1)[0] if line.lstrip().startswith("#") else line
        if EARLY_READER.search(code):
            found.append(f"{path}:{number}: {line.strip()[:160]}")
    return found


def main(argv):
    if len(argv) < 2:
        print("usage: early_exit_pipe_lint.py SCRIPT...", file=sys.stderr)
        return 2
    all_found = []
    checked = 0
    for path in argv[1:]:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if STRICT.search(text) and PIPEFAIL.search(text):
            checked += 1
        all_found += findings(path, text)
    for line in all_found:
        print("early-exit reader under pipefail:", line)
    print(f"{checked} scripts with errexit+pipefail checked, {len(all_found)} findings")
    return 1 if all_found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

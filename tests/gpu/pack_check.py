#!/usr/bin/env python3
"""Checks tests/gpu/pack_manifest.txt (what tests/gpu/pack.sh packs for the GPU machine) without
building anything: every gpu-tagged target in the source tree, every program in tests/gpu/BUILD
and every tests/gpu script is listed; every listed target exists; the size budgets add up to no
more than the manifest's unpacked limit, and its archive limit plus the tracked tree fit the
device tool's 64 MiB carry. Prints one line per finding and exits 1 when there is any.

  pack_check.py --manifest M --source-tree DIR [--scripts-dir D]

BUILD files are Python syntax: they are read with ast (names and tags of rule calls), never run.
"""
from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from typing import Dict, List, Set, Tuple

CARRY_LIMIT_KIB = 64 * 1024
SIZED_KINDS = ("target", "system", "tree", "libs", "scripts")
PROGRAM_RULES = ("cc_binary", "cc_test")


class Manifest:
    def __init__(self) -> None:
        self.entries: List[Tuple[str, str, str, int]] = []  # kind, source, pack path, budget
        self.scripts: Set[str] = set()
        self.limits: Dict[str, int] = {}
        self.errors: List[str] = []


def read_manifest(path: str) -> Manifest:
    m = Manifest()
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            where = f"{os.path.basename(path)}:{number}"
            kind = fields[0]
            if kind == "script":
                if len(fields) != 3 or fields[1] != fields[2]:
                    m.errors.append(f"{where}: a script line is 'script PATH PATH' (same path)")
                else:
                    m.scripts.add(fields[1])
                continue
            if len(fields) != 4 or not fields[3].isdigit():
                m.errors.append(f"{where}: expected 'KIND SOURCE PACK_PATH BUDGET_KIB': {line}")
                continue
            if kind == "limit":
                m.limits[fields[1]] = int(fields[3])
            elif kind in SIZED_KINDS:
                m.entries.append((kind, fields[1], fields[2], int(fields[3])))
            else:
                m.errors.append(f"{where}: unknown kind {kind!r}")
    for name in ("unpacked", "archive"):
        if name not in m.limits:
            m.errors.append(f"manifest: no 'limit {name}' line")
    return m


def _string_list(node: ast.AST) -> List[str]:
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def build_rules(build_file: str) -> List[Tuple[str, str, List[str]]]:
    """(rule, name, tags) of every top-level rule call with a literal name in a BUILD file."""
    with open(build_file, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=build_file)
    rules = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        rule = node.func.id if isinstance(node.func, ast.Name) else (
            node.func.attr if isinstance(node.func, ast.Attribute) else "")
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        name = kw.get("name")
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            rules.append((rule, name.value, _string_list(kw.get("tags", ast.List(elts=[])))))
    return rules


def source_build_files(tree: str) -> List[Tuple[str, str]]:
    """(package, BUILD path) of every package in the source tree (not bazel-*, not hidden)."""
    out = []
    for root, dirs, files in os.walk(tree):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "bazel-")))
        for name in ("BUILD", "BUILD.bazel"):
            if name in files:
                out.append((os.path.relpath(root, tree).replace(os.sep, "/").strip("."),
                            os.path.join(root, name)))
                break
    return out


def tracked_kib(tree: str) -> int:
    listing = subprocess.run(["git", "-C", tree, "ls-files", "-z"], check=True,
                             capture_output=True).stdout.split(b"\0")
    total = 0
    for rel in listing:
        if rel:
            try:
                total += os.path.getsize(os.path.join(tree.encode(), rel))
            except OSError:
                pass  # deleted in the working tree: it does not travel
    return total // 1024


def check(manifest_path: str, tree: str, scripts_dir: str) -> List[str]:
    m = read_manifest(manifest_path)
    findings = list(m.errors)
    labels = {src for kind, src, _, _ in m.entries if kind == "target"}

    packages = dict(source_build_files(tree))
    defined: Dict[str, Set[str]] = {}
    for package, build in packages.items():
        try:
            rules = build_rules(build)
        except SyntaxError as e:
            findings.append(f"{build}: not readable as Python syntax: {e}")
            continue
        defined[package] = {name for _, name, _ in rules}
        for rule, name, tags in rules:
            label = f"//{package}:{name}"
            if "gpu" in tags and label not in labels:
                findings.append(f"missing: {label} is tagged gpu but not in the manifest")
            if package == "tests/gpu" and rule in PROGRAM_RULES and label not in labels:
                findings.append(f"missing: {label} ({rule} in tests/gpu/BUILD) is not in the "
                                "manifest")
    for kind, src, dest, _ in m.entries:
        if kind == "tree" and not os.path.exists(os.path.join(tree, src)):
            findings.append(f"unknown source: {src} is in the manifest but not in the tree")
        if kind != "target":
            continue
        package, _, name = src[2:].partition(":")
        if not src.startswith("//") or name not in defined.get(package, set()):
            findings.append(f"unknown target: {src} is in the manifest but no BUILD defines it")
        elif dest != "py/kvrail/proto" and dest not in (f"bin/{name}", f"lib/{name}"):
            findings.append(f"{src}: its pack path is bin/{name} (or lib/ for a library), "
                            f"not {dest}")

    on_disk = {f"tests/gpu/{f}" for f in os.listdir(scripts_dir) if f.endswith((".sh", ".py"))}
    for path in sorted(on_disk - m.scripts):
        findings.append(f"missing: the script {path} is not in the manifest")
    for path in sorted(m.scripts - on_disk):
        findings.append(f"stale: the manifest lists {path}, which does not exist")

    budgets = sum(b for _, _, _, b in m.entries)
    unpacked = m.limits.get("unpacked", 0)
    if budgets > unpacked:
        findings.append(f"size: the budgets add up to {budgets} KiB, over the unpacked limit "
                        f"of {unpacked} KiB")
    tree_kib = tracked_kib(tree)
    archive = m.limits.get("archive", 0)
    if archive + tree_kib > CARRY_LIMIT_KIB:
        findings.append(f"size: the archive limit {archive} KiB plus the tracked tree "
                        f"{tree_kib} KiB exceed the device tool's {CARRY_LIMIT_KIB} KiB")
    print(f"pack manifest: {len(m.entries)} entries ({len(labels)} targets), "
          f"{len(m.scripts)} scripts; budgets {budgets} of {unpacked} KiB unpacked; archive "
          f"limit {archive} KiB + tracked tree {tree_kib} KiB of {CARRY_LIMIT_KIB} KiB")
    return findings


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--source-tree", required=True)
    parser.add_argument("--scripts-dir", default="")
    args = parser.parse_args()
    scripts_dir = args.scripts_dir or os.path.join(args.source_tree, "tests", "gpu")
    findings = check(args.manifest, args.source_tree, scripts_dir)
    for f in findings:
        print(f)
    print(f"{len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())

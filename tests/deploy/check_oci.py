#!/usr/bin/python3
"""Checks an OCI image layout written by deploy/container/build_oci.py, structurally:

    check_oci.py LAYOUT --version V [--revision R] [--entrypoint-check]

oci-layout and index.json as the image spec says; every blob the index, the manifest and the
config name exists with the digest and size they claim; the config's diff_ids are the sha256 of
the uncompressed layers; the labels (version, revision, source, title) are there and the version
matches the tag; the entrypoint is an executable regular file in the layer (through symlinks),
and so is every file the package installs (--files). Prints one "ok"/"FAIL" line per check;
exits 1 on any failure.
"""
import argparse
import gzip
import hashlib
import json
import os
import posixpath
import sys
import tarfile

failed = False


def check(cond, what):
    global failed
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failed = True
    return cond


class HashingReader:
    """Reads from `source`, hashing what it hands out."""

    def __init__(self, source):
        self.source = source
        self.sha = hashlib.sha256()

    def read(self, n=-1):
        data = self.source.read(n)
        self.sha.update(data)
        return data


def blob(layout, descriptor, what):
    """The bytes of the blob `descriptor` names, checked against its digest and size."""
    digest = descriptor.get("digest", "")
    algo, _, hexdigest = digest.partition(":")
    path = os.path.join(layout, "blobs", algo, hexdigest)
    if not check(algo == "sha256" and os.path.isfile(path), f"{what}: blob {digest} exists"):
        return None
    data = open(path, "rb").read()
    check(hashlib.sha256(data).hexdigest() == hexdigest, f"{what}: content has digest {digest}")
    check(len(data) == descriptor.get("size"), f"{what}: size {descriptor.get('size')} matches")
    return data


def resolve(members, path, depth=0):
    """The regular-file member `path` (absolute) names in the layer, following symlinks."""
    rel = path.lstrip("/")
    m = members.get(rel)
    if m is None or depth > 16:
        # A symlinked parent directory (e.g. /bin -> usr/bin).
        parts = rel.split("/")
        for i in range(1, len(parts)):
            parent = members.get("/".join(parts[:i]))
            if parent is not None and parent.issym():
                target = posixpath.normpath(posixpath.join("/" + "/".join(parts[:i - 1]),
                                                           parent.linkname))
                return resolve(members, posixpath.join(target, *parts[i:]), depth + 1)
        return None
    if m.issym():
        target = posixpath.normpath(posixpath.join(posixpath.dirname("/" + rel), m.linkname))
        return resolve(members, target, depth + 1)
    if m.islnk():
        return members.get(m.linkname)
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("layout")
    ap.add_argument("--version", required=True)
    ap.add_argument("--revision")
    ap.add_argument("--files", help="a file listing paths (one a line) the layer must hold")
    args = ap.parse_args()
    layout = args.layout

    marker = json.load(open(os.path.join(layout, "oci-layout")))
    check(marker == {"imageLayoutVersion": "1.0.0"}, "oci-layout: imageLayoutVersion 1.0.0")
    index = json.load(open(os.path.join(layout, "index.json")))
    check(index.get("schemaVersion") == 2, "index.json: schemaVersion 2")
    manifests = index.get("manifests", [])
    if not check(len(manifests) == 1, "index.json: one manifest"):
        sys.exit(1)
    desc = manifests[0]
    check(desc.get("mediaType") == "application/vnd.oci.image.manifest.v1+json",
          "index.json: the manifest's media type")
    check(desc.get("annotations", {}).get("org.opencontainers.image.ref.name") == args.version,
          f"index.json: tagged {args.version} (org.opencontainers.image.ref.name)")
    manifest_bytes = blob(layout, desc, "manifest")
    if manifest_bytes is None:
        sys.exit(1)
    manifest = json.loads(manifest_bytes)
    check(manifest.get("schemaVersion") == 2, "manifest: schemaVersion 2")
    cdesc = manifest.get("config", {})
    check(cdesc.get("mediaType") == "application/vnd.oci.image.config.v1+json",
          "manifest: the config's media type")
    config_bytes = blob(layout, cdesc, "config")
    if config_bytes is None:
        sys.exit(1)
    config = json.loads(config_bytes)
    check(config.get("os") == "linux" and config.get("architecture") == "amd64",
          "config: linux/amd64")
    labels = config.get("config", {}).get("Labels", {})
    check(labels.get("org.opencontainers.image.version") == args.version,
          f"config: label org.opencontainers.image.version = {args.version}")
    if args.revision:
        check(labels.get("org.opencontainers.image.revision") == args.revision,
              f"config: label org.opencontainers.image.revision = {args.revision}")
    for key in ("org.opencontainers.image.source", "org.opencontainers.image.title",
                "org.opencontainers.image.revision"):
        check(bool(labels.get(key)), f"config: label {key} is set")
    layers = manifest.get("layers", [])
    diff_ids = config.get("rootfs", {}).get("diff_ids", [])
    check(config.get("rootfs", {}).get("type") == "layers", "config: rootfs type layers")
    check(len(layers) == 1 and len(diff_ids) == 1, "one layer, one diff_id")
    members = {}
    for i, (ldesc, diff_id) in enumerate(zip(layers, diff_ids)):
        check(ldesc.get("mediaType") == "application/vnd.oci.image.layer.v1.tar+gzip",
              f"layer {i}: media type tar+gzip")
        data = blob(layout, ldesc, f"layer {i}")
        if data is None:
            continue
        del data
        # Stream the layer once: the tar's members and the uncompressed bytes' sha256.
        path = os.path.join(layout, "blobs", "sha256", ldesc["digest"].split(":", 1)[1])
        try:
            with gzip.open(path, "rb") as gz:
                reader = HashingReader(gz)
                with tarfile.open(fileobj=reader, mode="r|") as tar:
                    for m in tar:
                        members[m.name.rstrip("/")] = m
                while reader.read(1 << 20):
                    pass
        except (OSError, EOFError, tarfile.TarError) as e:
            check(False, f"layer {i}: reads as a tar.gz ({e})")
            continue
        check("sha256:" + reader.sha.hexdigest() == diff_id,
              f"layer {i}: diff_id is the uncompressed tar's sha256")
    entrypoint = config.get("config", {}).get("Entrypoint") or []
    if check(bool(entrypoint), "config: an entrypoint"):
        m = resolve(members, entrypoint[0])
        check(m is not None and m.isfile() and m.mode & 0o111,
              f"layer: the entrypoint {entrypoint[0]} is an executable file")
    user = config.get("config", {}).get("User", "")
    check(bool(user) and not user.startswith("0:") and user != "0",
          f"config: runs as a non-root user ({user})")
    if args.files:
        for path in [l.strip() for l in open(args.files) if l.strip()]:
            check(resolve(members, path) is not None, f"layer: {path} (from the package)")
    print("layout " + ("FAILED" if failed else "valid") + f": {len(members)} entries in the layer")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

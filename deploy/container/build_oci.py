#!/usr/bin/python3
"""Writes an OCI image layout (https://github.com/opencontainers/image-spec) of one layer from a
root file system, without a container engine:

    build_oci.py --rootfs DIR --out LAYOUT --version V --revision GIT_SHA --source URL

LAYOUT gets oci-layout, index.json (the manifest tagged V: org.opencontainers.image.ref.name) and
blobs/sha256/: the manifest, the image config (entrypoint kvraild, user kvrail, labels
org.opencontainers.image.version/revision/source/...) and the layer, a tar.gz of DIR.

Deterministic: entries in sorted order, every mtime SOURCE_DATE_EPOCH (default 0), numeric
owners without names, gzip without a time stamp or file name, JSON with sorted keys; so the
same DIR and arguments give the same digests. Left out of the layer: /dev, /proc, /sys and /run
contents (the runtime mounts its own), /tmp contents, apt's lists and downloaded packages,
device nodes, fifos and sockets.

Load it: `skopeo copy oci:LAYOUT:V docker-daemon:kvraild:V`, or `podman pull oci:LAYOUT:V`
(docs/operations.md). Python 3 standard library only.
"""
import argparse
import gzip
import hashlib
import json
import os
import stat
import sys
import tarfile
import time

# Paths whose contents stay out of the layer (the directories themselves stay).
EMPTIED = ("dev", "proc", "sys", "run", "tmp", "var/tmp", "var/lib/apt/lists",
           "var/cache/apt/archives", "var/cache/debconf")
SKIPPED_FILES = ("var/cache/apt/pkgcache.bin", "var/cache/apt/srcpkgcache.bin",
                 "var/cache/ldconfig/aux-cache")


class HashingWriter:
    """A file-like sink that hashes and counts what passes through, then forwards it."""

    def __init__(self, sink):
        self.sink = sink
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data):
        self.sha.update(data)
        self.size += len(data)
        if self.sink is not None:
            self.sink.write(data)
        return len(data)

    def flush(self):
        if self.sink is not None:
            self.sink.flush()


def walk_sorted(root):
    """Relative paths under root, parents before children, siblings in byte order."""
    out = []

    def visit(rel):
        full = os.path.join(root, rel) if rel else root
        for name in sorted(os.listdir(full)):
            child = os.path.join(rel, name) if rel else name
            out.append(child)
            if child in EMPTIED:
                continue
            st = os.lstat(os.path.join(root, child))
            if stat.S_ISDIR(st.st_mode):
                visit(child)

    visit("")
    return out


def parent_emptied(rel):
    return any(rel.startswith(p + "/") for p in EMPTIED)


def write_layer(root, sink, mtime):
    """Writes the tar of root into sink (a binary file-like); returns the paths it holds."""
    names = []
    seen_inodes = {}
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for rel in walk_sorted(root):
            if parent_emptied(rel) or rel in SKIPPED_FILES:
                continue
            full = os.path.join(root, rel)
            st = os.lstat(full)
            info = tarfile.TarInfo(rel)
            info.mode = stat.S_IMODE(st.st_mode)
            info.uid, info.gid = st.st_uid, st.st_gid
            info.uname = info.gname = ""
            info.mtime = mtime
            fileobj = None
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
            elif stat.S_ISLNK(st.st_mode):
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(full)
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in seen_inodes:
                    info.type = tarfile.LNKTYPE
                    info.linkname = seen_inodes[key]
                else:
                    if st.st_nlink > 1:
                        seen_inodes[key] = rel
                    info.type = tarfile.REGTYPE
                    info.size = st.st_size
                    fileobj = open(full, "rb")
            else:
                continue  # device nodes, fifos, sockets: the runtime provides /dev
            try:
                tar.addfile(info, fileobj)
            finally:
                if fileobj is not None:
                    fileobj.close()
            names.append(rel)
    return names


def put_blob(blobs, data):
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(blobs, digest), "wb") as f:
        f.write(data)
    return "sha256:" + digest, len(data)


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def passwd_ids(root, user):
    """uid and gid of `user` in root's /etc/passwd, or None."""
    try:
        with open(os.path.join(root, "etc/passwd")) as f:
            for line in f:
                fields = line.rstrip("\n").split(":")
                if len(fields) >= 4 and fields[0] == user:
                    return int(fields[2]), int(fields[3])
    except OSError:
        pass
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rootfs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--version", required=True, help="the package's version (the tag)")
    ap.add_argument("--revision", required=True, help="the source revision (git commit)")
    ap.add_argument("--source", required=True, help="where the source is (a repository URL)")
    ap.add_argument("--compresslevel", type=int, default=6)
    args = ap.parse_args()
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    entrypoint = ["/usr/bin/kvraild", "--config", "/etc/kvrail/kvraild.textproto",
                  "--socket", "/run/kvrail/kvrail.sock"]
    if not os.path.isfile(os.path.join(args.rootfs, entrypoint[0].lstrip("/"))):
        sys.exit(f"build_oci.py: --rootfs: {entrypoint[0]} is missing (install the .deb first)")
    ids = passwd_ids(args.rootfs, "kvrail")
    if ids is None:
        sys.exit("build_oci.py: --rootfs: no kvrail user in /etc/passwd (the .deb's postinst makes it)")

    blobs = os.path.join(args.out, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)
    # The layer: tar -> (diff_id hash) -> gzip -> (digest hash) -> a temporary blob file.
    tmp_path = os.path.join(blobs, ".layer.tmp")
    with open(tmp_path, "wb") as raw:
        compressed = HashingWriter(raw)
        gz = gzip.GzipFile(filename="", mode="wb", fileobj=compressed,
                           compresslevel=args.compresslevel, mtime=0)
        uncompressed = HashingWriter(gz)
        write_layer(args.rootfs, uncompressed, epoch)
        gz.close()
    layer_digest = compressed.sha.hexdigest()
    os.replace(tmp_path, os.path.join(blobs, layer_digest))
    diff_id = "sha256:" + uncompressed.sha.hexdigest()

    labels = {
        "org.opencontainers.image.title": "kvraild",
        "org.opencontainers.image.description":
            "kvrail KV-cache transfer daemon (the kvrail Debian package on Debian 12)",
        "org.opencontainers.image.version": args.version,
        "org.opencontainers.image.revision": args.revision,
        "org.opencontainers.image.source": args.source,
        "org.opencontainers.image.base.name": "debian:bookworm (debootstrap --variant=minbase)",
    }
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    config = {
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": f"{ids[0]}:{ids[1]}",
            "Entrypoint": entrypoint,
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps"],
            "Volumes": {"/run/kvrail": {}},
            "StopSignal": "SIGTERM",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created,
                     "created_by": "deploy/container/build_oci.py (debootstrap bookworm minbase + "
                                   "apt install ./kvrail_" + args.version + "_amd64.deb)"}],
    }
    config_digest, config_size = put_blob(blobs, canonical(config))
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": "sha256:" + layer_digest, "size": compressed.size}],
        "annotations": {k: v for k, v in labels.items()
                        if k in ("org.opencontainers.image.version",
                                 "org.opencontainers.image.revision",
                                 "org.opencontainers.image.source")},
    }
    manifest_digest, manifest_size = put_blob(blobs, canonical(manifest))
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": manifest_digest, "size": manifest_size,
                       "platform": {"architecture": "amd64", "os": "linux"},
                       "annotations": {"org.opencontainers.image.ref.name": args.version}}],
    }
    with open(os.path.join(args.out, "index.json"), "wb") as f:
        f.write(canonical(index))
    with open(os.path.join(args.out, "oci-layout"), "wb") as f:
        f.write(canonical({"imageLayoutVersion": "1.0.0"}))
    print(f"{args.out}: kvraild {args.version} manifest {manifest_digest}, layer "
          f"{compressed.size} bytes gzip ({uncompressed.size} bytes tar)")


if __name__ == "__main__":
    main()

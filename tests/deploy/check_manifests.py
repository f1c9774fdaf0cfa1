#!/usr/bin/python3
"""Checks deploy/: the systemd unit (systemd-analyze verify, drain and hardening settings), the
DaemonSet (host IPC and network, the socket hostPath, /dev/infiniband, resources, health probes),
the container recipe and the default config (every key in config.proto, nothing unknown)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


root = os.environ.get("TEST_SRCDIR", ".")
ws = os.path.join(root, os.environ.get("TEST_WORKSPACE", "kvrail")) if "TEST_SRCDIR" in os.environ else "."
deploy = os.path.join(ws, "deploy")

# --- systemd ---------------------------------------------------------------------------------
unit_path = os.path.join(deploy, "systemd", "kvraild.service")
unit = open(unit_path).read()
keys = {}
for line in unit.splitlines():
    m = re.match(r"^(\w+)=(.*)$", line)
    if m:
        keys.setdefault(m.group(1), []).append(m.group(2))
check(keys.get("RuntimeDirectory") == ["kvrail"], "unit: RuntimeDirectory=kvrail holds the socket")
check("Group" in keys, "unit: a socket group (Group=)")
check(keys.get("KillSignal") == ["SIGTERM"], "unit: stop sends SIGTERM (drain)")
check(int(keys["TimeoutStopSec"][0]) > 10, "unit: TimeoutStopSec leaves room for the 10 s drain")
check(any("nvidia-cuda-mps" in v for v in keys.get("After", [])), "unit: ordered after the CUDA MPS daemon")
for k in ["NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "DevicePolicy"]:
    check(k in keys, f"unit: hardening {k}")
check("--socket /run/kvrail/kvrail.sock" in keys["ExecStart"][0], "unit: socket in the RuntimeDirectory")
analyze = shutil.which("systemd-analyze")
if analyze:
    with tempfile.TemporaryDirectory() as tmp:
        daemon = os.path.abspath(os.path.join(ws, "daemon", "kvraild"))
        text = unit.replace("/usr/bin/kvraild", daemon)
        # The MPS unit is referenced only by ordering; verify it too, with a stand-in binary.
        mps = open(os.path.join(deploy, "systemd", "nvidia-cuda-mps.service")).read()
        mps = mps.replace("/usr/bin/nvidia-cuda-mps-control", "/bin/true")
        open(os.path.join(tmp, "kvraild.service"), "w").write(text)
        open(os.path.join(tmp, "nvidia-cuda-mps.service"), "w").write(mps)
        r = subprocess.run([analyze, "verify", os.path.join(tmp, "kvraild.service"),
                            os.path.join(tmp, "nvidia-cuda-mps.service")],
                           capture_output=True, text=True)
        # Lines about units outside ours (e.g. the host's own) are not our concern.
        ours = [l for l in (r.stdout + r.stderr).splitlines()
                if "kvraild.service" in l or "nvidia-cuda-mps.service" in l]
        for l in ours:
            print("     systemd-analyze: " + l)
        check(not ours, "unit: systemd-analyze verify reports nothing for our units")
else:
    print("skip systemd-analyze (not installed)")

# --- Kubernetes ---------------------------------------------------------------------------------
docs = list(yaml.safe_load_all(open(os.path.join(deploy, "k8s", "kvraild-daemonset.yaml"))))
ds = next(d for d in docs if d["kind"] == "DaemonSet")
spec = ds["spec"]["template"]["spec"]
check(spec.get("hostIPC") is True, "daemonset: hostIPC (CUDA IPC, shm)")
check(spec.get("hostNetwork") is True, "daemonset: hostNetwork (NICs)")
vols = {v["name"]: v for v in spec["volumes"]}
check(any(v.get("hostPath", {}).get("path") == "/run/kvrail" for v in vols.values()),
      "daemonset: socket on a hostPath shared with inference pods")
check(any(v.get("hostPath", {}).get("path") == "/dev/infiniband" for v in vols.values()),
      "daemonset: /dev/infiniband")
c = spec["containers"][0]
check("requests" in c.get("resources", {}), "daemonset: resource requests")
mounts = {m["mountPath"] for m in c["volumeMounts"]}
check("/run/kvrail" in mounts and "/dev/infiniband" in mounts, "daemonset: mounts socket dir and IB devices")
live = c["livenessProbe"]["exec"]["command"]
ready = c["readinessProbe"]["exec"]["command"]
check("health" in live, "daemonset: liveness probe on the health service")
check("health" in ready and "kvrail.v1.Transfer" in ready, "daemonset: readiness probe on the Transfer service's health")
check(spec.get("terminationGracePeriodSeconds", 30) > 10, "daemonset: grace period covers the drain")
check(any(d["kind"] == "ConfigMap" for d in docs), "daemonset: a ConfigMap with the config")

# --- container ----------------------------------------------------------------------------------
cf = open(os.path.join(deploy, "container", "Containerfile")).read()
check(re.search(r"^FROM scratch$", cf, re.M) is not None, "container: no registry base image (FROM scratch)")
check("ENTRYPOINT" in cf and "kvraild" in cf, "container: runs kvraild")
check("HEALTHCHECK" in cf and "health" in cf, "container: health check")
check(re.search(r"^USER ", cf, re.M) is not None, "container: not root")
build = open(os.path.join(deploy, "container", "build.sh")).read()
check("debootstrap" in build, "container: root fs from Debian's archive (debootstrap)")
r = subprocess.run(["bash", "-n", os.path.join(deploy, "container", "build.sh")])
check(r.returncode == 0, "container: build.sh parses")

# --- default config -------------------------------------------------------------------------------
proto = open(os.path.join(ws, "proto", "kvrail", "v1", "config.proto")).read()
fields = set(re.findall(r"^\s+(?:optional\s+|repeated\s+)?(?:map<[^>]+>|\w+)\s+(\w+)\s*=\s*\d+;",
                        proto, re.M))
conf = open(os.path.join(deploy, "config", "kvraild.textproto")).read()
mentioned = set(re.findall(r"^#?\s*(\w+)\s*[:{]", conf, re.M))
check(fields <= mentioned, "config: every DaemonConfig key is documented in the default config "
      f"(missing: {sorted(fields - mentioned)})")
check(mentioned <= fields | {"key", "value"}, f"config: no unknown keys ({sorted(mentioned - fields - {'key', 'value'})})")
daemon = os.path.join(ws, "daemon", "kvraild")

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)

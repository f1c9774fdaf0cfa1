#!/usr/bin/python3
"""Checks deploy/: the systemd unit (systemd-analyze verify, drain and hardening settings), the
DaemonSet (host IPC and network, the socket hostPath, /dev/infiniband, resources, health probes),
the container recipe and the default config (every key in config.proto, nothing unknown)."""
import json
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
check(keys.get("Type") == ["notify"] and keys.get("NotifyAccess") == ["all"],
      "unit: Type=notify (kvraild sends READY=1, STATUS=, STOPPING=1; a hot restart's successor "
      "READY=1 and MAINPID=, hence NotifyAccess=all)")
reload = keys.get("ExecReload", [""])[0]
check("--take-over auto" in reload and "--socket /run/kvrail/kvrail.sock" in reload,
      "unit: reload is a hot restart (a successor with --take-over auto on the same socket)")
# DeviceAllow: group names as /proc/devices lists them (the NVIDIA driver's and RDMA's), or
# device paths. Names that exist nowhere (char-nvidiactl, char-uverbs) allow nothing.
known_groups = {"nvidia-frontend", "nvidia", "nvidia-uvm", "nvidia-caps", "nvidia-modeset",
                "infiniband_verbs", "infiniband_mad"}
allowed = [v.split()[0] for v in keys.get("DeviceAllow", [])]
for dev in allowed:
    if dev.startswith("char-"):
        check(dev[5:] in known_groups, f"unit: DeviceAllow {dev} names a real device group")
    else:
        check(dev.startswith("/dev/"), f"unit: DeviceAllow {dev} is a device path")
check("char-nvidia-frontend" in allowed and "char-nvidia-uvm" in allowed,
      "unit: DeviceAllow covers /dev/nvidia[0-9]*, /dev/nvidiactl and /dev/nvidia-uvm")
check("char-infiniband_verbs" in allowed and "/dev/infiniband/rdma_cm" in allowed,
      "unit: DeviceAllow covers /dev/infiniband/uverbs* and /dev/infiniband/rdma_cm")
# Documentation= must point at what the package installs.
deb_files = open(os.path.join(deploy, "deb", "files.txt")).read().split()
for doc in keys.get("Documentation", [""])[0].split():
    if doc.startswith("man:"):
        m = re.match(r"man:([\w.-]+)\((\d)\)", doc)
        page = f"/usr/share/man/man{m.group(2)}/{m.group(1)}.{m.group(2)}.gz" if m else "?"
        check(page in deb_files, f"unit: Documentation {doc} is installed by the package ({page})")
    elif doc.startswith("file:"):
        check(doc[5:] in deb_files, f"unit: Documentation {doc} is installed by the package")
    else:
        check(False, f"unit: Documentation {doc} is neither man: nor file:")
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
        # The man pages the package installs (help2man, //deploy:man_pages), for Documentation=.
        env = dict(os.environ)
        man = os.path.join(tmp, "man")
        for page, section in [("kvraild", "8"), ("kvrail", "1")]:
            os.makedirs(os.path.join(man, "man" + section), exist_ok=True)
            shutil.copy(os.path.join(deploy, f"{page}.{section}"),
                        os.path.join(man, "man" + section, f"{page}.{section}"))
        env["MANPATH"] = man
        r = subprocess.run([analyze, "verify", os.path.join(tmp, "kvraild.service"),
                            os.path.join(tmp, "nvidia-cuda-mps.service")],
                           capture_output=True, text=True, env=env)
        # Lines about units outside ours (e.g. the host's own) are not our concern.
        ours = [l for l in (r.stdout + r.stderr).splitlines()
                if "kvraild.service" in l or "nvidia-cuda-mps.service" in l]
        for l in ours:
            print("     systemd-analyze: " + l)
        check(not ours, "unit: systemd-analyze verify reports nothing for our units")
else:
    print("skip systemd-analyze (not installed)")

# --- Kubernetes ---------------------------------------------------------------------------------
docs = list(yaml.safe_load_all(open(os.path.join(deploy, "k8s", "base", "kvraild-daemonset.yaml"))))
for d in docs:
    check({"apiVersion", "kind", "metadata"} <= set(d), f"k8s: {d.get('kind')} has apiVersion, kind, metadata")
ds = next(d for d in docs if d["kind"] == "DaemonSet")
check(ds["apiVersion"] == "apps/v1", "daemonset: apps/v1")
check(ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items(),
      "daemonset: the selector matches the template's labels")
spec = ds["spec"]["template"]["spec"]
check(spec.get("hostIPC") is True, "daemonset: hostIPC (CUDA IPC, shm)")
check(spec.get("hostNetwork") is True, "daemonset: hostNetwork (NICs)")
check(spec.get("automountServiceAccountToken") is False, "daemonset: no service-account token")
check(spec.get("securityContext", {}).get("seccompProfile", {}).get("type") == "RuntimeDefault",
      "daemonset: seccomp RuntimeDefault")
vols = {v["name"]: v for v in spec["volumes"]}
sock_vol = next((n for n, v in vols.items() if v.get("hostPath", {}).get("path") == "/run/kvrail"), None)
check(sock_vol is not None, "daemonset: socket on a hostPath shared with inference pods")
check(not any(v.get("hostPath", {}).get("path", "").startswith("/dev/infiniband") for v in vols.values()),
      "daemonset: no /dev/infiniband hostPath (it grants no device access)")
c = spec["containers"][0]
sc = c.get("securityContext", {})
check(sc.get("readOnlyRootFilesystem") is True, "daemonset: read-only root file system")
check(sc.get("runAsNonRoot") is True and sc.get("allowPrivilegeEscalation") is False,
      "daemonset: non-root, no privilege escalation")
check(sc.get("capabilities", {}).get("drop") == ["ALL"] and sc["capabilities"].get("add") == ["IPC_LOCK"],
      "daemonset: only CAP_IPC_LOCK")
uid, gid = sc.get("runAsUser"), sc.get("runAsGroup")
res = c.get("resources", {})
check("requests" in res, "daemonset: resource requests")
rdma = [k for k in res.get("limits", {}) if k.startswith("rdma/")]
check(not rdma, "daemonset: the base asks for no RDMA resource (the rdma overlay does: no Pending pod without the plugin)")
check({"name": "CUDA_CACHE_PATH", "value": "/var/cache/kvrail/cuda-jit"} in c.get("env", []),
      "daemonset: CUDA's JIT cache on a volume, not the read-only root")
mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
check(mounts.get("/run/kvrail") == sock_vol, "daemonset: mounts the socket dir")
check("/tmp" in mounts, "daemonset: a writable /tmp beside the read-only root")
# The socket directory becomes the daemon's: an init container chowns the hostPath (kubelet
# creates a missing one root-owned 0755, where uid 990 could not bind).
inits = spec.get("initContainers", [])
init = next((i for i in inits if any(m["mountPath"] == "/run/kvrail" for m in i.get("volumeMounts", []))), None)
check(init is not None, "daemonset: an init container prepares the socket directory")
if init:
    cmd = " ".join(init.get("command", []) + init.get("args", []))
    check(f"chown {uid}:{gid} /run/kvrail" in cmd, f"daemonset: the init container chowns it to {uid}:{gid}")
    check("chmod 2770" in cmd, "daemonset: group-sticky 2770 (the socket keeps the group)")
    caps = init.get("securityContext", {}).get("capabilities", {})
    check(caps.get("drop") == ["ALL"] and set(caps.get("add", [])) <= {"CHOWN", "FOWNER"},
          "daemonset: the init container keeps only CHOWN and FOWNER")
# Hot restart on update: the new pod starts beside the old one and takes over through the shared
# socket directory; a declared port would be a host port (hostNetwork) and keep it off the node.
rolling = ds["spec"].get("updateStrategy", {}).get("rollingUpdate", {})
check(rolling.get("maxSurge") == 1 and rolling.get("maxUnavailable") == 0,
      "daemonset: updates surge one pod per node and keep the old one until the new one serves")
args = c.get("args", [])
check("--take-over" in args and args[args.index("--take-over") + 1] == "auto",
      "daemonset: kvraild takes over from the old pod's (--take-over auto)")
check("--linger-after-handover" in args,
      "daemonset: the old kvraild idles after handing over (an exit would be restarted)")
check(not c.get("ports"), "daemonset: no declared ports (host ports would block the surge pod)")
metrics_port = ds["spec"]["template"]["metadata"].get("annotations", {}).get("prometheus.io/port")
check(metrics_port is not None, "daemonset: the metrics port in the scrape annotation")
cm = next((d for d in docs if d["kind"] == "ConfigMap"), None)
check(cm is not None, "daemonset: a ConfigMap with the config")
if cm and metrics_port:
    check(f':{metrics_port}"' in cm["data"]["kvraild.textproto"], "daemonset: the config serves metrics on that port")
def probe(name):
    return c.get(name, {}).get("exec", {}).get("command", [])
check("health" in probe("livenessProbe") and "--service" not in probe("livenessProbe"),
      "daemonset: liveness on the server's health (SERVING while draining)")
check("health" in probe("readinessProbe") and "kvrail.v1.Transfer" in probe("readinessProbe"),
      "daemonset: readiness probe on the Transfer service's health")
check("health" in probe("startupProbe"), "daemonset: a startup probe")
sp = c.get("startupProbe", {})
check(sp.get("periodSeconds", 10) * sp.get("failureThreshold", 3) >= 30, "daemonset: start-up may take 30 s or more")
check(spec.get("terminationGracePeriodSeconds", 30) > 10, "daemonset: grace period covers the drain")

# GPU nodes as the GPU operator runs them: the CUDA engine required (a kvraild without its GPUs
# is never Ready), GPUs through a CDI annotation (or a privileged container), the MPS pipe of the
# device plugin's layout, and an init container that waits for the driver and toolkit.
conf_text = cm["data"]["kvraild.textproto"] if cm else ""
check(re.search(r'^\s*cuda_engine:\s*"required"', conf_text, re.M) is not None,
      "daemonset: cuda_engine required (no CUDA engine: the start fails, the pod is not Ready)")
annotations = ds["spec"]["template"]["metadata"].get("annotations", {})
cdi = [v for k, v in annotations.items() if k.startswith("cdi.k8s.io/")]
check(any("nvidia.com/gpu=" in v for v in cdi) or sc.get("privileged") is True,
      "daemonset: GPUs through a CDI annotation or a privileged container")
env = {e["name"]: e.get("value") for e in c.get("env", [])}
check("NVIDIA_VISIBLE_DEVICES" not in env or sc.get("privileged") is True,
      "daemonset: no NVIDIA_VISIBLE_DEVICES in an unprivileged container (hardened toolkits ignore it)")
pipe = re.search(r'^\s*cuda_mps_pipe_directory:\s*"([^"]+)"', conf_text, re.M)
check(pipe is not None and re.fullmatch(r"/run/nvidia/mps/[^/]+/[^/]+/pipe", pipe.group(1)) is not None,
      "daemonset: cuda_mps_pipe_directory in the device plugin's layout /run/nvidia/mps/<resource>/pipe")
if pipe:
    mps_mount = next((m for m in c["volumeMounts"] if pipe.group(1).startswith(m["mountPath"].rstrip("/") + "/")), None)
    check(mps_mount is not None and vols.get(mps_mount["name"], {}).get("hostPath", {}).get("path") == mps_mount["mountPath"],
          "daemonset: the MPS pipe's host folder is mounted at the same path")
check("CUDA_MPS_PIPE_DIRECTORY" not in env, "daemonset: the MPS pipe is set in the config, not a second place")
waiter = next((i for i in inits if "toolkit-ready" in " ".join(i.get("command", []) + i.get("args", []))), None)
check(waiter is not None, "daemonset: an init container waits for the GPU operator's toolkit-ready")
if waiter:
    wm = next((m for m in waiter.get("volumeMounts", []) if m["mountPath"] == "/run/nvidia/validations"), None)
    check(wm is not None and vols.get(wm["name"], {}).get("hostPath", {}).get("path") == "/run/nvidia/validations",
          "daemonset: it reads the host's /run/nvidia/validations")
    check(waiter.get("securityContext", {}).get("capabilities", {}).get("drop") == ["ALL"],
          "daemonset: the waiting init container drops every capability")

pod = yaml.safe_load(open(os.path.join(deploy, "k8s", "inference-pod-example.yaml")))
check(pod["kind"] == "Pod" and pod["apiVersion"] == "v1", "inference pod: a v1 Pod")
ps = pod["spec"]
check(ps.get("hostIPC") is True, "inference pod: hostIPC")
check(gid in ps.get("securityContext", {}).get("supplementalGroups", []),
      f"inference pod: supplementalGroups has the socket's group {gid}")
check(ps.get("securityContext", {}).get("runAsUser") == uid,
      "inference pod: runs as the daemon's uid (one MPS server per user)")
pvols = {v["name"]: v for v in ps["volumes"]}
pc = ps["containers"][0]
smount = next((m for m in pc["volumeMounts"] if m["mountPath"] == "/run/kvrail"), None)
check(smount is not None and pvols[smount["name"]].get("hostPath", {}).get("path") == "/run/kvrail",
      "inference pod: mounts the socket hostPath at /run/kvrail")
env = {e["name"]: e.get("value") for e in pc.get("env", [])}
check(env.get("KVRAIL_SOCKET") == "/run/kvrail/kvrail.sock", "inference pod: KVRAIL_SOCKET names the socket")
kubectl = shutil.which("kubectl")
if kubectl:
    for f in ["base/kvraild-daemonset.yaml", "inference-pod-example.yaml"]:
        r = subprocess.run([kubectl, "apply", "--dry-run=client", "--validate=false", "-o", "name",
                            "-f", os.path.join(deploy, "k8s", f)], capture_output=True, text=True,
                           env=dict(os.environ, KUBECONFIG="/nonexistent"))
        if r.returncode == 0:
            check(True, f"kubectl --dry-run=client accepts {f}")
        else:
            print(f"skip kubectl --dry-run=client {f} (needs a cluster here: {r.stderr.strip()[:120]})")
else:
    print("skip kubectl (not installed)")

# --- monitoring -----------------------------------------------------------------------------------
metrics_src = open(os.path.join(ws, "daemon", "metrics", "metrics.cc")).read()
exported = set(re.findall(r'"(kvrail_[a-z_]+)"', metrics_src))
for h in [n for n in exported if "seconds" in n and "duration" in n or "wait" in n]:
    exported |= {h + "_bucket", h + "_sum", h + "_count"}
exported |= {"kvrail_engine_threads", "kvrail_engine_worker_bytes_per_second"}  # Engine::Gauges
def metric_names(expr):
    return set(re.findall(r"\b(kvrail_[a-z_]+)", expr))
rules = yaml.safe_load(open(os.path.join(deploy, "monitoring", "kvrail-alerts.yaml")))
n_rules = 0
for group in rules["groups"]:
    for rule in group["rules"]:
        n_rules += 1
        check({"alert", "expr", "labels", "annotations"} <= set(rule), f"alerts: {rule.get('alert')} is complete")
        unknown = metric_names(rule["expr"]) - exported
        check(not unknown, f"alerts: {rule['alert']} uses metrics kvraild exports {sorted(unknown) or ''}")
check(n_rules >= 5, "alerts: rules for down, restarts, failures, refusals, peers")
# Each rule's runbook is a heading of docs/operations.md (GitHub's anchor: the heading lower-cased).
ops_md = open(os.path.join(ws, "docs", "operations.md")).read()
anchors = {h.strip().lower().replace(" ", "-") for h in re.findall(r"^#+ (.+)$", ops_md, re.M)}
for group in rules["groups"]:
    for rule in group["rules"]:
        url = rule.get("annotations", {}).get("runbook_url", "")
        check(url.startswith("docs/operations.md#") and url.split("#", 1)[1] in anchors,
              f"alerts: {rule['alert']} has a runbook_url at a docs/operations.md heading ({url})")
        check("job=" not in rule["expr"].replace(" ", ""), f"alerts: {rule['alert']} names no scrape job")
dash = json.load(open(os.path.join(deploy, "monitoring", "kvrail-dashboard.json")))
exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
check(len(exprs) >= 10, "dashboard: panels with queries")
for e in exprs:
    unknown = metric_names(e) - exported
    check(not unknown, f"dashboard: {e[:60]} uses metrics kvraild exports {sorted(unknown) or ''}")
promtool = shutil.which("promtool")
if promtool:
    r = subprocess.run([promtool, "check", "rules", os.path.join(deploy, "monitoring", "kvrail-alerts.yaml")],
                       capture_output=True, text=True)
    check(r.returncode == 0, "alerts: promtool check rules " + r.stdout.strip().splitlines()[-1] if r.stdout else "")
else:
    print("skip promtool (not installed; the structure and metric names were checked above)")

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

"""What the Kubernetes schemas cannot check in the rendered deploy/k8s (base.yaml, rdma.yaml):
the ServiceMonitor selects the Service and scrapes the port the DaemonSet serves metrics on,
the Pod Security label admits the DaemonSet, RDMA is asked for only by the rdma overlay and only
on nodes that have it, the MPS pipe directory and the JIT cache are mounted, memory is limited.
Prints ok/FAIL per check; exits 1 on any FAIL."""
import sys

import yaml

failed = False


def check(ok, what):
    global failed
    print(("ok   " if ok else "FAIL ") + what)
    failed |= not ok


def load(path):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


base, rdma = load(sys.argv[1]), load(sys.argv[2])
for name, docs in (("base", base), ("rdma", rdma)):
    ds = docs[("DaemonSet", "kvraild")]
    pod = ds["spec"]["template"]
    c = next(c for c in pod["spec"]["containers"] if c["name"] == "kvraild")
    svc = docs[("Service", "kvraild-metrics")]
    sm = docs[("ServiceMonitor", "kvraild")]
    ns = docs[("Namespace", "kvrail")]
    labels = svc["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items()),
          f"{name}: the ServiceMonitor selects the Service")
    check(svc["metadata"]["namespace"] in sm["spec"]["namespaceSelector"]["matchNames"],
          f"{name}: the ServiceMonitor looks in the Service's namespace")
    check(all(pod["metadata"]["labels"].get(k) == v for k, v in svc["spec"]["selector"].items()),
          f"{name}: the Service selects the DaemonSet's pods")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}

    def target(svc_port):
        # A container port's name, or a number (the DaemonSet declares no ports: with hostNetwork
        # they would be host ports and keep the hot restart's surge pod off the node).
        t = svc_port["targetPort"]
        return ports.get(t) if isinstance(t, str) else t

    sm_ports = {e["port"] for e in sm["spec"]["endpoints"]}
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    check(sm_ports <= set(svc_ports) and all(target(svc_ports[p]) is not None for p in sm_ports),
          f"{name}: the ServiceMonitor's port is the Service's, which targets the container")
    metrics_port = target(svc_ports["metrics"]) if "metrics" in svc_ports else None
    config = docs[("ConfigMap", "kvraild-config")]["data"]["kvraild.textproto"]
    check(metrics_port is not None and f':{metrics_port}"' in config,
          f"{name}: metrics_listen binds the port the Service targets")
    check(ns["metadata"]["labels"].get("pod-security.kubernetes.io/enforce") == "privileged",
          f"{name}: the namespace's Pod Security level admits hostNetwork/hostIPC/hostPath")
    check(c["securityContext"].get("runAsUser") == 990 and c["image"].startswith("kvraild"),
          f"{name}: uid 990 and the kvraild image")
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    check("/run/nvidia/mps" in mounts, f"{name}: the MPS pipe directory is mounted")
    check("/var/cache/kvrail" in mounts, f"{name}: the CUDA JIT cache has a volume")
    check("memory" in c["resources"].get("limits", {}), f"{name}: a memory limit (staging sizing)")
    asks = [k for k in c["resources"].get("limits", {}) if k.startswith("rdma/")]
    selector = pod["spec"].get("nodeSelector", {})
    if name == "base":
        check(not asks, "base: no RDMA resource (no Pending pod where the plugin is missing)")
    else:
        check(len(asks) == 1 and c["resources"]["requests"].get(asks[0]) == 1,
              "rdma: one RDMA device-plugin resource, requested and limited")
        check(selector.get("feature.node.kubernetes.io/rdma.available") == "true",
              "rdma: only on nodes labelled as having RDMA")
        check(selector.get("nvidia.com/gpu.present") == "true", "rdma: still only on GPU nodes")
sys.exit(1 if failed else 0)

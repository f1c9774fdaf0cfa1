"""Processes and namespaces the versus benchmark starts, and their clean-up: every child is ended
by its pid and every namespace deleted on every exit path (normal end, exception, SIGINT,
SIGTERM). Nothing here ends a process it did not start."""
from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

_children: List[subprocess.Popen] = []
_namespaces: List[str] = []
_links: List[str] = []


def _cleanup() -> None:
    for child in reversed(_children):
        if child.poll() is None:
            try:
                child.terminate()
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=5)
            except ProcessLookupError:
                pass
    _children.clear()
    for ns in _namespaces:
        subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    _namespaces.clear()
    for link in _links:  # only left when a move into a namespace failed
        subprocess.run(["ip", "link", "del", link], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    _links.clear()


def _on_signal(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def install_cleanup() -> None:
    atexit.register(_cleanup)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)


def start(argv: Sequence[str], env: Optional[Dict[str, str]] = None, log: str = "",
          stdin=None, stdout=None) -> subprocess.Popen:
    out = open(log, "ab") if log else subprocess.DEVNULL
    child = subprocess.Popen(list(argv), env=env, stdin=stdin, stdout=stdout or out,
                             stderr=out, start_new_session=True)
    _children.append(child)
    return child


def stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=5)
    if child in _children:
        _children.remove(child)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # fields 14 and 15 of stat(5)


def sh(*argv: str) -> None:
    done = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed: {done.stdout.decode(errors='replace')}")


def cannot_make_namespaces() -> str:
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_SYS_ADMIN"
    probe = f"kvrvsprobe{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", probe], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode != 0:
        return "`ip netns add` failed (no rights or no iproute2)"
    subprocess.run(["ip", "netns", "del", probe])
    return ""


class NetnsPair:
    """Two namespaces joined by a veth pair, 10.S.0.1 <-> 10.S.0.2 (S from the pid)."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.ns = [f"kvrvsA{tag}", f"kvrvsB{tag}"]
        self.veth = [f"kvsa{tag}", f"kvsb{tag}"]
        subnet = 20 + os.getpid() % 200
        self.ip = [f"10.{subnet}.1.1", f"10.{subnet}.1.2"]
        for ns in self.ns:
            sh("ip", "netns", "add", ns)
            _namespaces.append(ns)
        sh("ip", "link", "add", self.veth[0], "type", "veth", "peer", "name", self.veth[1])
        _links.append(self.veth[0])
        for i in range(2):
            sh("ip", "link", "set", self.veth[i], "netns", self.ns[i])
            sh("ip", "netns", "exec", self.ns[i], "ip", "addr", "add", f"{self.ip[i]}/24", "dev",
               self.veth[i])
            sh("ip", "netns", "exec", self.ns[i], "ip", "link", "set", self.veth[i], "up")
            sh("ip", "netns", "exec", self.ns[i], "ip", "link", "set", "lo", "up")

    def prefix(self, i: int) -> List[str]:
        return ["ip", "netns", "exec", self.ns[i]]


class Worker:
    """A tools/bench/versus/worker.py process and its JSON-lines protocol."""

    def __init__(self, python: str, prefix: Sequence[str], env: Dict[str, str], log: str) -> None:
        here = os.path.dirname(os.path.abspath(__file__))
        self.log = log
        self.child = start(list(prefix) + [python, "-u", os.path.join(here, "worker.py")],
                           env=env, log=log, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.pid = self.child.pid  # `ip netns exec` execs the command: the same pid

    def send(self, op: str, **fields: Any) -> None:
        assert self.child.stdin is not None
        self.child.stdin.write((json.dumps(dict(fields, op=op)) + "\n").encode())
        self.child.stdin.flush()

    def receive(self, timeout: float = 900.0) -> Dict[str, Any]:
        assert self.child.stdout is not None
        import select
        ready, _, _ = select.select([self.child.stdout], [], [], timeout)
        line = self.child.stdout.readline() if ready else b""
        if not line:
            raise RuntimeError(f"worker {self.pid} gave no answer (exit {self.child.poll()}); "
                               f"log {self.log}:\n{tail(self.log)}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise RuntimeError(f"worker {self.pid}: {reply.get('error')}; log {self.log}:\n"
                               f"{tail(self.log)}")
        return reply

    def call(self, op: str, **fields: Any) -> Dict[str, Any]:
        self.send(op, **fields)
        return self.receive()

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def close(self) -> None:
        try:
            if self.child.poll() is None:
                self.send("quit")
                self.child.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired, BrokenPipeError):
            pass
        stop(self.child)


def tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def wait_for_daemon(python: str, env: Dict[str, str], prefix: Sequence[str], socket: str,
                    daemon: subprocess.Popen, log: str) -> None:
    """Until a client of the kvrail package reaches the daemon on `socket` (30 s)."""
    probe = f"import kvrail; c = kvrail.connect({socket!r}); c.stats(); c.close()"
    for _ in range(120):
        if daemon.poll() is not None:
            raise RuntimeError(f"kvraild exited {daemon.returncode}:\n{tail(log)}")
        done = subprocess.run(list(prefix) + [python, "-c", probe], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if done.returncode == 0:
            return
        time.sleep(0.25)
    raise RuntimeError(f"kvraild on {socket} did not answer in 30 s:\n{tail(log)}")


def temp_dir() -> str:
    return tempfile.mkdtemp(prefix="kvrail-versus-")

"""A live kvraild per test module (or per test, with `fresh_daemon`), started from $KVRAIL_DAEMON
(the Bazel runfiles' daemon/kvraild) on a unix socket in a temporary folder and ended by pid."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

import kvrail


class Daemon:
    """One kvraild child process. Not thread-safe."""

    def __init__(self, args=()) -> None:
        binary = os.environ.get("KVRAIL_DAEMON")
        if not binary:
            pytest.skip("KVRAIL_DAEMON is not set (run through bazel test //python:python_test)")
        # unix socket paths are limited to 108 bytes: a short folder under /tmp.
        self.dir = tempfile.mkdtemp(prefix="kvpy.", dir="/tmp")
        self.socket = os.path.join(self.dir, "kvrail.sock")
        self.binary = binary
        self.args = [str(a) for a in args]  # more kvraild flags (--config, --tcp-listen, ...)
        self.starts = 0
        self._start()

    def _start(self) -> None:
        self.starts += 1
        self.log_path = os.path.join(self.dir, f"kvraild.{self.starts}.log")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [self.binary, "--socket", self.socket, "--log-level", "info"] + self.args,
                stdout=log,
                stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"kvraild exited {self.process.returncode}: {self.log()}")
            if "ready: " in self.log():
                return
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"kvraild did not become ready: {self.log()}")

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def restart(self) -> int:
        """Stops the daemon (SIGTERM to our child) and starts a new one on the same socket; the
        old one's exit code."""
        code = self._end()
        self._start()
        return code

    def stop(self) -> int:
        """SIGTERM to our child only (by pid); its exit code (-9 when it had to be killed)."""
        code = self._end()
        shutil.rmtree(self.dir, ignore_errors=True)
        return code

    def _end(self) -> int:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


def _daemon():
    daemon = Daemon()
    yield daemon
    assert daemon.stop() == 0, daemon.log()


daemon = pytest.fixture(scope="module")(_daemon)
fresh_daemon = pytest.fixture(scope="function")(_daemon)


@pytest.fixture
def client(daemon):
    with kvrail.connect(daemon.socket) as c:
        yield c

"""python3 -m kvrail against a live daemon."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import kvrail
from kvtest import Pool, layout


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvrail", *args], capture_output=True, text=True,
                          env=dict(os.environ), timeout=60)


def test_status_regions_transfers(daemon, client):
    src = Pool(client, layout(), writable=False, name="cli-src")
    dst = Pool(client, layout(), writable=True, name="cli-dst")
    client.transfer(src.region, [1], dst.region, [2], label="cli-check").result(timeout=30)

    status = run("--socket", daemon.socket, "status")
    assert status.returncode == 0, status.stderr
    assert "regions" in status.stdout and "succeeded" in status.stdout

    regions = run("--socket", daemon.socket, "regions")
    assert regions.returncode == 0, regions.stderr
    assert "cli-src" in regions.stdout and "paged_kv" in regions.stdout
    listed = json.loads(run("--socket", daemon.socket, "--json", "regions").stdout)
    assert {r["spec"]["name"] for r in listed} >= {"cli-src", "cli-dst"}

    transfers = run("--socket", daemon.socket, "transfers", "--state", "succeeded")
    assert transfers.returncode == 0, transfers.stderr
    assert "cli-check" in transfers.stdout and "SUCCEEDED" in transfers.stdout
    stats = json.loads(run("--socket", daemon.socket, "--json", "status").stdout)
    assert int(stats["transfers_succeeded"]) >= 1


def test_errors_exit_1_with_the_code(tmp_path):
    result = run("--socket", str(tmp_path / "nobody.sock"), "status")
    assert result.returncode == 1
    assert result.stderr.startswith("UNAVAILABLE: ")
    assert run("bogus").returncode == 2

"""Context managers release what they hold; clients coming and going leak neither regions in the
daemon nor file descriptors here; calls on closed objects fail cleanly."""
from __future__ import annotations

import gc
import time
import os

import numpy as np
import pytest

import kvrail
from kvtest import layout


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def memfds() -> int:
    """Host buffers open in this process (memfds named kvrail*)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:kvrail")
        except OSError:
            pass
    return count


def test_many_clients_come_and_go_without_leaking_regions_or_fds(fresh_daemon):
    with kvrail.connect(fresh_daemon.socket) as observer:
        assert observer.list_regions() == []

        def one_round(i: int) -> None:
            with kvrail.connect(fresh_daemon.socket) as c, \
                    kvrail.HostBuffer(layout().nbytes, f"kvrail-round{i}") as buffer:
                c.register_host_buffer(buffer, layout=layout(), writable=True)
                c.register_host_buffer(buffer, name="bytes")
                assert len(observer.list_regions()) == 2

        one_round(0)  # warms up gRPC's process-wide state (its threads, its fds)
        gc.collect()
        fds = open_fds()
        for i in range(1, 21):
            one_round(i)
        gc.collect()
        assert open_fds() == fds
        # Only the observer's block-table buffer (made by its connect) is left: no round's host
        # buffer nor any round client's table buffer.
        assert memfds() == 1
        # The daemon releases a session's regions when its connection closes.
        for _ in range(500):
            if not observer.list_regions():
                break
            time.sleep(0.01)
        assert observer.list_regions() == []


def test_region_context_manager_unregisters(client):
    with kvrail.HostBuffer(4096) as buffer:
        before = len(client.list_regions())
        with client.register_host_buffer(buffer, name="scoped") as region:
            assert any(r.region_id == region.id for r in client.list_regions())
        assert len(client.list_regions()) == before
        region.unregister()  # idempotent
        with pytest.raises(kvrail.NotFoundError):
            client.unregister_region(region.id)


def test_closed_client_fails_cleanly(daemon):
    c = kvrail.connect(daemon.socket)
    c.close()
    c.close()
    assert c.closed
    with pytest.raises(kvrail.InvalidArgumentError, match="client: NULL"):
        c.list_regions()
    with pytest.raises(kvrail.InvalidArgumentError):
        c.poll([1])


def test_host_buffer_views_outlive_close_safely():
    baseline = memfds()
    buffer = kvrail.HostBuffer(1 << 16)
    assert memfds() == baseline + 1
    view = buffer.ndarray(np.uint32)
    view[:] = 7
    buffer.close()
    assert buffer.closed
    assert memfds() == baseline + 1  # the view still uses the memory: not freed yet
    assert int(view.sum()) == 7 * (1 << 14)
    with pytest.raises(ValueError, match="closed"):
        buffer.ndarray()
    del view
    gc.collect()
    assert memfds() == baseline
    with kvrail.HostBuffer(4096) as scoped:
        scoped.memoryview()[0] = 1
    assert memfds() == baseline


def test_connect_to_nothing_is_unavailable(tmp_path):
    socket = str(tmp_path / "none.sock")
    with pytest.raises(kvrail.UnavailableError) as e:
        kvrail.connect(socket, probe_timeout=0.2)
    assert e.value.code == kvrail.StatusCode.UNAVAILABLE
    assert socket in e.value.message


def test_bad_arguments_are_named():
    with pytest.raises(kvrail.InvalidArgumentError, match="bytes: must be > 0"):
        kvrail.HostBuffer(0)

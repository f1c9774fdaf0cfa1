"""The session's completion queue: transfer ends read from shared memory (wait, done, poll, await
on the eventfd), a full queue falling back without loss, and the old path for a client without the
queue (KVRAIL_COMPLETION_QUEUE=0)."""
from __future__ import annotations

import asyncio
import ctypes

import pytest

import kvrail
from kvrail import transfer_pb2
from kvrail._lib import lib
from kvtest import Pool, layout

SUCCEEDED = transfer_pb2.TRANSFER_STATE_SUCCEEDED


def _queue_fd(client) -> int:
    fd = ctypes.c_int(-2)
    assert lib().kvrail_completion_fd(client._h, ctypes.byref(fd)) == 0
    return fd.value


def _pools(client):
    src = Pool(client, layout(), writable=False, name="src")
    dst = Pool(client, layout(), writable=True, name="dst")
    src.fill_random(3)
    return src, dst


class _NoExecutor:
    """Fails the test if `await` falls back to an executor thread."""

    def __init__(self, loop):
        self.loop = loop

    def __call__(self, *args, **kwargs):
        raise AssertionError("await used an executor thread; the eventfd path should serve it")


def test_waits_and_awaits_read_the_queue(daemon):
    with kvrail.connect(daemon.socket) as client:
        src, dst = _pools(client)
        first = client.transfer(src.region, [1, 2], dst.region, [3, 4])
        assert _queue_fd(client) >= 0, "the session mapped no completion queue"
        status = first.result(timeout=30)
        assert status.state == SUCCEEDED
        assert status.transfer_id == first.id
        assert status.bytes_done == status.bytes_total > 0
        assert first.done()
        assert (dst.tokens([3, 4], 8) == src.tokens([1, 2], 8)).all()

        async def many():
            loop = asyncio.get_running_loop()
            loop.run_in_executor = _NoExecutor(loop)
            transfers = [client.transfer(src.region, [i % 16], dst.region, [(i * 5) % 16])
                         for i in range(200)]
            statuses = await asyncio.gather(*transfers)
            return transfers, statuses

        transfers, statuses = asyncio.run(many())
        assert [s.state for s in statuses] == [SUCCEEDED] * 200
        assert [s.transfer_id for s in statuses] == [t.id for t in transfers]
        # Batch status of them all, from the queue; an id the queue never saw still asks the
        # daemon (and a bad one raises naming its index).
        assert client.poll(transfers) == [SUCCEEDED] * 200
        with pytest.raises(kvrail.KvrailError, match=r"ids\[1\]"):
            client.poll([transfers[0].id, 987654321])


def test_await_takes_the_end_from_the_queue_without_a_call(daemon):
    # The end the queue holds is the awaited status: state, id, bytes and finish time only - no
    # path, which only the daemon's whole status (wait(), result()) carries.
    with kvrail.connect(daemon.socket) as client:
        src, dst = _pools(client)
        calls = []
        real = client._status_call

        def counted(fn, *args):
            calls.append(fn.__name__)
            return real(fn, *args)

        client._status_call = counted

        async def one():
            loop = asyncio.get_running_loop()
            loop.run_in_executor = _NoExecutor(loop)
            transfer = client.transfer(src.region, [9], dst.region, [10])
            return transfer, await transfer

        transfer, status = asyncio.run(one())
        assert status.state == SUCCEEDED
        assert status.transfer_id == transfer.id
        assert status.bytes_done == status.bytes_total > 0
        assert status.finished_unix_us > 0
        assert status.path == transfer_pb2.PATH_UNSPECIFIED, "the await read the daemon's status"
        assert calls == ["kvrail_wait_end"]
        assert transfer.wait_end() is status
        whole = transfer.result(timeout=30)
        assert whole.path != transfer_pb2.PATH_UNSPECIFIED
        assert (dst.tokens([10], 4) == src.tokens([9], 4)).all()


def test_wait_all_uses_the_eventfd(daemon):
    with kvrail.connect(daemon.socket) as client:
        src, dst = _pools(client)

        async def run():
            loop = asyncio.get_running_loop()
            loop.run_in_executor = _NoExecutor(loop)
            transfers = [client.transfer(src.region, [i % 16], dst.region, [i % 16])
                         for i in range(64)]
            return await kvrail.wait_all(transfers, poll_interval=60.0)  # no poll slice used

        statuses = asyncio.run(run())
        assert all(s.state == SUCCEEDED for s in statuses)


def test_old_path_without_the_queue(daemon, monkeypatch):
    monkeypatch.setenv("KVRAIL_COMPLETION_QUEUE", "0")
    with kvrail.connect(daemon.socket) as client:
        src, dst = _pools(client)
        transfer = client.transfer(src.region, [5], dst.region, [6])
        assert _queue_fd(client) == -1
        assert transfer.result(timeout=30).state == SUCCEEDED
        assert transfer.done()
        assert client.poll([transfer]) == [SUCCEEDED]

        async def one():
            return await client.transfer(src.region, [7], dst.region, [8])

        assert asyncio.run(one()).state == SUCCEEDED


def test_a_full_queue_falls_back_and_loses_nothing(daemon, monkeypatch):
    # An 8-entry ring with 300 transfers in flight: most ends find it full and are read the old
    # way (WAIT / GetTransfer); every wait, await and poll still sees every end.
    monkeypatch.setenv("KVRAIL_COMPLETION_QUEUE_ENTRIES", "8")
    with kvrail.connect(daemon.socket) as client:
        src, dst = _pools(client)
        assert _queue_fd(client) >= 0
        burst = [client.transfer(src.region, [i % 16], dst.region, [(i * 3) % 16])
                 for i in range(300)]
        assert [t.wait(30).state for t in burst] == [SUCCEEDED] * 300
        assert client.poll(burst) == [SUCCEEDED] * 300

        async def awaited():
            transfers = [client.transfer(src.region, [i % 16], dst.region, [i % 16])
                         for i in range(300)]
            return await asyncio.wait_for(asyncio.gather(*transfers), 60)

        assert [s.state for s in asyncio.run(awaited())] == [SUCCEEDED] * 300

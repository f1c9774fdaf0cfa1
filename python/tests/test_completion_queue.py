"""The session's completion queue: transfer ends read from shared memory (wait, done, poll, await
on the eventfd), a full queue falling back without loss, and the old path for a client without the
queue (KVRAIL_COMPLETION_QUEUE=0)."""
from __future__ import annotations

import asyncio
import ctypes
import time

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


def _after_answer(client, src, dst, src_block: int, dst_block: int):
    """A transfer that cannot end before its submit is answered (layer-wise, its layers marked
    ready only after the answer): its end comes through the queue, not with the answer, as a
    transfer that runs past its submit does (a small host transfer runs inline instead)."""
    transfer = client.transfer(src.region, [src_block], dst.region, [dst_block], layerwise=True)
    transfer.mark_ready(0, src.layout.num_layers)
    return transfer


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
        real_status_call, real_wait_end = client._status_call, client.wait_end

        def counted(fn, *args):
            calls.append(fn.__name__)
            return real_status_call(fn, *args)

        def counted_wait_end(*args, **kwargs):
            calls.append("wait_end")
            return real_wait_end(*args, **kwargs)

        client._status_call = counted
        client.wait_end = counted_wait_end

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
        # A 4 KiB host transfer runs inline, so its end came before the submit was answered:
        # the answer carried it (no call to the daemon, no look at the queue's table).
        assert calls == []
        assert transfer.wait_end() is status
        whole = transfer.result(timeout=30)
        assert whole.path != transfer_pb2.PATH_UNSPECIFIED
        assert (dst.tokens([10], 4) == src.tokens([9], 4)).all()


def test_a_small_host_transfer_ends_with_its_submit(daemon):
    # A 4 KiB host transfer runs inline, so its end is in the queue before the submit's answer,
    # and the answer carries it: done() and wait_end() then read nothing more. One that runs
    # past its answer is read from the queue as before.
    with kvrail.connect(daemon.socket) as client:
        src, dst = _pools(client)
        calls = []
        real_poll, real_wait_end = client.poll, client.wait_end

        def counted_poll(*args, **kwargs):
            calls.append("poll")
            return real_poll(*args, **kwargs)

        def counted_wait_end(*args, **kwargs):
            calls.append("wait_end")
            return real_wait_end(*args, **kwargs)

        client.poll, client.wait_end = counted_poll, counted_wait_end
        for i in range(20):
            transfer = client.transfer(src.region, [i % 16], dst.region, [(i * 3) % 16])
            assert transfer.done()
            status = transfer.wait_end()
            assert status.state == SUCCEEDED
            assert status.transfer_id == transfer.id
            assert status.bytes_done == status.bytes_total > 0
            assert status.finished_unix_us > 0
            assert transfer.result(timeout=30).finished_unix_us == status.finished_unix_us
            assert (dst.tokens([(i * 3) % 16], 4) == src.tokens([i % 16], 4)).all()
        assert calls == [], "an end the submit's answer carried was asked for again"
        later = _after_answer(client, src, dst, 5, 6)
        assert later.wait_end(30).state == SUCCEEDED
        assert calls == ["wait_end"]


def test_wait_all_uses_the_eventfd(daemon):
    with kvrail.connect(daemon.socket) as client:
        src, dst = _pools(client)

        async def run():
            loop = asyncio.get_running_loop()
            loop.run_in_executor = _NoExecutor(loop)
            transfers = [client.transfer(src.region, [i % 16], dst.region, [i % 16])
                         for i in range(64)]
            created = []
            real_create_task = loop.create_task

            def counted_create_task(*args, **kwargs):
                created.append(args)
                return real_create_task(*args, **kwargs)

            loop.create_task = counted_create_task
            statuses = await kvrail.wait_all(transfers, poll_interval=60.0)  # no poll slice used
            return statuses, list(created)  # before asyncio.run's own shutdown tasks

        statuses, created = asyncio.run(run())
        assert all(s.state == SUCCEEDED for s in statuses)
        assert created == [], "wait_all made a Task per transfer"


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


def test_awaits_one_after_another_take_their_ends_from_the_wake_up(daemon):
    # The waiter stays armed from one await to the next, so a transfer submitted meanwhile is
    # neither looked up when awaited nor read after its end: each end arrives with the wake-up's
    # one take of the queue (states, counts and finish times), resolving the await directly.
    with kvrail.connect(daemon.socket) as client:
        src, dst = _pools(client)
        looks, reads = [], []
        real_poll, real_wait_end = client.poll, client.wait_end

        def counted_poll(*args, **kwargs):
            looks.append(args)
            return real_poll(*args, **kwargs)

        def counted_wait_end(*args, **kwargs):
            reads.append(args)
            return real_wait_end(*args, **kwargs)

        client.poll, client.wait_end = counted_poll, counted_wait_end

        async def run():
            loop = asyncio.get_running_loop()
            loop.run_in_executor = _NoExecutor(loop)
            first = await _after_answer(client, src, dst, 0, 0)
            # Nothing was armed before it: one look, and one read if it had ended by then.
            assert len(looks) == 1 and len(reads) <= 1
            looks.clear()
            reads.clear()
            statuses = []
            for i in range(50):
                transfer = _after_answer(client, src, dst, i % 16, (i * 7) % 16)
                statuses.append((transfer, await transfer))
            return first, statuses

        first, statuses = asyncio.run(run())
        assert first.state == SUCCEEDED
        assert looks == [], "an await of a transfer submitted while armed looked it up"
        assert reads == [], "an await read an end the queue's take had delivered"
        for transfer, status in statuses:
            assert status.state == SUCCEEDED
            assert status.transfer_id == transfer.id
            assert status.bytes_done == status.bytes_total > 0
            assert status.finished_unix_us > 0
            assert transfer.wait_end() is status
        assert (dst.tokens([(49 * 7) % 16], 4) == src.tokens([49 % 16], 4)).all()


def test_a_shape_keeps_its_spec_and_each_transfer_its_own_fields(daemon):
    # Client.transfer serializes the spec of a shape (regions and keyword fields) once: a
    # transfer with other fields is a shape of its own, and the ids are every transfer's own.
    with kvrail.connect(daemon.socket) as client:
        src, dst = _pools(client)
        plain = [client.transfer(src.region, [i], dst.region, [i + 8]) for i in range(3)]
        labelled = client.transfer(src.region, [4], dst.region, [12], label="tagged")
        again = client.transfer(src.region, [5], dst.region, [13])
        assert len(client._specs) == 2
        for t in plain + [labelled, again]:
            assert t.result(timeout=30).state == SUCCEEDED
        assert [t.result().spec.label for t in plain + [labelled, again]] == \
            ["", "", "", "tagged", ""]
        assert labelled.response.transfer_id == labelled.id
        assert labelled.response.bytes_total == labelled.result().bytes_total > 0
        assert not labelled.response.deduplicated
        for i in range(3):
            assert (dst.tokens([i + 8], 4) == src.tokens([i], 4)).all()
        assert (dst.tokens([13], 4) == src.tokens([5], 4)).all()
        # A value that cannot be a key (a message) is serialized each time, not kept.
        flags = transfer_pb2.FlagArray(region_id=987654321, value=1)
        with pytest.raises(kvrail.KvrailError):
            client.transfer(src.region, [1], dst.region, [1], ready_flags=flags)
        assert len(client._specs) == 2


def test_a_submit_on_the_loop_dispatches_the_ends_that_came_meanwhile(daemon):
    # An event loop that submits back to back runs its reader only between steps: the ends that
    # came during a submit are dispatched by the submit itself, before the coroutine goes on.
    with kvrail.connect(daemon.socket) as client:
        src, dst = _pools(client)

        async def run():
            # Layer-wise: it cannot end before its layers are marked ready.
            first = client.transfer(src.region, [1], dst.region, [1], layerwise=True)
            waiting = asyncio.ensure_future(first.wait_async())
            await asyncio.sleep(0)  # the await registers; the waiter is armed
            waiter = client._completion_waiter(asyncio.get_running_loop())
            assert first.id in waiter._futures
            first.mark_ready(0, src.layout.num_layers)
            deadline = time.monotonic() + 30
            while not first.done() and time.monotonic() < deadline:
                time.sleep(0.001)  # the loop is held: its reader cannot run
            assert first.id in waiter._futures
            second = client.transfer(src.region, [2], dst.region, [2])
            assert first.id not in waiter._futures, "the submit left the end undispatched"
            return await waiting, await second

        first_status, second_status = asyncio.run(run())
        assert first_status.state == second_status.state == SUCCEEDED


def test_a_loop_closed_while_armed_is_disarmed_by_the_next_submit(daemon):
    # asyncio.run may end between an await and the waiter's idle disarm: the next submit finds
    # the loop closed and disarms, so no end piles up for a reader that is gone.
    with kvrail.connect(daemon.socket) as client:
        src, dst = _pools(client)

        async def one():
            return await _after_answer(client, src, dst, 3, 3)

        assert asyncio.run(one()).state == SUCCEEDED
        assert client._armed is not None, "disarmed already: nothing left to test"
        transfer = client.transfer(src.region, [4], dst.region, [4])
        assert client._armed is None
        assert transfer._armed_at is None
        assert transfer.wait_end(30).state == SUCCEEDED
        # A new loop arms again and awaits as before.
        assert asyncio.run(one()).state == SUCCEEDED

"""The submit -> end hot path: specs the library keeps parsed per shape (kvrail_spec), freed with
the client's cache and the client; the scratch memory of the one-argument calls
(kvrail_submit_spec, kvrail_wait_end_into): each thread's own, and another one for a call made
inside a call; block ids packed into it or sent as an array; an end whose status does not fit."""
from __future__ import annotations

import ctypes
import sys
import threading

import numpy as np
import pytest

import kvrail
from kvrail import transfer_pb2
from kvrail import transfers as hot
from kvrail._lib import EndWaitStruct, SpecSubmitStruct, lib
from kvtest import Pool, layout

SUCCEEDED = transfer_pb2.TRANSFER_STATE_SUCCEEDED
CANCELLED = transfer_pb2.TRANSFER_STATE_CANCELLED


def _pools(client, blocks: int = 16):
    src = Pool(client, layout(blocks=blocks), writable=False, name="src")
    dst = Pool(client, layout(blocks=blocks), writable=True, name="dst")
    src.fill_random(11)
    return src, dst


def _submit_kept(handle: int, src_block: int, dst_block: int) -> int:
    """One submit of a kept spec straight through the C ABI: its code."""
    ids = (ctypes.c_uint32 * 2)(src_block, dst_block)
    submit = SpecSubmitStruct(struct_size=ctypes.sizeof(SpecSubmitStruct), src_count=1,
                              dst_count=1, spec=handle, ids=ctypes.addressof(ids))
    return lib().kvrail_submit_spec(ctypes.addressof(submit))


def test_kept_specs_are_freed_with_the_cache_and_the_client(daemon):
    client = kvrail.connect(daemon.socket)
    src, dst = _pools(client)
    client.transfer(src.region, [0], dst.region, [0]).wait_end()
    held = client._specs[(src.id, dst.id)]  # as a submit in progress on another thread holds it
    client.transfer(src.region, [1], dst.region, [1], label="other").wait_end()
    dropped = client._specs[(src.id, dst.id, ("label", "other"))].handle
    # A full cache is cleared: the specs nobody holds are freed, the held one lives on.
    for i in range(hot._SPEC_CACHE):
        client.transfer(src.region, [2], dst.region, [2], label=f"shape {i}")
    assert len(client._specs) < hot._SPEC_CACHE
    assert (src.id, dst.id) not in client._specs
    assert lib().kvrail_spec_free(dropped) == kvrail.StatusCode.INVALID_ARGUMENT
    assert _submit_kept(held.handle, 3, 3) == kvrail.StatusCode.OK
    # The same shape after the clear: a spec of its own, the transfer as before.
    status = client.transfer(src.region, [4], dst.region, [5]).wait_end()
    assert status.state == SUCCEEDED
    assert (dst.tokens([3, 5], 8) == src.tokens([3, 4], 8)).all()
    # Closed: every kept spec is freed, and one still held names the closed client.
    kept = [spec.handle for spec in client._specs.values()]
    client.close()
    assert client._specs == {}
    assert all(lib().kvrail_spec_free(h) == kvrail.StatusCode.INVALID_ARGUMENT for h in kept)
    assert _submit_kept(held.handle, 6, 6) == kvrail.StatusCode.INVALID_ARGUMENT
    assert lib().kvrail_last_error_message() == b"spec: its client was closed"
    with pytest.raises(kvrail.InvalidArgumentError, match="^INVALID_ARGUMENT: client: NULL"):
        client.transfer(src.region, [7], dst.region, [7])


def test_threads_submit_and_wait_at_once_each_with_its_own_answers(daemon):
    # Each thread's calls use its own scratch: answers never cross between threads.
    with kvrail.connect(daemon.socket) as client:
        src, dst = _pools(client)
        errors = []

        def run(t: int) -> None:
            try:
                for i in range(150):
                    d = t * 4 + i % 4  # each thread its own destination blocks
                    s = (d * 5 + 3) % 16
                    transfer = client.transfer(src.region, [s], dst.region, [d])
                    status = transfer.wait_end()
                    assert status.transfer_id == transfer.id
                    assert status.state == SUCCEEDED
                    assert status.bytes_done == status.bytes_total > 0
                    assert transfer.response.transfer_id == transfer.id
            except Exception as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        dst_blocks = list(range(16))
        src_blocks = [(d * 5 + 3) % 16 for d in dst_blocks]
        assert (dst.tokens(dst_blocks, 64) == src.tokens(src_blocks, 64)).all()


def test_a_status_longer_than_the_scratch_comes_whole(client):
    # The daemon's status of a checked transfer carries its spec: a long label does not fit the
    # scratch's data, so the library's bytes carry it.
    src, dst = _pools(client)
    label = "L" * (2 * EndWaitStruct.data.size)
    transfer = client.transfer(src.region, [3], dst.region, [4], digest=True, label=label)
    status = transfer.wait_end()
    assert status.state == SUCCEEDED
    assert status.spec.label == label
    assert status.digest.matched
    assert transfer.wait_end() is status
    # A cancelled one ends with the daemon's status (its code and message), not a short one.
    layerwise = client.transfer(src.region, [5], dst.region, [6], layerwise=True)
    assert layerwise.wait_end(timeout=0).state != CANCELLED
    layerwise.cancel()
    ended = layerwise.wait_end()
    assert ended.state == CANCELLED
    assert ended.transfer_id == layerwise.id


def test_block_ids_inline_or_as_an_array_and_bad_ones_named(client):
    src, dst = _pools(client, blocks=160)
    # More ids than the scratch holds go as an array; a few from lists are packed into it; the
    # other sequences as arrays.
    many = list(range(hot._IDS_INLINE + 10))
    client.transfer(src.region, many, dst.region, [b + 80 for b in many]).result(timeout=30)
    tokens = 4 * len(many)
    assert (dst.tokens([b + 80 for b in many], tokens) == src.tokens(many, tokens)).all()
    client.transfer(src.region, (150, 151), dst.region, np.array([0, 1])).result(timeout=30)
    assert (dst.tokens([0, 1], 8) == src.tokens([150, 151], 8)).all()
    for src_blocks, dst_blocks, side in (([-1], [0], "src_blocks"), ([0], [1 << 32], "dst_blocks"),
                                         ([0.5], [0], "src_blocks"), ([0], ["1"], "dst_blocks")):
        with pytest.raises(ValueError, match=f"^{side}: block ids must be integers"):
            client.transfer(src.region, src_blocks, dst.region, dst_blocks)
    with pytest.raises(kvrail.InvalidArgumentError, match=r"spec.src.block_ids\[1\]"):
        client.transfer(src.region, [0, 160], dst.region, [0, 1])


def _reenter_after_pack(packers, call):
    """A profile function that makes `call` once, right after one of `packers` wrote a hot
    call's arguments: code run between the arguments' pack and the call, as a signal handler or a
    finalizer may run there."""
    made = []

    def profile(frame, event, arg):
        if event == "c_return" and not made and getattr(arg, "__self__", None) in packers:
            made.append(call())

    return made, profile


def test_a_call_made_inside_another_does_not_take_its_scratch(client):
    # A call made while another is between writing its arguments and reading its answer (a
    # signal handler's, a finalizer's) uses memory of its own: both get their own answers.
    src, dst = _pools(client)
    first = client.transfer(src.region, [1], dst.region, [2])
    second = client.transfer(src.region, [3], dst.region, [4])
    first.wait_end(), second.wait_end()
    made, profile = _reenter_after_pack([hot._WAIT_IN], lambda: client.wait_end(second.id))
    sys.setprofile(profile)
    try:
        outer = client.wait_end(first.id)
    finally:
        sys.setprofile(None)
    assert made[0].transfer_id == second.id
    assert outer.transfer_id == first.id
    made, profile = _reenter_after_pack(
        hot._SUBMIT_IDS, lambda: client.transfer(src.region, [5], dst.region, [6]))
    sys.setprofile(profile)
    try:
        outer = client.transfer(src.region, [7], dst.region, [8])
    finally:
        sys.setprofile(None)
    inner = made[0]
    assert inner.id != outer.id
    assert outer.wait_end().transfer_id == outer.id
    assert inner.wait_end().transfer_id == inner.id
    assert (dst.tokens([6, 8], 8) == src.tokens([5, 7], 8)).all()


def test_failed_calls_give_their_scratch_back(client):
    # A refused submit, bad ids and an unknown transfer leave the thread's scratch for the next
    # call (no new one per failure).
    src, dst = _pools(client)
    client.transfer(src.region, [0], dst.region, [0]).wait_end()
    kept = list(hot._local.free)
    for _ in range(3):
        with pytest.raises(kvrail.InvalidArgumentError):
            client.transfer(src.region, [0], dst.region, [16])
        with pytest.raises(ValueError):
            client.transfer(src.region, [-1], dst.region, [0])
        with pytest.raises(kvrail.NotFoundError):
            client.wait_end(987654321, timeout=0)
    assert [id(s) for s in hot._local.free] == [id(s) for s in kept]


def test_ids_and_timeouts_outside_the_c_types_are_answered_as_before(client):
    # An id outside uint64 reaches the daemon wrapped, as ctypes passed it, and its NOT_FOUND
    # names it; a timeout past int64 waits as long as there is (here: the end is there).
    src, dst = _pools(client)
    transfer = client.transfer(src.region, [0], dst.region, [1])
    kept = [id(s) for s in hot._local.free]
    for bad in (-5, 1 << 64):
        with pytest.raises(kvrail.NotFoundError, match=f"no transfer {bad % (1 << 64)}$"):
            client.wait_end(bad, timeout=0)
    assert client.wait_end(transfer.id, timeout=1e30).state == SUCCEEDED
    with pytest.raises(ValueError):
        client.wait_end("x")
    assert [id(s) for s in hot._local.free] == kept

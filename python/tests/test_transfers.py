"""Transfers between numpy-viewed host regions through a live kvraild."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

import kvrail
from kvrail import transfer_pb2
from kvrail.layouts import ORDER_LAYER_PART_BLOCK_HND, ORDER_LAYER_PART_BLOCK_NHD
from kvtest import Pool, layout

SUCCEEDED = transfer_pb2.TRANSFER_STATE_SUCCEEDED


def test_scattered_blocks_move_byte_for_byte(client):
    src = Pool(client, layout(), writable=False, name="src")
    dst = Pool(client, layout(), writable=True, name="dst")
    src.fill_random(1)
    src_blocks, dst_blocks = [7, 2, 11, 0], [3, 15, 1, 8]
    transfer = client.transfer(src.region, src_blocks, dst.region, dst_blocks)
    status = transfer.result(timeout=30)
    assert status.state == SUCCEEDED
    assert transfer.done()
    assert status.bytes_done == status.bytes_total == 4 * 3 * 2 * 4 * 4 * 8 * 2
    tokens = 4 * 4
    np.testing.assert_array_equal(dst.tokens(dst_blocks, tokens), src.tokens(src_blocks, tokens))
    untouched = [b for b in range(16) if b not in dst_blocks]
    assert (dst.view[:, :, untouched].view(np.uint8) == 0xAB).all()


def test_nhd_to_hnd_with_a_block_size_change(client):
    # 4-token NHD blocks into 8-token HND blocks: 6 source blocks = 24 tokens = 3 destination
    # blocks.
    src = Pool(client, layout(order=ORDER_LAYER_PART_BLOCK_NHD, tpb=4), writable=False)
    dst = Pool(client, layout(order=ORDER_LAYER_PART_BLOCK_HND, tpb=8, blocks=8), writable=True)
    src.fill_random(2)
    src_blocks, dst_blocks = [5, 1, 9, 3, 12, 4], [6, 0, 2]
    client.transfer(src.region, src_blocks, dst.region, dst_blocks).result(timeout=30)
    np.testing.assert_array_equal(dst.tokens(dst_blocks, 24), src.tokens(src_blocks, 24))


def test_digest_is_requested_by_keyword_and_reported_in_the_status(client):
    # The docstring's promise: digest=True checks every tile end to end, across a layout
    # change, and the status says so; without it no digest is reported.
    src = Pool(client, layout(order=ORDER_LAYER_PART_BLOCK_NHD, tpb=4), writable=False)
    dst = Pool(client, layout(order=ORDER_LAYER_PART_BLOCK_HND, tpb=8, blocks=8), writable=True)
    src.fill_random(5)
    src_blocks, dst_blocks = [5, 1, 9, 3], [6, 2]
    checked = client.transfer(src.region, src_blocks, dst.region, dst_blocks,
                              digest=True).result(timeout=30)
    assert checked.state == SUCCEEDED
    assert checked.spec.digest
    assert checked.HasField("digest")
    assert checked.digest.matched
    assert checked.digest.source == checked.digest.destination != 0
    assert checked.digest.tiles_checked >= 1
    np.testing.assert_array_equal(dst.tokens(dst_blocks, 16), src.tokens(src_blocks, 16))
    plain = client.transfer(src.region, src_blocks, dst.region, dst_blocks).result(timeout=30)
    assert not plain.HasField("digest")


def test_layer_and_head_ranges(client):
    src = Pool(client, layout(layers=4, heads=4), writable=False)
    dst = Pool(client, layout(layers=2, heads=2), writable=True)
    src.fill_random(3)
    # Source layers 1..2 and heads 2..3 into destination layers 0..1, heads 0..1.
    client.transfer(src.region, [4, 5], dst.region, [1, 2], src_layer_begin=1, num_layers=2,
                    src_head_begin=2, num_heads=2).result(timeout=30)
    expected = src.tokens([4, 5], 8)[1:3, :, :, 2:4]
    np.testing.assert_array_equal(dst.tokens([1, 2], 8), expected)


def test_errors_carry_the_code_and_name_the_field(client):
    src = Pool(client, layout(), writable=False)
    dst = Pool(client, layout(), writable=True)
    with pytest.raises(kvrail.InvalidArgumentError) as bad_block:
        client.transfer(src.region, [0, 1], dst.region, [2, 16])
    assert bad_block.value.code == kvrail.StatusCode.INVALID_ARGUMENT
    assert bad_block.value.code_name == "INVALID_ARGUMENT"
    assert bad_block.value.message == "spec.dst.block_ids[1]: block 16 out of range [0, 16)"
    # A read-only region is no destination.
    with pytest.raises(kvrail.KvrailError) as read_only:
        client.transfer(dst.region, [0], src.region, [0])
    assert read_only.value.code != kvrail.StatusCode.OK
    assert "dst" in read_only.value.message
    with pytest.raises(kvrail.NotFoundError) as unknown:
        client.get(987654321)
    assert unknown.value.code == kvrail.StatusCode.NOT_FOUND
    with pytest.raises(kvrail.InvalidArgumentError, match="num_parts"):
        client.register_host_buffer(src.buffer, layout=layout(parts=3), writable=True)
    assert (dst.view.view(np.uint8) == 0xAB).all()  # nothing moved


def test_batch_poll(client):
    src = Pool(client, layout(), writable=False)
    dst = Pool(client, layout(), writable=True)
    transfers = [client.transfer(src.region, [b], dst.region, [b]) for b in range(8)]
    for t in transfers:
        t.wait()
    assert kvrail.poll(transfers) == [SUCCEEDED] * 8
    assert client.poll([t.id for t in transfers]) == [SUCCEEDED] * 8
    with pytest.raises(kvrail.NotFoundError, match=r"NOT_FOUND: ids\[1\]: "):
        client.poll([transfers[0], 424242, transfers[1]])
    assert client.poll([transfers[0], 424242], raise_on_error=False) == [SUCCEEDED, 0]
    assert client.poll([]) == []


def test_layerwise_wait_timeout_mark_ready_and_cancel(client):
    src = Pool(client, layout(), writable=False)
    dst = Pool(client, layout(), writable=True)
    src.fill_random(4)
    transfer = client.transfer(src.region, [0], dst.region, [1], layerwise=True)
    status = transfer.wait(timeout=0.05)
    assert not kvrail.is_final(status.state)
    assert not transfer.done()
    with pytest.raises(TimeoutError):
        transfer.result(timeout=0.01)
    transfer.mark_ready(0, 3)
    assert transfer.result(timeout=30).state == SUCCEEDED
    waiting = client.transfer(src.region, [2], dst.region, [3], layerwise=True)
    waiting.cancel()
    with pytest.raises(kvrail.TransferFailedError) as cancelled:
        waiting.result(timeout=30)
    assert cancelled.value.status.state == transfer_pb2.TRANSFER_STATE_CANCELLED


def test_asyncio_await_does_not_block_the_loop(client):
    src = Pool(client, layout(), writable=False)
    dst = Pool(client, layout(), writable=True)
    src.fill_random(5)

    async def scenario():
        transfer = client.transfer(src.region, [0], dst.region, [0], layerwise=True)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        tick_task = asyncio.ensure_future(ticker())
        waiter = asyncio.ensure_future(transfer)
        await asyncio.sleep(0.3)  # the transfer waits for its layers: the loop keeps running
        assert not waiter.done()
        assert ticks >= 10
        transfer.mark_ready(0, 3)
        status = await asyncio.wait_for(waiter, 30)
        tick_task.cancel()
        many = [client.transfer(src.region, [b], dst.region, [b]) for b in range(1, 6)]
        finals = await kvrail.wait_all(many)
        return status, finals

    status, finals = asyncio.run(scenario())
    assert status.state == SUCCEEDED
    assert [f.state for f in finals] == [SUCCEEDED] * 5


def test_awaiting_a_failed_transfer_raises(client):
    src = Pool(client, layout(), writable=False)
    dst = Pool(client, layout(), writable=True)
    transfer = client.transfer(src.region, [0], dst.region, [0], layerwise=True)
    transfer.cancel()

    async def run():
        return await transfer

    with pytest.raises(kvrail.TransferFailedError):
        asyncio.run(run())


def test_block_ids_from_numpy_and_bad_ids_are_named(client):
    src = Pool(client, layout(), writable=False, name="src")
    dst = Pool(client, layout(), writable=True, name="dst")
    src.fill_random(21)
    src_blocks = np.array([3, 1, 8], dtype=np.int64)
    dst_blocks = np.array([0, 15, 2], dtype=np.uint32)
    client.transfer(src.region, src_blocks, dst.region, dst_blocks).result(timeout=30)
    np.testing.assert_array_equal(dst.tokens([0, 15, 2], 12), src.tokens([3, 1, 8], 12))
    with pytest.raises(ValueError, match="src_blocks"):
        client.transfer(src.region, [-1], dst.region, [0])
    with pytest.raises(kvrail.InvalidArgumentError, match=r"spec.dst.block_ids\[0\]"):
        client.transfer(src.region, [0], dst.region, [16])


def test_submit_batch_answers_each_spec_on_its_own(client):
    src = Pool(client, layout(), writable=False)
    dst = Pool(client, layout(), writable=True)
    src.fill_random(6)

    def spec(s, d, region=None):
        t = transfer_pb2.TransferSpec()
        t.src.region_id = src.region.id
        t.dst.region_id = dst.region.id if region is None else region
        t.src.block_ids.append(s)
        t.dst.block_ids.append(d)
        return t

    # K, V and auxiliary state of one chunk, a refused one among them.
    results = client.submit_batch([spec(0, 4), spec(1, 5), spec(2, 0, region=424242),
                                   spec(3, 7)])
    assert isinstance(results[2], kvrail.NotFoundError)
    assert "specs[2]: spec.dst.region_id" in str(results[2])
    done = [results[i] for i in (0, 1, 3)]
    assert all(isinstance(t, kvrail.Transfer) for t in done)
    assert [t.result(timeout=30).state for t in done] == [SUCCEEDED] * 3
    tokens = 3 * 4
    np.testing.assert_array_equal(dst.tokens([4, 5, 7], tokens), src.tokens([0, 1, 3], tokens))
    assert client.submit_batch([]) == []

"""Prepared transfers (Client.prepare) through a live kvraild: a shape posted many times with new
block ids moves exactly those blocks; bad ids, a released shape and an unregistered region
raise exceptions carrying the gRPC code."""
from __future__ import annotations

import numpy as np
import pytest

import kvrail
from kvrail import StatusCode
from kvtest import Pool, layout


def test_posts_with_new_ids_move_exactly_their_blocks(client):
    src = Pool(client, layout(), writable=False, name="src")
    dst = Pool(client, layout(), writable=True, name="dst")
    src.fill_random(3)
    moved = {}  # dst block -> src block
    with client.prepare(src.region, dst.region, src_block_count=2) as shape:
        assert shape.src_block_count == 2 and shape.dst_block_count == 2
        assert shape.info.bytes_total == 3 * 2 * 2 * 4 * 4 * 8 * 2
        for s, d in [([7, 2], [3, 15]), ([0, 0], [1, 8]), ([11, 5], [0, 9]),
                     (np.array([4, 6], dtype=np.uint32), [12, 13])]:
            status = shape.post(s, d).result(timeout=30)
            assert status.state == kvrail.transfer_pb2.TRANSFER_STATE_SUCCEEDED
            moved.update(zip(d, [int(b) for b in s]))
    assert shape.released
    for d, s in moved.items():
        np.testing.assert_array_equal(dst.tokens([d], 4), src.tokens([s], 4))
    untouched = [b for b in range(16) if b not in moved]
    assert (dst.view[:, :, untouched].view(np.uint8) == 0xAB).all()


def test_bad_posts_raise_with_the_code_and_the_field(client):
    src = Pool(client, layout(), writable=False, name="src")
    dst = Pool(client, layout(), writable=True, name="dst")
    shape = client.prepare(src.region, dst.region, src_block_count=1)
    with pytest.raises(kvrail.InvalidArgumentError) as bad:
        shape.post([16], [0])
    assert bad.value.code == StatusCode.INVALID_ARGUMENT
    assert bad.value.message == "post.src_block_ids[0]: block 16 out of range [0, 16)"
    with pytest.raises(kvrail.InvalidArgumentError, match="post.dst_block_ids: 2 ids"):
        shape.post([1], [2, 3])
    with pytest.raises(ValueError, match="src_blocks"):
        shape.post([-1], [0])
    shape.release()
    shape.release()  # idempotent
    with pytest.raises(kvrail.FailedPreconditionError) as released:
        shape.post([1], [2])
    assert released.value.code == StatusCode.FAILED_PRECONDITION
    assert (dst.view.view(np.uint8) == 0xAB).all()


def test_a_shape_dies_with_its_region(client):
    src = Pool(client, layout(), writable=False, name="src")
    dst = Pool(client, layout(), writable=True, name="dst")
    with client.prepare(src.region, dst.region, src_block_count=1) as shape:
        shape.post([1], [2]).result(timeout=30)
        dst.region.unregister()
        with pytest.raises(kvrail.NotFoundError, match="prepared_id") as gone:
            shape.post([1], [3])
        assert gone.value.code == StatusCode.NOT_FOUND

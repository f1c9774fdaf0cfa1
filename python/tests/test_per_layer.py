"""Per-layer regions (RegionSpec.layer_shares): a KV pool whose layers live in separate host
buffers, moved in one transfer to and from a stacked pool, with layout conversion and layer
ranges, checked element by element against the logical layout."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import kvrail
from kvrail import transfer_pb2
from kvrail.layouts import ORDER_LAYER_PART_BLOCK_HND, ORDER_LAYER_PART_BLOCK_NHD
from kvtest import Pool, layout

SUCCEEDED = transfer_pb2.TRANSFER_STATE_SUCCEEDED


class LayeredPool:
    """`layers` host buffers (layer 1 and 2 share one, at an odd page offset), one layer each."""

    def __init__(self, client, one_layer, layers: int, writable: bool) -> None:
        self.one = one_layer  # num_layers == 1
        self.layout = dataclasses.replace(one_layer, num_layers=layers)
        n = one_layer.nbytes
        self.buffers = [kvrail.HostBuffer(n, "layer 0"), kvrail.HostBuffer(2 * n + 8192, "1 and 2")]
        self.places = [(self.buffers[0], 0), (self.buffers[1], 4096), (self.buffers[1], n + 8192)]
        self.places = self.places[:layers]
        for b in self.buffers:
            b.ndarray()[:] = 0xAB
        self.region = client.register_host_layers(self.places, self.layout, writable=writable,
                                                  name="per-layer")
        self.views = [buf.ndarray(np.uint16, one_layer.shape6(), one_layer.strides6(), off)[0]
                      for buf, off in self.places]  # each [P, B, T, H, D]

    @property
    def id(self) -> int:
        return self.region.id

    def fill_random(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        for v in self.views:
            v[...] = rng.integers(0, 1 << 16, size=v.shape, dtype=np.uint16)

    def tokens(self, blocks, count: int) -> np.ndarray:
        tpb = self.one.tokens_per_block
        return np.stack([np.stack([v[:, blocks[i // tpb], i % tpb] for i in range(count)], axis=1)
                         for v in self.views])  # [L, P, count, H, D]


def test_per_layer_source_into_a_stacked_pool_with_conversion(client):
    src = LayeredPool(client, layout(order=ORDER_LAYER_PART_BLOCK_NHD, tpb=4, layers=1), 3,
                      writable=False)
    assert src.region.info.spec.paged_kv.layer_stride == 0
    assert len(src.region.info.spec.layer_shares) == 3
    dst = Pool(client, layout(order=ORDER_LAYER_PART_BLOCK_HND, tpb=8, blocks=8, layers=3),
               writable=True)
    src.fill_random(11)
    src_blocks, dst_blocks = [5, 1, 9, 3], [6, 2]
    status = client.transfer(src.region, src_blocks, dst.region, dst_blocks).result(timeout=30)
    assert status.state == SUCCEEDED
    np.testing.assert_array_equal(dst.tokens(dst_blocks, 16), src.tokens(src_blocks, 16))
    untouched = [b for b in range(8) if b not in dst_blocks]
    assert (dst.view[:, :, untouched].view(np.uint8) == 0xAB).all()


def test_stacked_pool_into_per_layer_destination_with_a_layer_range(client):
    src = Pool(client, layout(layers=3), writable=False)
    dst = LayeredPool(client, layout(layers=1), 3, writable=True)
    src.fill_random(12)
    # Source layers 1..2 into destination layers 0..1; destination layer 2 stays poisoned.
    t = client.transfer(src.region, [7, 0], dst.region, [2, 3], num_layers=2, src_layer_begin=1)
    assert t.result(timeout=30).state == SUCCEEDED
    got = dst.tokens([2, 3], 8)
    np.testing.assert_array_equal(got[:2], src.tokens([7, 0], 8)[1:3])
    assert (dst.views[2].view(np.uint8) == 0xAB).all()
    # Nothing outside the layers' spans changed: the gap between layers 1 and 2 in the shared
    # buffer and the bytes before layer 1.
    shared = dst.buffers[1].ndarray()
    n = dst.one.nbytes
    assert (shared[:4096] == 0xAB).all()
    assert (shared[4096 + n:n + 8192] == 0xAB).all()


def test_per_layer_region_errors_are_named(client):
    one = layout(layers=1)
    buf = kvrail.HostBuffer(one.nbytes)
    with pytest.raises(kvrail.InvalidArgumentError, match="spec.layer_shares: 1 shares for 2"):
        client.register_host_layers([buf], dataclasses.replace(one, num_layers=2))
    small = kvrail.HostBuffer(one.nbytes // 2)
    with pytest.raises(kvrail.InvalidArgumentError, match=r"spec.layer_shares\[1\]"):
        client.register_host_layers([buf, small], dataclasses.replace(one, num_layers=2))
    # A block id beyond the pool is refused before anything moves.
    src = LayeredPool(client, one, 2, writable=False)
    dst = Pool(client, layout(layers=2), writable=True)
    with pytest.raises(kvrail.InvalidArgumentError, match=r"spec.src.block_ids\[0\]"):
        client.transfer(src.region, [16], dst.region, [0])
    assert (dst.view.view(np.uint8) == 0xAB).all()

"""The element type is part of a paged layout: bytes move unconverted, so an fp16 pool into a bf16
pool is refused naming spec.reinterpret_dtype, unless the transfer sets it. The dtype travels
from PagedLayout (and from a tensor's dtype through layout_from_strides) to the daemon."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import kvrail
from kvrail.layouts import DTYPE_BF16, DTYPE_FP16, DTYPE_FP32, dtype_of, layout_from_strides
from kvtest import Pool, layout


def test_fp16_into_bf16_is_refused_naming_the_field(client):
    src = Pool(client, dataclasses.replace(layout(), dtype=DTYPE_FP16), writable=False)
    dst = Pool(client, layout(), writable=True)  # bf16
    assert src.region.info.spec.paged_kv.dtype == DTYPE_FP16
    assert dst.region.info.spec.paged_kv.dtype == DTYPE_BF16
    with pytest.raises(kvrail.InvalidArgumentError) as refused:
        client.transfer(src.region, [0, 1], dst.region, [2, 3])
    assert refused.value.message.startswith(
        "spec.reinterpret_dtype: the source's paged_kv.dtype is DTYPE_FP16, the destination's "
        "DTYPE_BF16")
    assert (dst.view.view(np.uint8) == 0xAB).all()  # nothing moved


def test_reinterpret_dtype_moves_the_bytes_as_they_are(client):
    src = Pool(client, dataclasses.replace(layout(), dtype=DTYPE_FP16), writable=False)
    dst = Pool(client, layout(), writable=True)
    src.fill_random(4)
    client.transfer(src.region, [0, 5], dst.region, [2, 3], reinterpret_dtype=True,
                    label="reinterpreted").result(timeout=30)
    listed = client.list_transfers(label="reinterpreted")
    assert len(listed) == 1 and listed[0].spec.reinterpret_dtype  # the record keeps the flag
    np.testing.assert_array_equal(dst.tokens([2, 3], 8), src.tokens([0, 5], 8))


def test_sizes_that_differ_stay_refused_even_when_reinterpreting(client):
    src = Pool(client, dataclasses.replace(layout(head_dim=4), dtype=DTYPE_FP32), writable=False)
    dst = Pool(client, layout(head_dim=8), writable=True)
    with pytest.raises(kvrail.InvalidArgumentError, match="spec.dst.region_id: head vectors"):
        client.transfer(src.region, [0], dst.region, [1], reinterpret_dtype=True)


def test_a_tensor_layout_carries_its_dtype():
    # [layers, 2, blocks, block_size, heads, head_size] of float16, as numpy gives it.
    arr = np.zeros((2, 2, 4, 16, 2, 8), dtype=np.float16)
    lay = layout_from_strides(arr.shape, [s // arr.itemsize for s in arr.strides], arr.itemsize,
                              "vllm_nhd", dtype_of(arr.dtype.name))
    assert lay.dtype == DTYPE_FP16
    assert lay.to_proto().dtype == DTYPE_FP16
    with pytest.raises(ValueError, match="itemsize"):
        layout_from_strides(arr.shape, [1] * 6, 2, "vllm_nhd", DTYPE_FP32)

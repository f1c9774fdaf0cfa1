"""A torch CPU tensor after share_memory_() registered without a copy (Client.register_host_array):
written after registration, moved by kvraild, and the destination tensor shows the bytes with no
read-back. Runs under the PyPI venv's interpreter (torch), //python:torch_host_test."""
from __future__ import annotations

import pytest
import torch

import kvrail
from kvrail.layouts import KV_LAYOUTS, dtype_of, layout_from_strides

# vLLM's per-layer-stacked shape: [layers, 2, blocks, block_size, heads, head_size].
SHAPE = (3, 2, 16, 4, 4, 8)


def kv_tensor() -> torch.Tensor:
    t = torch.zeros(SHAPE, dtype=torch.bfloat16)
    t.share_memory_()  # moves the storage into shared memory (torch's file_descriptor strategy)
    assert t.is_shared()
    return t


def layout_of(t: torch.Tensor):
    return layout_from_strides(t.shape, t.stride(), t.element_size(), KV_LAYOUTS["vllm_nhd"],
                               dtype_of(t.dtype))


def test_a_shared_tensor_moves_without_a_copy(client):
    src, dst = kv_tensor(), kv_tensor()
    src_region = client.register_host_array(src, layout=layout_of(src), name="prefill kv")
    dst_region = client.register_host_array(dst, layout=layout_of(dst), writable=True,
                                            name="decode kv")
    assert src_region.info.spec.size_bytes == src.numel() * src.element_size()
    for seed in (1, 2):  # twice: the daemon reads the tensor's pages as they are now
        torch.manual_seed(seed)
        src.copy_(torch.randn(SHAPE, dtype=torch.bfloat16))  # written after registration
        dst.fill_(0)
        src_blocks, dst_blocks = [9, 0, 14], [2, 7, 11]
        status = client.transfer(src_region, src_blocks, dst_region,
                                 dst_blocks).result(timeout=30)
        assert status.state == kvrail.transfer_pb2.TRANSFER_STATE_SUCCEEDED
        for s, d in zip(src_blocks, dst_blocks):
            assert torch.equal(dst[:, :, d], src[:, :, s])
        assert not dst[:, :, [b for b in range(16) if b not in dst_blocks]].any()


def test_a_slice_of_a_shared_tensor_registers_at_its_offset(client):
    whole = torch.zeros((2,) + SHAPE, dtype=torch.bfloat16)
    whole.share_memory_()
    src, dst = whole[0], whole[1]  # the second starts mid-storage
    src_region = client.register_host_array(src, layout=layout_of(src))
    dst_region = client.register_host_array(dst, layout=layout_of(dst), writable=True)
    src.copy_(torch.arange(src.numel(), dtype=torch.float32).reshape(SHAPE).to(torch.bfloat16))
    client.transfer(src_region, [1, 2], dst_region, [3, 4]).result(timeout=30)
    assert torch.equal(dst[:, :, 3:5], src[:, :, 1:3])
    assert not dst[:, :, :3].any()


def test_a_tensor_that_is_not_shared_is_refused_naming_obj(client):
    private = torch.zeros(SHAPE, dtype=torch.bfloat16)
    with pytest.raises(kvrail.InvalidArgumentError) as refused:
        client.register_host_array(private, layout=layout_of(private))
    assert refused.value.message.startswith("obj: ")
    assert "share_memory_" in refused.value.message
    assert client.list_regions() == []

"""Layout arithmetic without a daemon or torch: dense strides per order (checked against the C
library's kvrail_paged_layout_bytes), layouts read from tensor shapes/strides (numpy arrays stand
in for tensors), and the torch entry points' argument handling."""
from __future__ import annotations

import ctypes
import os
import re

import numpy as np
import pytest

import kvrail
from kvrail import layouts, tensors
from kvrail._lib import PagedLayoutStruct, check, lib
from kvrail.layouts import PagedLayout, layout_from_strides
from kvrail.proto import region_pb2


def c_layout_bytes(layout: PagedLayout) -> int:
    s = PagedLayoutStruct(struct_size=ctypes.sizeof(PagedLayoutStruct),
                          num_layers=layout.num_layers,
                          num_parts=layout.num_parts, num_blocks=layout.num_blocks,
                          tokens_per_block=layout.tokens_per_block, num_heads=layout.num_heads,
                          head_dim=layout.head_dim, dtype=layout.dtype, order=layout.order,
                          layer_stride=layout.layer_stride, part_stride=layout.part_stride,
                          block_stride=layout.block_stride, token_stride=layout.token_stride,
                          head_stride=layout.head_stride, offset_bytes=layout.offset_bytes)
    out = ctypes.c_uint64()
    check(lib().kvrail_paged_layout_bytes(ctypes.byref(s), ctypes.byref(out)))
    return out.value


@pytest.mark.parametrize("order", sorted(layouts.ORDER_AXES))
def test_dense_strides_match_the_library(order):
    layout = PagedLayout(3, 2, 5, 4, 6, 8, layouts.DTYPE_FP16, order, offset_bytes=64)
    assert layout.nbytes == c_layout_bytes(layout) == 64 + 3 * 2 * 5 * 4 * 6 * 8 * 2
    # Dense: every element at a distinct offset, filling the span exactly.
    view = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), layout.shape6()[:5],
                                           layout.strides6()[:5])
    offsets = {layout.element_offset(*idx) for idx in np.ndindex(view.shape)}
    assert len(offsets) == 3 * 2 * 5 * 4 * 6
    assert max(offsets) + 16 == layout.nbytes


def test_order_axes_follow_the_proto_names():
    # LAYOUT_ORDER_LAYER_PART_BLOCK_HND: heads outside tokens.
    hnd = PagedLayout(1, 2, 3, 4, 5, 8, layouts.DTYPE_BF16, layouts.ORDER_LAYER_PART_BLOCK_HND)
    s = hnd.strides()
    assert s["D"] == 2 and s["T"] == 16 and s["H"] == 16 * 4 and s["B"] == 16 * 4 * 5
    block_major = PagedLayout(2, 2, 3, 4, 5, 8, layouts.DTYPE_BF16,
                              layouts.ORDER_BLOCK_LAYER_PART_NHD)
    assert block_major.strides()["B"] == 2 * 2 * 4 * 5 * 8 * 2
    assert PagedLayout.from_proto(hnd.to_proto()) == hnd


@pytest.mark.parametrize("preset,shape_of", [
    ("vllm_nhd", lambda L, P, B, T, H, D: (L, P, B, T, H, D)),
    ("flashinfer_nhd", lambda L, P, B, T, H, D: (L, B, P, T, H, D)),
    ("flashinfer_hnd", lambda L, P, B, T, H, D: (L, B, P, H, T, D)),
])
def test_presets_read_contiguous_tensors(preset, shape_of):
    dims = dict(L=3, P=2, B=7, T=16, H=4, D=8)
    shape = shape_of(*dims.values())
    assert layouts.dense_shape(preset, 3, 2, 7, 16, 4, 8) == shape
    tensor = np.zeros(shape, dtype=np.float16)
    got = layout_from_strides(tensor.shape, [s // 2 for s in tensor.strides], 2, preset,
                              layouts.dtype_of(str(tensor.dtype)))
    assert (got.num_layers, got.num_parts, got.num_blocks, got.tokens_per_block, got.num_heads,
            got.head_dim) == (3, 2, 7, 16, 4, 8)
    assert got.nbytes == tensor.nbytes == c_layout_bytes(got)
    # Element offsets agree with numpy's for every (layer, part, block, token, head).
    axes = layouts.KV_LAYOUTS[preset]
    for idx in [(0, 0, 0, 0, 0), (2, 1, 6, 15, 3), (1, 0, 3, 7, 2)]:
        logical = dict(zip("LPBTH", idx))
        position = tuple(logical.get(a, 0) for a in axes)
        assert got.element_offset(*idx) == np.ravel_multi_index(position, shape) * 2


def test_mla_and_single_layer_and_padded_strides():
    mla = layout_from_strides((4, 10, 16, 576), (10 * 16 * 576, 16 * 576, 576, 1), 2, "mla",
                              layouts.DTYPE_BF16)
    assert (mla.num_layers, mla.num_parts, mla.num_heads, mla.head_dim) == (4, 1, 1, 576)
    assert mla.nbytes == c_layout_bytes(mla) == 4 * 10 * 16 * 576 * 2
    # A per-layer vLLM tensor [2, blocks, T, H, D]: no L axis.
    one = layout_from_strides((2, 5, 16, 8, 128), (5 * 16 * 8 * 128, 16 * 8 * 128, 8 * 128, 128, 1),
                              1, "PBTHD", layouts.DTYPE_FP8_E4M3)
    assert one.num_layers == 1 and one.nbytes == 2 * 5 * 16 * 8 * 128
    # Padded blocks (block stride larger than dense): the span ends at the last element.
    padded = layout_from_strides((2, 3, 4, 2, 8), (3 * 100, 100, 16, 8, 1), 2, "PBTHD",
                                 layouts.DTYPE_BF16)
    assert padded.block_stride == 200
    assert padded.nbytes == c_layout_bytes(padded) == 2 * (300 + 200 + 48 + 8 + 7 + 1)


def _layout_cases():
    """layout/paged_layout_cases.txt (its header says the format), from the test's runfiles."""
    root = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "kvrail"))
    cases = []
    with open(os.path.join(root, "layout", "paged_layout_cases.txt")) as f:
        for line in f:
            t = line.split("#")[0].split()
            if not t:
                continue
            assert len(t) == 18, line
            enum = lambda e, v: int(v) if v.isdigit() else e.Value(v)  # noqa: E731
            layout = PagedLayout(*map(int, t[1:7]), dtype=enum(region_pb2.DType, t[7]),
                                 order=enum(region_pb2.LayoutOrder, t[8]),
                                 layer_stride=int(t[9]), part_stride=int(t[10]),
                                 block_stride=int(t[11]), token_stride=int(t[12]),
                                 head_stride=int(t[13]), offset_bytes=int(t[14]))
            region = None if t[15] == "-" else int(t[15])
            cases.append(pytest.param(layout, region, t[16] == "1", t[17], id=t[0]))
    assert cases
    return cases


@pytest.mark.parametrize("layout,region_bytes,per_layer,expect", _layout_cases())
def test_the_table_of_layouts_gets_the_daemons_verdicts(layout, region_bytes, per_layer, expect):
    # The same table runs through the planner, the C++ client and the C ABI in C++
    # (tests/layout): the Python package must judge it alike, through the library.
    if expect.startswith("ok:"):
        assert layout.check(region_bytes, per_layer) == int(expect[3:])
        return
    with pytest.raises(kvrail.InvalidLayoutError) as e:
        layout.check(region_bytes, per_layer)
    assert e.value.code == kvrail.StatusCode.INVALID_ARGUMENT
    blamed = re.match(r"layout\.(\w+): ", e.value.message)
    assert blamed and blamed.group(1) == expect, e.value.message


def test_layout_arithmetic_refuses_what_the_library_refuses():
    three_parts = PagedLayout(2, 3, 8, 16, 4, 64)
    with pytest.raises(ValueError, match=r"layout\.num_parts: "):
        three_parts.nbytes
    with pytest.raises(kvrail.InvalidLayoutError, match=r"layout\.block_stride: "):
        PagedLayout(2, 2, 8, 16, 4, 64, order=0, layer_stride=131072, part_stride=65536,
                    block_stride=8190, token_stride=512, head_stride=128).strides()
    with pytest.raises(kvrail.InvalidLayoutError, match=r"layout\.num_heads: -1 "):
        PagedLayout(2, 2, 8, 16, -1, 64).nbytes
    with pytest.raises(kvrail.InvalidLayoutError, match=r"region_bytes: "):
        PagedLayout(2, 2, 8, 16, 4, 64).check(region_bytes=0)


def test_bad_tensor_layouts_are_named():
    with pytest.raises(ValueError, match="head_dim must be contiguous"):
        layout_from_strides((2, 4, 8), (32, 8, 1), 2, "BDT", layouts.DTYPE_BF16)
    with pytest.raises(ValueError, match="shape: 3 dimensions"):
        layout_from_strides((2, 4, 8), (32, 8, 1), 2, "vllm_nhd", layouts.DTYPE_BF16)
    with pytest.raises(ValueError, match="itemsize"):
        layout_from_strides((2, 4, 8), (32, 8, 1), 4, "BTD", layouts.DTYPE_BF16)
    with pytest.raises(ValueError, match=r"strides\[0\]: 0"):
        layout_from_strides((2, 4, 8), (0, 8, 1), 2, "BTD", layouts.DTYPE_BF16)
    with pytest.raises(ValueError, match="no kvrail.v1.DType"):
        layouts.dtype_of("complex64")
    assert layouts.dtype_of("torch.bfloat16") == layouts.DTYPE_BF16


class FakeCudaTensor:
    """What register_tensor reads of a torch tensor, over a numpy array (no GPU, no torch)."""

    is_cuda = True

    def __init__(self, array: np.ndarray, dtype: str = "torch.bfloat16") -> None:
        self.array, self.dtype = array, dtype
        self.shape = array.shape

    def stride(self):
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def element_size(self) -> int:
        return self.array.itemsize

    def data_ptr(self) -> int:
        return self.array.ctypes.data


class RecordingClient:
    def __init__(self):
        self.calls = []

    def register_cuda(self, ptr, nbytes, spec, keepalive=None):
        self.calls.append((ptr, nbytes, spec, keepalive))
        return "region"

    def register_cuda_layers(self, ptrs, layer_bytes, spec, keepalive=None):
        self.calls.append((ptrs, layer_bytes, spec, keepalive))
        return "layered region"


def test_register_kv_cache_builds_the_spec_from_the_tensor():
    cache = FakeCudaTensor(np.zeros((3, 2, 7, 16, 4, 8), np.uint16))
    client = RecordingClient()
    assert tensors.register_kv_cache(client, cache, "vllm_nhd") == "region"
    ptr, nbytes, spec, keepalive = client.calls[0]
    assert ptr == cache.data_ptr() and nbytes == cache.array.nbytes and keepalive is cache
    assert spec.writable and spec.paged_kv.num_layers == 3 and spec.paged_kv.num_blocks == 7
    assert spec.paged_kv.dtype == layouts.DTYPE_BF16
    # One layer's tensor with a stacked preset: the layer axis is dropped.
    tensors.register_kv_cache(client, [FakeCudaTensor(np.zeros((2, 7, 16, 4, 8), np.uint16))])
    assert client.calls[1][2].paged_kv.num_layers == 1
    tensors.register_tensor(client, cache)
    assert client.calls[2][2].WhichOneof("layout") == "bytes"


def test_one_tensor_per_layer_becomes_one_per_layer_region():
    layers = [FakeCudaTensor(np.zeros((2, 7, 16, 4, 8), np.uint16)) for _ in range(3)]
    client = RecordingClient()
    assert tensors.register_kv_cache(client, layers, "vllm_nhd") == "layered region"
    ptrs, layer_bytes, spec, keepalive = client.calls[0]
    assert ptrs == [t.data_ptr() for t in layers] and keepalive == layers
    assert layer_bytes == layers[0].array.nbytes
    kv = spec.paged_kv
    assert kv.num_layers == 3 and kv.layer_stride == 0
    assert (kv.num_parts, kv.num_blocks, kv.tokens_per_block, kv.num_heads, kv.head_dim) == \
        (2, 7, 16, 4, 8)
    assert kv.token_stride == 4 * 8 * 2 and kv.block_stride == 16 * 4 * 8 * 2
    # Layers must be alike: the one that differs is named.
    odd = layers[:2] + [FakeCudaTensor(np.zeros((2, 9, 16, 4, 8), np.uint16))]
    with pytest.raises(ValueError, match=r"kv_cache\[2\]"):
        tensors.register_kv_cache(client, odd)


def test_not_a_cuda_tensor_is_refused():
    with pytest.raises(ValueError, match="not a CUDA tensor"):
        host = FakeCudaTensor(np.zeros(4, np.uint16))
        host.is_cuda = False
        tensors.register_tensor(RecordingClient(), host)


def test_register_cuda_without_a_gpu_fails_cleanly(client):
    # On CI (no GPU, no driver) the CUDA runtime's error comes back as a KvrailError; a host
    # address is never device memory either way.
    buffer = kvrail.HostBuffer(4096)
    with pytest.raises(kvrail.KvrailError):
        client.register_cuda(buffer.address, 4096)

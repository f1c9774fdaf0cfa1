"""GPU tensors as kvrail regions (torch or anything with torch's tensor methods), over the C
ABI's CUDA entry (kvrail_register_cuda: CUDA IPC of the tensor's cudaMalloc allocation). Usable
on a machine with a GPU; the layout arithmetic is in kvrail.layouts (pure, tested on CPU).

torch is never imported here: tensors are used through data_ptr(), shape, stride(),
element_size(), dtype and is_cuda / device.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

from kvrail.layouts import KV_LAYOUTS, PagedLayout, dtype_of, layout_from_strides
from kvrail.proto import region_pb2

PER_LAYER_MISSING = (
    "one tensor per layer needs a region made of several allocations (a per-layer-allocation "
    "region kind), which kvraild does not have yet; allocate the KV cache as one contiguous "
    "tensor with a leading layer axis (e.g. [layers, 2, blocks, block_size, heads, head_dim] for "
    "'vllm_nhd') and pass that tensor")


def tensor_layout(tensor, layout: str) -> PagedLayout:
    """The PagedLayout of `tensor` read as `layout` (a KV_LAYOUTS preset or axis letters), with
    its strides; the region starts at tensor.data_ptr()."""
    return layout_from_strides(tuple(tensor.shape), tuple(tensor.stride()),
                               int(tensor.element_size()), layout, dtype_of(str(tensor.dtype)))


def _span_bytes(tensor) -> int:
    """Bytes from data_ptr() to the end of the tensor's highest-addressed element."""
    size = int(tensor.element_size())
    if any(int(n) == 0 for n in tensor.shape):
        raise ValueError("tensor: empty")
    return size + sum((int(n) - 1) * int(s) * size for n, s in zip(tensor.shape, tensor.stride()))


def register_tensor(client, tensor, *, layout: Optional[str] = None, writable: bool = True,
                    name: str = ""):
    """Registers a CUDA tensor's memory as a region of `client`'s session. `layout`: None for a
    bytes region over the tensor's span, else a KV_LAYOUTS preset or axis letters for a paged KV
    region built from the tensor's shape and strides. The Region keeps the tensor alive."""
    if not getattr(tensor, "is_cuda", False):
        raise ValueError("tensor: not a CUDA tensor (register host memory as a kvrail.HostBuffer)")
    spec = region_pb2.RegionSpec(name=name, writable=writable)
    if layout is None:
        spec.bytes.SetInParent()
        nbytes = _span_bytes(tensor)
    else:
        paged = tensor_layout(tensor, layout)
        spec.paged_kv.CopyFrom(paged.to_proto())
        nbytes = paged.nbytes
    return client.register_cuda(int(tensor.data_ptr()), nbytes, spec, keepalive=tensor)


def register_kv_cache(client, kv_cache: Union[object, Sequence[object]], layout: str = "vllm_nhd",
                      *, writable: bool = True, name: str = "kv cache"):
    """Registers an inference engine's KV cache. `kv_cache`: one tensor holding every layer (its
    leading axis the layer, then the per-layer layout of `layout`), or a list with one tensor
    per layer - which raises NotImplementedError until kvraild has per-layer regions."""
    if isinstance(kv_cache, (list, tuple)):
        if len(kv_cache) != 1:
            raise NotImplementedError(PER_LAYER_MISSING)
        kv_cache = kv_cache[0]
    axes = KV_LAYOUTS.get(layout, layout)
    if "L" in axes and len(kv_cache.shape) == len(axes) - 1:
        axes = axes.replace("L", "")  # a single layer's tensor
    return register_tensor(client, kv_cache, layout=axes, writable=writable, name=name)

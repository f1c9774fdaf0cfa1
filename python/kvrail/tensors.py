"""GPU tensors as kvrail regions (torch or anything with torch's tensor methods), over the C
ABI's CUDA entry (kvrail_register_cuda: CUDA IPC of the tensor's cudaMalloc allocation). Usable
on a machine with a GPU; the layout arithmetic is in kvrail.layouts (pure, tested on CPU).

torch is never imported here: tensors are used through data_ptr(), shape, stride(),
element_size(), dtype and is_cuda / device.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Union

from kvrail.layouts import KV_LAYOUTS, PagedLayout, dtype_of, layout_from_strides
from kvrail.proto import region_pb2



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


def gpu_uuid(tensor) -> str:
    """The UUID ("GPU-...") of the GPU holding a torch CUDA tensor, for RegionSpec.device_uuid
    (names the GPU the same way in processes with different CUDA_VISIBLE_DEVICES)."""
    import torch  # the tensor is torch's: torch is loaded already
    props = torch.cuda.get_device_properties(tensor.device)
    text = str(props.uuid)
    return text if text.startswith("GPU-") else "GPU-" + text


def register_tensor(client, tensor, *, layout: Optional[str] = None, writable: bool = True,
                    name: str = "", by_uuid: bool = False):
    """Registers a CUDA tensor's memory as a region of `client`'s session. `layout`: None for a
    bytes region over the tensor's span, else a KV_LAYOUTS preset or axis letters for a paged KV
    region built from the tensor's shape and strides. The Region keeps the tensor alive.
    `by_uuid`: name the GPU by UUID (RegionSpec.device_uuid) rather than this process's
    ordinal, for a daemon that numbers GPUs differently (another CUDA_VISIBLE_DEVICES)."""
    if not getattr(tensor, "is_cuda", False):
        raise ValueError("tensor: not a CUDA tensor (register host memory as a kvrail.HostBuffer)")
    spec = region_pb2.RegionSpec(name=name, writable=writable)
    if by_uuid:
        spec.device_uuid = gpu_uuid(tensor)
    if layout is None:
        spec.bytes.SetInParent()
        nbytes = _span_bytes(tensor)
    else:
        paged = tensor_layout(tensor, layout)
        spec.paged_kv.CopyFrom(paged.to_proto())
        nbytes = paged.nbytes
    return client.register_cuda(int(tensor.data_ptr()), nbytes, spec, keepalive=tensor)


def register_kv_cache(client, kv_cache: Union[object, Sequence[object]], layout: str = "vllm_nhd",
                      *, writable: bool = True, name: str = "kv cache", by_uuid: bool = False):
    """Registers an inference engine's KV cache as one region. `kv_cache`: one tensor holding
    every layer (its leading axis the layer, then the per-layer layout of `layout`), or a list
    with one tensor per layer (vLLM's shape per layer: [2, blocks, block_size, heads,
    head_dim] for 'vllm_nhd'), all of one shape, strides and dtype on one GPU - a per-layer
    region (RegionSpec.layer_shares), so one transfer moves every layer of a request."""
    axes = KV_LAYOUTS.get(layout, layout)
    if isinstance(kv_cache, (list, tuple)):
        if len(kv_cache) == 1:
            kv_cache = kv_cache[0]
        else:
            return _register_layers(client, list(kv_cache), axes.replace("L", ""), writable, name,
                                    by_uuid)
    if "L" in axes and len(kv_cache.shape) == len(axes) - 1:
        axes = axes.replace("L", "")  # a single layer's tensor
    return register_tensor(client, kv_cache, layout=axes, writable=writable, name=name,
                           by_uuid=by_uuid)


def per_layer_layout(tensors: Sequence[object], axes: str) -> PagedLayout:
    """The layout of a per-layer region over `tensors` (one layer each, axes without L): their
    common per-layer layout with num_layers = len(tensors) and layer_stride 0. ValueError naming
    the tensor that differs from the first."""
    first = tensors[0]
    for i, t in enumerate(tensors):
        if not getattr(t, "is_cuda", False) and i == 0:
            raise ValueError("kv_cache[0]: not a CUDA tensor")
        if (tuple(t.shape) != tuple(first.shape) or tuple(t.stride()) != tuple(first.stride())
                or t.dtype != first.dtype
                or getattr(t, "device", None) != getattr(first, "device", None)):
            raise ValueError(f"kv_cache[{i}]: shape, strides, dtype or device differ from "
                             f"kv_cache[0]'s (one per-layer region needs them alike)")
    one = tensor_layout(first, axes)
    return dataclasses.replace(one, num_layers=len(tensors), layer_stride=0)


def _register_layers(client, tensors, axes: str, writable: bool, name: str, by_uuid: bool):
    layout = per_layer_layout(tensors, axes)
    spec = region_pb2.RegionSpec(name=name, writable=writable)
    spec.paged_kv.CopyFrom(layout.to_proto())
    if by_uuid:
        spec.device_uuid = gpu_uuid(tensors[0])
    layer_bytes = dataclasses.replace(layout, num_layers=1).nbytes
    return client.register_cuda_layers([int(t.data_ptr()) for t in tensors], layer_bytes, spec,
                                       keepalive=list(tensors))

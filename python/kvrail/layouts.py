"""Paged KV layouts: the arithmetic of kvrail.v1.PagedKvLayout in pure Python (no torch). Whether a
layout is valid is the library's verdict (PagedLayout.check: the validator kvraild's planner uses,
through the C ABI), never rules of this module's own.

Element (layer l, part p, block b, token t, head h, element d) of a layout lives at
  offset_bytes + l*layer_stride + p*part_stride + b*block_stride + t*token_stride
  + h*head_stride + d*dtype_size
(proto/kvrail/v1/region.proto). Strides are bytes; all zero means "dense, in `order`".

Tensor layouts are described by a string of axis letters, outermost first:
  L layer, P part (K/V; absent: 1 part, as MLA), B block, T token in block, H head (absent: 1),
  D head_dim (innermost, contiguous).
Presets (KV_LAYOUTS) name the common ones; a missing L means one tensor holds one layer.
"""
from __future__ import annotations

import ctypes
import dataclasses
from typing import Dict, Optional, Sequence, Tuple

from kvrail.errors import InvalidLayoutError, StatusCode

# kvrail.v1.DType numbers and sizes.
DTYPE_BF16, DTYPE_FP16, DTYPE_FP32 = 1, 2, 3
DTYPE_FP8_E4M3, DTYPE_FP8_E5M2, DTYPE_INT8, DTYPE_UINT8 = 4, 5, 6, 7
DTYPE_SIZE: Dict[int, int] = {1: 2, 2: 2, 3: 4, 4: 1, 5: 1, 6: 1, 7: 1}

# Element type names (numpy's and torch's, without "torch.") -> kvrail.v1.DType.
DTYPE_BY_NAME: Dict[str, int] = {
    "bfloat16": DTYPE_BF16, "float16": DTYPE_FP16, "half": DTYPE_FP16, "float32": DTYPE_FP32,
    "float": DTYPE_FP32, "float8_e4m3fn": DTYPE_FP8_E4M3, "float8_e5m2": DTYPE_FP8_E5M2,
    "int8": DTYPE_INT8, "uint8": DTYPE_UINT8,
}

# kvrail.v1.LayoutOrder numbers -> the axis letters of the dense layout, outermost first.
ORDER_LAYER_PART_BLOCK_NHD = 1
ORDER_LAYER_PART_BLOCK_HND = 2
ORDER_BLOCK_LAYER_PART_NHD = 3
ORDER_BLOCK_LAYER_PART_HND = 4
ORDER_LAYER_BLOCK_PART_NHD = 5
ORDER_AXES: Dict[int, str] = {
    ORDER_LAYER_PART_BLOCK_NHD: "LPBTHD",
    ORDER_LAYER_PART_BLOCK_HND: "LPBHTD",
    ORDER_BLOCK_LAYER_PART_NHD: "BLPTHD",
    ORDER_BLOCK_LAYER_PART_HND: "BLPHTD",
    ORDER_LAYER_BLOCK_PART_NHD: "LBPTHD",
}

# Tensor layouts of inference engines, as axis letters (see the module docstring).
KV_LAYOUTS: Dict[str, str] = {
    # vLLM FlashAttention: per layer [2, num_blocks, block_size, num_kv_heads, head_size];
    # stacked over layers in one tensor: [layers, 2, blocks, block_size, heads, head_size].
    "vllm_nhd": "LPBTHD",
    # FlashInfer NHD: per layer [num_blocks, 2, block_size, heads, head_dim].
    "flashinfer_nhd": "LBPTHD",
    # FlashInfer HND: per layer [num_blocks, 2, heads, block_size, head_dim].
    "flashinfer_hnd": "LBPHTD",
    # MLA (DeepSeek): per layer [num_blocks, block_size, kv_lora_rank + rope_dim]: one part, one
    # "head" holding the joint latent.
    "mla": "LBTD",
}

_AXES = "LPBTHD"
# PagedLayout fields that are uint32 in the C ABI's kvrail_paged_layout (the strides and
# offset_bytes are uint64, dtype and order int32).
_U32_FIELDS = ("num_layers", "num_parts", "num_blocks", "tokens_per_block", "num_heads",
               "head_dim")


@dataclasses.dataclass(frozen=True)
class PagedLayout:
    """A kvrail.v1.PagedKvLayout as a plain value. Strides in bytes (all 0: dense in `order`)."""

    num_layers: int
    num_parts: int
    num_blocks: int
    tokens_per_block: int
    num_heads: int
    head_dim: int
    dtype: int = DTYPE_BF16
    order: int = ORDER_LAYER_PART_BLOCK_NHD
    layer_stride: int = 0
    part_stride: int = 0
    block_stride: int = 0
    token_stride: int = 0
    head_stride: int = 0
    offset_bytes: int = 0

    def check(self, region_bytes: Optional[int] = None, per_layer: bool = False) -> int:
        """Checks the layout with the validator kvraild itself uses and returns the bytes it spans:
        offset_bytes + the end of its highest-addressed element (of one layer with `per_layer`, a
        per-layer region's layout). `region_bytes` (> 0), when given, is what it must fit (one
        layer's span with `per_layer`). InvalidLayoutError (INVALID_ARGUMENT, also a ValueError)
        names the field otherwise: "layout.part_stride: ..."."""
        from kvrail import _lib
        if region_bytes is not None and not 0 < int(region_bytes) < 2**64:
            raise InvalidLayoutError(StatusCode.INVALID_ARGUMENT,
                                     f"region_bytes: {region_bytes} is not in [1, 2^64)")
        out = ctypes.c_uint64()
        code = _lib.lib().kvrail_paged_layout_check(
            ctypes.byref(self._struct()), int(region_bytes or 0),
            _lib.LAYOUT_PER_LAYER if per_layer else 0, ctypes.byref(out))
        if code != 0:
            message = _lib.lib().kvrail_last_error_message()
            raise InvalidLayoutError(code, message.decode("utf-8", "replace") if message else "")
        return out.value

    def _struct(self):
        """The layout as the C ABI's kvrail_paged_layout (values must fit its field types)."""
        from kvrail import _lib
        values = dataclasses.asdict(self)
        for name, value in values.items():
            bits = 32 if name in _U32_FIELDS else 64
            low = -(2 ** 31) if name in ("dtype", "order") else 0
            high = 2 ** 31 if name in ("dtype", "order") else 2 ** bits
            if not isinstance(value, int) or not low <= value < high:
                raise InvalidLayoutError(StatusCode.INVALID_ARGUMENT,
                                         f"layout.{name}: {value!r} does not fit the C ABI's field")
        return _lib.PagedLayoutStruct(struct_size=ctypes.sizeof(_lib.PagedLayoutStruct), **values)

    @property
    def dtype_size(self) -> int:
        if self.dtype not in DTYPE_SIZE:
            self.check()  # the validator's error names layout.dtype (or an earlier field)
        return DTYPE_SIZE[self.dtype]

    def dims(self) -> Dict[str, int]:
        """Axis letter -> extent."""
        return {"L": self.num_layers, "P": self.num_parts, "B": self.num_blocks,
                "T": self.tokens_per_block, "H": self.num_heads, "D": self.head_dim}

    def strides(self) -> Dict[str, int]:
        """Axis letter -> byte stride of a valid layout (check()): the explicit ones, or dense
        from `order`."""
        self.check()
        size = self.dtype_size
        explicit = {"L": self.layer_stride, "P": self.part_stride, "B": self.block_stride,
                    "T": self.token_stride, "H": self.head_stride}
        if any(explicit.values()):
            return {**explicit, "D": size}
        dims, out, step = self.dims(), {}, size
        for axis in reversed(ORDER_AXES[self.order]):
            out[axis] = step
            step *= dims[axis]
        return out

    @property
    def nbytes(self) -> int:
        """Bytes a region needs: offset_bytes + the end of the highest-addressed element (check()).
        """
        return self.check()

    def element_offset(self, layer: int, part: int, block: int, token: int, head: int) -> int:
        """Byte offset of element (layer, part, block, token, head, 0)."""
        s = self.strides()
        return (self.offset_bytes + layer * s["L"] + part * s["P"] + block * s["B"]
                + token * s["T"] + head * s["H"])

    def shape6(self) -> Tuple[int, ...]:
        """(layers, parts, blocks, tokens_per_block, heads, head_dim)."""
        d = self.dims()
        return tuple(d[a] for a in _AXES)

    def strides6(self) -> Tuple[int, ...]:
        """Byte strides in shape6's axis order."""
        s = self.strides()
        return tuple(s[a] for a in _AXES)

    def to_proto(self):
        """The kvrail.v1.PagedKvLayout message."""
        from kvrail.proto import region_pb2
        return region_pb2.PagedKvLayout(**dataclasses.asdict(self))

    @classmethod
    def from_proto(cls, message) -> "PagedLayout":
        return cls(**{f.name: getattr(message, f.name) for f in dataclasses.fields(cls)})


def dtype_of(name: str) -> int:
    """kvrail.v1.DType of an element type name ("bfloat16", "torch.float16", numpy's "int8")."""
    key = str(name).split(".")[-1]
    if key not in DTYPE_BY_NAME:
        raise ValueError(f"dtype: {name} has no kvrail.v1.DType (known: "
                         f"{', '.join(sorted(DTYPE_BY_NAME))})")
    return DTYPE_BY_NAME[key]


def layout_from_strides(shape: Sequence[int], strides: Sequence[int], itemsize: int,
                        axes: str, dtype: int, *, offset_bytes: int = 0) -> PagedLayout:
    """The PagedLayout of a tensor (shape and strides in elements, as torch and numpy // itemsize
    give them) whose axes are named by `axes` (letters of LPBTHD, or a KV_LAYOUTS preset name).

    Axes that are absent have extent 1 (L: one layer per tensor; P: MLA's single part; H: one
    head). D must be innermost-contiguous (stride 1); no other stride may be 0 on an axis longer
    than 1 (broadcast views would make elements share bytes).
    """
    axes = KV_LAYOUTS.get(axes, axes)
    if len(set(axes)) != len(axes) or not set(axes) <= set(_AXES) or "D" not in axes \
            or "B" not in axes or "T" not in axes:
        raise ValueError(f"axes: {axes!r} must name B, T and D once each, from {_AXES}")
    if len(shape) != len(axes) or len(strides) != len(axes):
        raise ValueError(f"shape: {len(shape)} dimensions (strides: {len(strides)}) for axes "
                         f"{axes!r} ({len(axes)})")
    if DTYPE_SIZE.get(dtype) != itemsize:
        raise ValueError(f"itemsize: {itemsize} does not match dtype {dtype} "
                         f"({DTYPE_SIZE.get(dtype)} bytes)")
    dims = {a: 1 for a in _AXES}
    byte_strides = {a: 0 for a in _AXES}
    for i, axis in enumerate(axes):
        dims[axis] = int(shape[i])
        byte_strides[axis] = int(strides[i]) * itemsize
        if strides[i] < 0 or (strides[i] == 0 and shape[i] > 1):
            raise ValueError(f"strides[{i}]: {strides[i]} on axis {axis} of extent {shape[i]}")
    if byte_strides["D"] != itemsize and dims["D"] > 1:
        raise ValueError(f"strides[{axes.index('D')}]: head_dim must be contiguous (stride 1)")
    # An absent axis (or one of extent 1) has no stride of its own; any non-zero value keeps the
    # layout "explicit" and is never multiplied by more than 0.
    for axis in "LPBTH":
        if dims[axis] == 1 and byte_strides[axis] == 0:
            byte_strides[axis] = itemsize
    return PagedLayout(
        num_layers=dims["L"], num_parts=dims["P"], num_blocks=dims["B"],
        tokens_per_block=dims["T"], num_heads=dims["H"], head_dim=dims["D"], dtype=dtype,
        order=0, layer_stride=byte_strides["L"], part_stride=byte_strides["P"],
        block_stride=byte_strides["B"], token_stride=byte_strides["T"],
        head_stride=byte_strides["H"], offset_bytes=offset_bytes)


def dense_shape(axes: str, layers: int, parts: int, blocks: int, tokens_per_block: int,
                heads: int, head_dim: int) -> Tuple[int, ...]:
    """The shape of a tensor laid out as `axes` (letters or a preset) for the given extents."""
    axes = KV_LAYOUTS.get(axes, axes)
    dims = {"L": layers, "P": parts, "B": blocks, "T": tokens_per_block, "H": heads,
            "D": head_dim}
    return tuple(dims[a] for a in axes)

"""The paged KV move every system in the versus benchmark makes: a Llama-3-8B-like pool (32 layers,
K and V, 8 KV heads, head_dim 128, bf16), a request of scattered blocks, and the byte pieces it
becomes. Pure numpy; both worker processes derive the same request from the same parameters.

Piece kinds (the contiguous unit a descriptor names):
  4k    HND pool (16 tokens per block), the move takes ONE head of 8 (a TP-1 prefill feeding a
        TP-8 decode rank, whose pool holds that head only): 16 tokens x 128 x 2 B = 4 KiB.
  32k   NHD pool, 16 tokens per block, all heads: 16 x 8 x 128 x 2 B = 32 KiB.
  256k  NHD pool, 128 tokens per block, all heads: 256 KiB.
A request of n blocks moves every layer and both K and V of each block: 64 n pieces.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

import numpy as np

LAYERS, PARTS, HEADS, HEAD_DIM, DTYPE_BYTES = 32, 2, 8, 128, 2
# The head the 4k move takes (any of 8; not 0, so an offset error shows).
SPLIT_HEAD = 5
# Source pattern: uint64 word i of the source pool holds i * K + seed (mod 2**64).
PATTERN_K = np.uint64(0x9E3779B97F4A7C15)

PIECES: Dict[str, Tuple[int, str, bool]] = {
    # kind: (tokens per block, order of the pool, head split)
    "4k": (16, "HND", True),
    "32k": (16, "NHD", False),
    "256k": (128, "NHD", False),
}


@dataclasses.dataclass(frozen=True)
class Geometry:
    """One request: `blocks` scattered blocks of pools of `kind` pieces."""

    kind: str
    blocks: int
    seed: int = 1

    def __post_init__(self) -> None:
        if self.kind not in PIECES:
            raise ValueError(f"kind: {self.kind!r} is not one of {sorted(PIECES)}")
        if self.blocks <= 0:
            raise ValueError(f"blocks: {self.blocks} must be > 0")

    @property
    def tokens_per_block(self) -> int:
        return PIECES[self.kind][0]

    @property
    def order(self) -> str:
        return PIECES[self.kind][1]

    @property
    def head_split(self) -> bool:
        return PIECES[self.kind][2]

    @property
    def dst_heads(self) -> int:
        return 1 if self.head_split else HEADS

    @property
    def piece_bytes(self) -> int:
        return self.tokens_per_block * self.dst_heads * HEAD_DIM * DTYPE_BYTES

    @property
    def pool_blocks(self) -> int:
        """Blocks per pool: the request's blocks plus a quarter more, so ids are scattered."""
        return self.blocks + max(1, self.blocks // 4)

    @property
    def pieces(self) -> int:
        return LAYERS * PARTS * self.blocks

    @property
    def request_bytes(self) -> int:
        return self.pieces * self.piece_bytes

    def block_bytes(self, heads: int) -> int:
        return self.tokens_per_block * heads * HEAD_DIM * DTYPE_BYTES

    def pool_bytes(self, side: str) -> int:
        heads = HEADS if side == "src" else self.dst_heads
        return LAYERS * PARTS * self.pool_blocks * self.block_bytes(heads)

    def block_ids(self) -> Tuple[np.ndarray, np.ndarray]:
        """(src ids, dst ids): `blocks` distinct ids of each pool in random order."""
        rng = np.random.RandomState(self.seed)
        src = rng.permutation(self.pool_blocks)[: self.blocks].astype(np.uint32)
        dst = rng.permutation(self.pool_blocks)[: self.blocks].astype(np.uint32)
        return src, dst

    def offsets(self) -> Tuple[np.ndarray, np.ndarray]:
        """Byte offsets (src, dst) of every piece, ordered (layer, part, block), as int64."""
        src_ids, dst_ids = self.block_ids()
        # Dense layer-part-block pools: offset = ((l * P + p) * pool_blocks + b) * block_bytes
        # (+ the head's offset inside an HND block on the source side of a head split).
        lp = np.arange(LAYERS * PARTS, dtype=np.int64)[:, None] * self.pool_blocks
        src_block, dst_block = self.block_bytes(HEADS), self.block_bytes(self.dst_heads)
        src = (lp + src_ids.astype(np.int64)[None, :]) * src_block
        dst = (lp + dst_ids.astype(np.int64)[None, :]) * dst_block
        if self.head_split:
            src = src + SPLIT_HEAD * self.piece_bytes  # HND: heads are contiguous [T, D] runs
        return src.reshape(-1), dst.reshape(-1)

    def descriptors(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(src offsets, dst offsets, lengths) with adjacent pieces merged where both sides are
        contiguous: one descriptor per contiguous block run, as the peers' connectors build."""
        src, dst = self.offsets()
        n = self.piece_bytes
        if len(src) == 0:
            return src, dst, src
        joins = (src[1:] == src[:-1] + n) & (dst[1:] == dst[:-1] + n)
        starts = np.flatnonzero(np.concatenate(([True], ~joins)))
        lengths = np.diff(np.concatenate((starts, [len(src)]))) * n
        return src[starts], dst[starts], lengths.astype(np.int64)


def fill_source(words: np.ndarray, seed: int) -> None:
    """Writes the pattern into a uint64 view of the whole source pool (touching every page)."""
    step = 1 << 22
    for begin in range(0, len(words), step):
        end = min(begin + step, len(words))
        chunk = np.arange(begin, end, dtype=np.uint64)
        chunk *= PATTERN_K
        chunk += np.uint64(seed)
        words[begin:end] = chunk


def verify(dst_words: np.ndarray, geometry: Geometry, seed: int) -> str:
    """'' when every destination piece holds its source piece byte for byte, else where not."""
    src, dst = geometry.offsets()
    per = geometry.piece_bytes // 8
    lane = np.arange(per, dtype=np.int64)
    step = max(1, (1 << 22) // per)  # pieces per check: ~32 MiB of words at a time
    for begin in range(0, len(src), step):
        s = src[begin:begin + step, None] // 8 + lane
        d = dst[begin:begin + step, None] // 8 + lane
        want = s.astype(np.uint64) * PATTERN_K + np.uint64(seed)
        got = dst_words[d]
        bad = np.flatnonzero((got != want).any(axis=1))
        if len(bad):
            i = begin + int(bad[0])
            layer, rest = divmod(i, PARTS * geometry.blocks)
            part, block = divmod(rest, geometry.blocks)
            return (f"{len(bad)}+ pieces differ; first: piece {i} (layer {layer} part {part} "
                    f"request block {block}, src offset {int(src[i])}, dst offset {int(dst[i])})")
    return ""

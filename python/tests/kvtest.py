"""Helpers for the tests: pools of paged KV in numpy-viewed host buffers, and the expected
contents of a transfer computed from logical (layer, part, token, head) indices, so the check
does not depend on the physical layout of either side."""
from __future__ import annotations

import numpy as np

import kvrail
from kvrail.layouts import PagedLayout


class Pool:
    """A host buffer with a paged layout, registered with `client`, poisoned (0xAB bytes)."""

    def __init__(self, client, layout: PagedLayout, writable: bool, name: str = "pool") -> None:
        self.layout = layout
        self.buffer = kvrail.HostBuffer(layout.nbytes, name)
        self.buffer.ndarray()[:] = 0xAB
        self.region = client.register_host_buffer(self.buffer, layout=layout, writable=writable,
                                                  name=name)
        self.view = self.buffer.paged_view(layout)  # [L, P, B, T, H, D]

    @property
    def id(self) -> int:
        return self.region.id

    def fill_random(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.view[...] = rng.integers(0, 1 << 16, size=self.view.shape, dtype=np.uint16)

    def tokens(self, blocks, count: int) -> np.ndarray:
        """[L, P, count, H, D]: token i from blocks[i // tpb], slot i % tpb."""
        tpb = self.layout.tokens_per_block
        picked = [self.view[:, :, blocks[i // tpb], i % tpb] for i in range(count)]
        return np.stack(picked, axis=2)


def layout(order: int = 1, blocks: int = 16, tpb: int = 4, layers: int = 3, heads: int = 4,
           head_dim: int = 8, parts: int = 2) -> PagedLayout:
    return PagedLayout(num_layers=layers, num_parts=parts, num_blocks=blocks,
                       tokens_per_block=tpb, num_heads=heads, head_dim=head_dim,
                       dtype=kvrail.layouts.DTYPE_BF16, order=order)

"""Host memory shared with kvraild: a HostBuffer is a memfd this process and kvraild both map, the
memory a host region is registered over.

Thread contract: a HostBuffer is a thin handle, safe to share; the caller orders its own reads and
writes of the memory against transfers.
"""
from __future__ import annotations

import ctypes
import weakref
from typing import Optional, Sequence

from kvrail._lib import check, lib
from kvrail.layouts import PagedLayout


def _free_buffer(handle: int) -> None:
    lib().kvrail_host_buffer_free(handle)


class HostBuffer:
    """Host memory shared with kvraild (a memfd mapped MAP_SHARED, zero-filled).

    `ndarray()` / `memoryview()` are zero-copy views of the memory. close() (or leaving the `with`
    block) releases the buffer as soon as no view of it is left: memory still viewed by a numpy
    array stays mapped until that array is gone, so a view can never dangle. Regions registered
    over the buffer stay valid in the daemon (it has its own mapping) until unregistered.
    """

    def __init__(self, nbytes: int, name: str = "kvrail") -> None:
        handle = ctypes.c_void_p()
        check(lib().kvrail_host_buffer_create(int(nbytes), name.encode(), ctypes.byref(handle)))
        self._handle: int = handle.value
        address = lib().kvrail_host_buffer_data(self._handle)
        self._nbytes: int = lib().kvrail_host_buffer_size(self._handle)
        # The one Python object owning the mapping: every view references it, and the C buffer is
        # freed when it is collected (after close() and the last view).
        mem = (ctypes.c_uint8 * self._nbytes).from_address(address)
        weakref.finalize(mem, _free_buffer, self._handle)
        self._mem: Optional[ctypes.Array] = mem

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def handle(self) -> int:
        """The C handle (kvrail_host_buffer*), for the ABI calls."""
        if self._mem is None:
            raise ValueError("host buffer is closed")
        return self._handle

    @property
    def address(self) -> int:
        """The address of the first byte in this process."""
        return ctypes.addressof(self._live())

    @property
    def closed(self) -> bool:
        return self._mem is None

    def _live(self) -> ctypes.Array:
        if self._mem is None:
            raise ValueError("host buffer is closed")
        return self._mem

    def memoryview(self) -> memoryview:
        """A writable byte view of the whole buffer."""
        return memoryview(self._live()).cast("B")

    def ndarray(self, dtype="uint8", shape: Optional[Sequence[int]] = None,
                strides: Optional[Sequence[int]] = None, offset: int = 0):
        """A zero-copy numpy array over the buffer (numpy semantics for shape/strides in bytes);
        by default all of it as uint8."""
        import numpy as np
        dtype = np.dtype(dtype)
        if shape is None:
            shape = ((self._nbytes - offset) // dtype.itemsize,)
        return np.ndarray(shape, dtype=dtype, buffer=self._live(), offset=offset,
                          strides=strides)

    def paged_view(self, layout: PagedLayout, dtype=None):
        """The buffer as a 6-d array [layer, part, block, token, head, head_dim] of `layout` (an
        element type of the dtype's size: uint16 for bf16, uint8 for fp8)."""
        import numpy as np
        if dtype is None:
            dtype = {1: np.uint8, 2: np.uint16, 4: np.float32}[layout.dtype_size]
        if np.dtype(dtype).itemsize != layout.dtype_size:
            raise ValueError(f"dtype: {np.dtype(dtype)} is not {layout.dtype_size} bytes")
        if layout.nbytes > self._nbytes:
            raise ValueError(f"layout: needs {layout.nbytes} bytes, the buffer has {self._nbytes}")
        return self.ndarray(dtype, layout.shape6(), layout.strides6(), layout.offset_bytes)

    def close(self) -> None:
        """Releases the buffer once no view of it remains. Idempotent."""
        self._mem = None

    def __enter__(self) -> "HostBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HostBuffer({self._nbytes} bytes{', closed' if self.closed else ''})"


__all__ = ["HostBuffer"]

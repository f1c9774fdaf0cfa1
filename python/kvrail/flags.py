"""Layer readiness flags: 32-bit epoch words in a registered host buffer that say "layer i is
written" (TransferSpec.ready_flags, set by the producer) or "layer i has landed"
(TransferSpec.arrival_flags, set by the daemon). Words are never reset: a word is set once it has
reached the transfer's `value` (wrapping 32-bit order), so one array serves transfer after
transfer with increasing values.

`FlagArray` is the host view (CPU signal and wait, the spec's FlagArray message);
`FlagArray.for_gpu(device)` maps it for a GPU so a CUDA stream signals a layer after the kernel that
wrote it and a consumer stream waits for a layer to land, with no CPU round trip per layer
(kvrail_cuda_flags_*: cuStreamWriteValue32 / cuStreamWaitValue32 GEQ).
"""
from __future__ import annotations

import ctypes
import time
from typing import Optional

from kvrail import _lib
from kvrail.proto import transfer_pb2


def _stream_handle(stream) -> Optional[int]:
    """A cudaStream_t from a torch.cuda.Stream (its .cuda_stream), an int, or None (the legacy
    default stream)."""
    if stream is None:
        return None
    handle = getattr(stream, "cuda_stream", stream)
    if not isinstance(handle, int):
        raise ValueError("stream: a torch.cuda.Stream, a cudaStream_t as int, or None")
    return handle or None


class FlagArray:
    """`count` flag words at byte `offset` of `region`'s host buffer `buffer` (a kvrail.HostBuffer
    registered as `region`, writable when the daemon writes arrival flags into it). Not
    thread-safe for signal/wait from several threads on one word; the words themselves are
    plain shared memory."""

    def __init__(self, buffer, region, offset: int = 0, count: int = 1) -> None:
        if offset % 4 != 0 or offset < 0:
            raise ValueError("offset: must be a non-negative multiple of 4")
        if count <= 0 or offset + 4 * count > buffer.nbytes:
            raise ValueError(f"count: {count} words at offset {offset} do not fit the buffer's "
                             f"{buffer.nbytes} bytes")
        self._buffer = buffer
        self._region = region
        self.offset = offset
        self.count = count
        self._words = buffer.ndarray("uint32")[offset // 4: offset // 4 + count]

    def spec(self, value: int, grant: str = "") -> "transfer_pb2.FlagArray":
        """The FlagArray message naming these words and epoch `value` (ready_flags /
        arrival_flags of a TransferSpec). `grant`: the words' owner's grant when the submitter
        is another client (READ for ready flags, WRITE for arrival flags)."""
        if not 0 < value < 2 ** 32:
            raise ValueError("value: must be in [1, 2^32)")
        return transfer_pb2.FlagArray(region_id=int(getattr(self._region, "id", self._region)),
                                      byte_offset=self.offset, value=value, grant=grant)

    def _index(self, index: int) -> int:
        if not 0 <= index < self.count:
            raise IndexError(f"index: {index} not in [0, {self.count})")
        return index

    def signal(self, index: int, value: int) -> None:
        """Sets word `index` to `value` from the CPU (a producer whose layer is written)."""
        self._words[self._index(index)] = value

    def is_set(self, index: int, value: int) -> bool:
        """Whether word `index` has reached `value` (wrapping 32-bit order)."""
        return ((int(self._words[self._index(index)]) - value) & 0xFFFFFFFF) < 0x80000000

    def wait(self, index: int, value: int, timeout: Optional[float] = None) -> bool:
        """Polls until word `index` has reached `value`; False if `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set(index, value):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(20e-6)
        return True

    def for_gpu(self, device: int) -> "GpuFlags":
        """These words mapped for CUDA device `device` (the buffer must outlive the mapping)."""
        return GpuFlags(self, device)


class GpuFlags:
    """A FlagArray mapped for one GPU. Signals and waits are enqueued on a CUDA stream and happen
    in stream order. close() (or leaving its `with`) unmaps it."""

    def __init__(self, flags: FlagArray, device: int) -> None:
        self._flags = flags  # keeps the buffer alive while mapped
        handle = ctypes.c_void_p()
        address = flags._buffer.address + flags.offset
        _lib.check(_lib.lib().kvrail_cuda_flags_map(ctypes.c_void_p(address), flags.count,
                                                    int(device), ctypes.byref(handle)))
        self._handle: Optional[int] = handle.value

    def _live(self) -> int:
        if self._handle is None:
            raise ValueError("flags: closed")
        return self._handle

    def signal(self, index: int, value: int, stream=None) -> None:
        """Enqueues "word[index] = value" on `stream` (after all earlier work of the stream)."""
        _lib.check(_lib.lib().kvrail_cuda_flags_signal(self._live(), _stream_handle(stream),
                                                       index, value))

    def wait(self, index: int, value: int, stream=None) -> None:
        """Enqueues on `stream` a wait until word[index] >= value; later work waits for it."""
        _lib.check(_lib.lib().kvrail_cuda_flags_wait(self._live(), _stream_handle(stream),
                                                     index, value))

    def close(self) -> None:
        if self._handle is not None:
            _lib.lib().kvrail_cuda_flags_free(self._handle)
            self._handle = None

    def __enter__(self) -> "GpuFlags":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

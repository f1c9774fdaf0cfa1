"""The kvrail client for Python: a connection to the node's kvraild, shared host buffers, regions
and transfers, over libkvrail.so (the C ABI of client/c_api/kvrail.h).

Thread contract: a Client may be used from any thread, concurrently (the C library is
thread-safe and ctypes releases the GIL around each call, so a blocking wait does not hold up
other Python threads). HostBuffer, Region and Transfer objects are thin handles: safe to share,
with the caller ordering its own reads and writes of buffer memory against transfers.
"""
from __future__ import annotations

import array
import asyncio
import ctypes
import os
import stat
import time
import weakref
import dataclasses
from typing import (TYPE_CHECKING, Callable, Dict, Iterable, Iterator, List, Optional, Sequence,
                    Tuple, Union)

from kvrail._lib import SESSION_LOST_FN, check, lib, out_bytes, take_bytes
from kvrail.errors import (InvalidArgumentError, KvrailError, SessionLostError, StatusCode,
                           TransferFailedError, error_for)
from kvrail.layouts import PagedLayout
from kvrail.proto import admin_pb2, region_pb2, transfer_pb2

TransferState = transfer_pb2.TransferState
_FINAL = (transfer_pb2.TRANSFER_STATE_SUCCEEDED, transfer_pb2.TRANSFER_STATE_FAILED,
          transfer_pb2.TRANSFER_STATE_CANCELLED)


def is_final(state: int) -> bool:
    """Whether a TransferState is final (SUCCEEDED, FAILED or CANCELLED)."""
    return state in _FINAL


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


class Region:
    """A registered region. Lives as long as its client's session, or until unregister()
    (what leaving a `with` block does)."""

    def __init__(self, client: "Client", info, keepalive=None, redo=None) -> None:
        self._client = client
        self.info = info  # kvrail.v1.RegionInfo
        self._keepalive = keepalive  # e.g. the tensor whose memory the region is
        self._unregistered = False
        # Registers the same memory again and returns the new RegionInfo (Client.recover).
        self._redo: Optional[Callable[[], object]] = redo

    @property
    def id(self) -> int:
        return self.info.region_id

    def grant(self, write: bool = False, ttl: float = 600.0,
              layers: Optional[Tuple[int, int]] = None) -> str:
        """A grant token letting another client read this region (a transfer's source) or, with
        `write`, write it (a destination). Hand the token to that client out of band; it passes
        it as `src_grant=` / `dst_grant=` to Client.transfer (TransferEndpoint.grant). Valid for
        `ttl` seconds; `layers` (begin, end) limits it to those layers."""
        if not 0 <= ttl <= 86400:
            raise ValueError(f"ttl: {ttl} is outside [0, 86400] seconds")
        begin, end = layers if layers is not None else (0, 0)
        granted = self._client._message_call(
            lib().kvrail_create_grant, transfer_pb2.Grant, self.id, 2 if write else 1,
            int(ttl * 1000), int(begin), int(end))
        return granted.token

    def export(self, peer_node: str):
        """Lets the kvraild of node `peer_node` (in this daemon's peer directory) write into this
        region, which this client must own: what a decode worker does before a prefill node
        pushes into its pool (TransferSpec dst.node_id = this node). Returns the
        kvrail.v1.RegionLease (region id, owner and holder nodes, size, layout)."""
        return self._client.export_region(self, peer_node)

    def unregister(self) -> None:
        """Releases the region. Idempotent; a no-op once the client is closed (the daemon released
        the session's regions then)."""
        if self._unregistered or self._client.closed:
            self._unregistered = True
            return
        self._unregistered = True
        self._client.unregister_region(self.id)
        self._keepalive = None

    def __enter__(self) -> "Region":
        return self

    def __exit__(self, *exc) -> None:
        self.unregister()

    def __repr__(self) -> str:
        return f"Region(id={self.id}, name={self.info.spec.name!r})"


class Transfer:
    """A submitted transfer.

    wait(timeout) returns its status (final, or the current one on timeout); result() and
    `await transfer` return the final status and raise TransferFailedError when it FAILED or was
    CANCELLED. A transfer submitted over the session socket ends in the session's completion
    queue (shared memory kvraild writes): done(), poll() and wait_end() read it without a call,
    and `await` sleeps on the queue's eventfd registered with the event loop (no thread, no
    polling) and returns the end the queue holds without a call (transfer_id, state,
    error_code, bytes and finish time; wait(), result() and `status` have the whole status).
    Otherwise `await` waits in short slices on the default executor.
    """

    _AWAIT_SLICE_MS = 200

    def __init__(self, client: "Client", transfer_id: int, response=None) -> None:
        self._client = client
        self.id: int = transfer_id
        # kvrail.v1.SubmitTransferResponse, parsed from its bytes on first use (the hot path
        # submits and waits without reading it).
        self._response = response
        self._final = None  # the final TransferStatus once seen
        self._end = None  # the completion queue's short final status (wait_end, await)

    @property
    def response(self):
        if isinstance(self._response, bytes):
            self._response = transfer_pb2.SubmitTransferResponse.FromString(self._response)
        return self._response

    def _note(self, status):
        if is_final(status.state):
            self._final = status
        return status

    @property
    def status(self):
        """The current kvrail.v1.TransferStatus (read from the daemon until it is final)."""
        return self._final if self._final is not None else self._note(self._client.get(self.id))

    @property
    def state(self) -> int:
        return self.status.state

    def done(self) -> bool:
        """Whether the transfer has ended (any final state); no call when the completion queue
        can tell."""
        if self._final is not None or self._end is not None:
            return True
        return is_final(self._client.poll([self.id])[0])

    def wait(self, timeout: Optional[float] = None):
        """Waits up to `timeout` seconds (None: until it ends); returns the status."""
        if self._final is not None:
            return self._final
        return self._note(self._client.wait(self.id, timeout))

    def wait_end(self, timeout: Optional[float] = None):
        """Waits as wait() does; an end the completion queue holds comes from it without a call,
        as a short status (transfer_id, state, error_code, bytes, finish time)."""
        if self._final is not None:
            return self._final
        if self._end is not None:
            return self._end
        status = self._client.wait_end(self.id, timeout)
        if is_final(status.state):
            self._end = status
        return status

    def result(self, timeout: Optional[float] = None):
        """The final status; TimeoutError when it has not ended in `timeout` seconds,
        TransferFailedError when it ended FAILED or CANCELLED."""
        status = self.wait(timeout)
        return self._outcome(status)

    def _outcome(self, status):
        if not is_final(status.state):
            raise TimeoutError(f"transfer {self.id} is still "
                               f"{TransferState.Name(status.state)}")
        if status.state != transfer_pb2.TRANSFER_STATE_SUCCEEDED:
            code = status.error_code or (StatusCode.CANCELLED if status.state ==
                                         transfer_pb2.TRANSFER_STATE_CANCELLED
                                         else StatusCode.UNKNOWN)
            raise TransferFailedError(code, status.error_message or
                                      TransferState.Name(status.state), status)
        return status

    def cancel(self):
        """Cancels it (an ended transfer keeps its status); returns the status."""
        return self._note(self._client.cancel(self.id))

    def mark_ready(self, layer_begin: int, layer_count: int = 1) -> None:
        """Layers [layer_begin, layer_begin + layer_count) of a layer-wise transfer are written."""
        self._client.mark_ready(self.id, layer_begin, layer_count)

    async def wait_async(self):
        """The final status, awaited without blocking the event loop (no raise on failure):
        the completion queue's short status when it holds the end, else the daemon's."""
        loop = asyncio.get_running_loop()
        if self._final is None and self._end is None:
            waiter = self._client._completion_waiter(loop)
            if waiter is not None and self._client._follows(self.id):
                await waiter.ended(self.id)
                # From the queue (no call); one it missed or with more to say is read from the
                # daemon, and one still running then is waited for below.
                self.wait_end(0)
        while self._final is None and self._end is None:
            await loop.run_in_executor(None, self.wait, self._AWAIT_SLICE_MS / 1000.0)
        return self._final if self._final is not None else self._end

    def __await__(self):
        return self._await_result().__await__()

    async def _await_result(self):
        return self._outcome(await self.wait_async())

    def __repr__(self) -> str:
        return f"Transfer(id={self.id})"


TransferLike = Union[Transfer, int]


class _CompletionWaiter:
    """Awaits transfer ends for one client on one event loop: the completion queue's eventfd is
    the loop's reader while anything is awaited (the daemon rings it for every completion), and
    each wake-up takes the ids of the transfers that ended since the last one (no call) and
    resolves their awaits. A transfer the queue missed (it was full) comes back the same way and
    its await reads it from the daemon; a re-check every second is the safety net."""

    _RECHECK_S = 1.0
    _BATCH = 4096

    def __init__(self, client: "Client", loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self._client = client
        self._loop = loop
        self._fd = fd
        self._futures: Dict[int, List[asyncio.Future]] = {}
        self._recheck: Optional[asyncio.TimerHandle] = None
        self._ids = (ctypes.c_uint64 * self._BATCH)()
        self._count = ctypes.c_size_t(0)

    async def ended(self, transfer_id: int) -> None:
        future = self._loop.create_future()
        if not self._futures:
            # Armed before the look below, so no end falls between them.
            check(lib().kvrail_arm_completions(self._client._h, 1))
            self._loop.add_reader(self._fd, self._on_ready)
            self._recheck = self._loop.call_later(self._RECHECK_S, self._on_recheck)
        self._futures.setdefault(transfer_id, []).append(future)
        # It may have ended already (read from the queue: no call).
        if is_final(self._client.poll([transfer_id], raise_on_error=False)[0]):
            future.set_result(None)
        try:
            await future
        finally:
            waiting = self._futures.get(transfer_id)
            if waiting is not None and future in waiting:
                waiting.remove(future)
                if not waiting:
                    del self._futures[transfer_id]
            self._stop_if_idle()

    def _stop_if_idle(self) -> None:
        if self._futures:
            return
        self._loop.remove_reader(self._fd)
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        if not self._client.closed:
            lib().kvrail_arm_completions(self._client._h, 0)

    def _resolve(self, transfer_id: int) -> None:
        for future in self._futures.get(transfer_id, ()):
            if not future.done():
                future.set_result(None)

    def _on_ready(self) -> None:
        if self._client.closed:
            return
        while True:
            check(lib().kvrail_take_completions(self._client._h, self._ids, self._BATCH,
                                                ctypes.byref(self._count)))
            n = self._count.value
            for transfer_id in self._ids[:n]:
                self._resolve(transfer_id)
            if n < self._BATCH:
                return

    def _on_recheck(self) -> None:
        self._recheck = None
        if self._client.closed or not self._futures:
            return
        self._on_ready()
        ids = list(self._futures)
        states = self._client.poll(ids, raise_on_error=False)
        for transfer_id, state in zip(ids, states):
            # 0: the daemon could not say (e.g. not found): the transfer's own wait tells why.
            if is_final(state) or state == 0:
                self._resolve(transfer_id)
        self._recheck = self._loop.call_later(self._RECHECK_S, self._on_recheck)


class Client:
    """A connection to one kvraild (see connect()). Regions registered through it are released by
    the daemon when it is closed (or the process ends). A context manager: `with connect() as c:`.
    """

    def __init__(self, target: Optional[str] = None, probe_timeout: float = 3.0) -> None:
        handle = ctypes.c_void_p()
        check(lib().kvrail_connect(target.encode() if target else None,
                                   int(probe_timeout * 1000), ctypes.byref(handle)))
        self._handle: Optional[int] = handle.value
        self.target = target
        # Live Region objects of this client, registered again by recover().
        self._regions: "weakref.WeakSet[Region]" = weakref.WeakSet()
        self._lost_callback = None  # the ctypes trampoline, alive while the library may call it

    # --- lifetime ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Closes the connection; the daemon releases this client's regions. Idempotent."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            if self._lost_callback is not None:
                lib().kvrail_on_session_lost(handle, None, None)
            lib().kvrail_close(handle)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the process's end releases the session anyway
            pass

    @property
    def _h(self) -> Optional[int]:
        # A closed client passes NULL: the library answers INVALID_ARGUMENT "client: NULL".
        return self._handle

    @property
    def session_id(self) -> int:
        out = ctypes.c_uint64()
        check(lib().kvrail_session_id(self._h, ctypes.byref(out)))
        return out.value

    # --- session lost -----------------------------------------------------------------------
    @property
    def session_lost(self) -> bool:
        """Whether kvraild stopped or restarted under this client (its regions are gone). Calls
        that need the session then raise SessionLostError until recover() or reset_session()."""
        out = ctypes.c_int()
        check(lib().kvrail_session_lost(self._h, ctypes.byref(out)))
        return bool(out.value)

    def on_session_lost(self, callback: Optional[Callable[[SessionLostError], None]]) -> None:
        """Calls `callback(error)` once when the session is found lost - often on a library
        thread, as soon as the daemon closes the session socket. Keep it short (set a flag, wake
        a task); call recover() from your own thread. None removes it. Exceptions raised by the
        callback are printed and dropped."""
        if callback is None:
            check(lib().kvrail_on_session_lost(self._h, None, None))
            self._lost_callback = None
            return

        def trampoline(_user, code, message):
            try:
                callback(error_for(code, message.decode("utf-8", "replace") if message else ""))
            except Exception:  # never unwind into C
                import traceback
                traceback.print_exc()

        fn = SESSION_LOST_FN(trampoline)
        check(lib().kvrail_on_session_lost(self._h, ctypes.cast(fn, ctypes.c_void_p), None))
        self._lost_callback = fn

    def reset_session(self) -> None:
        """Forgets a lost session; the next call opens a new one. Regions are not registered
        again (recover() does that)."""
        check(lib().kvrail_reset_session(self._h))

    def recover(self) -> Dict[int, int]:
        """After the session was lost: opens a new session and registers every live Region of
        this client again (same memory, same spec), updating each Region's id in place. Returns
        {old region id: new region id}. Regions that were unregistered stay so; a region whose
        memory is gone (a closed HostBuffer) raises."""
        self.reset_session()
        moved: Dict[int, int] = {}
        for region in list(self._regions):
            if region._unregistered or region._redo is None:
                continue
            old = region.id
            region.info = region._redo()
            moved[old] = region.id
        return moved

    def _track(self, region: Region) -> Region:
        self._regions.add(region)
        return region

    # --- notifications ----------------------------------------------------------------------
    def poll_notifications(self, max_notifications: int = 0,
                           timeout: float = 0.0) -> list:
        """Notifications (kvrail.v1.Notification) queued for this client's session, oldest first:
        those of transfers that other clients submitted on this client's regions, with the
        submitter's TransferSpec.notification bytes. Waits up to `timeout` seconds (at most 60;
        0: not at all) for the first one; returns [] when none came."""
        if not 0 <= timeout <= 60:
            raise ValueError(f"timeout: {timeout} is outside [0, 60] seconds")
        timeout_ms = int(timeout * 1000)
        if timeout > 0 and timeout_ms == 0:
            timeout_ms = 1
        return list(self._message_call(lib().kvrail_poll_notifications,
                                       transfer_pb2.NotificationPollResponse,
                                       int(max_notifications), timeout_ms).notifications)

    def notifications(self, idle_timeout: Optional[float] = None) -> Iterator:
        """Yields notifications as they arrive; ends after `idle_timeout` seconds without one
        (None: never ends on its own)."""
        slice_s = 1.0 if idle_timeout is None else min(1.0, idle_timeout)
        idle_since = time.monotonic()
        while True:
            taken = self.poll_notifications(timeout=slice_s)
            for n in taken:
                yield n
            if taken:
                idle_since = time.monotonic()
            elif idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout:
                return

    # --- regions ----------------------------------------------------------------------------
    def create_host_buffer(self, nbytes: int, name: str = "kvrail") -> HostBuffer:
        return HostBuffer(nbytes, name)

    def register_host_buffer(self, buffer: HostBuffer, spec=None, *,
                             layout: Union[PagedLayout, "region_pb2.PagedKvLayout", None] = None,
                             writable: bool = False, name: str = "") -> Region:
        """Registers `buffer` as a region of this client's session. Either a full
        kvrail.v1.RegionSpec (`spec`), or `layout` (paged KV; default: a bytes region), `writable`
        and `name`."""
        if spec is None:
            spec = region_pb2.RegionSpec(name=name, writable=writable)
            if layout is not None:
                spec.paged_kv.CopyFrom(layout.to_proto() if isinstance(layout, PagedLayout)
                                       else layout)
        data = spec.SerializeToString()

        def register():
            region_id = ctypes.c_uint64()
            info, info_len = out_bytes()
            check(lib().kvrail_register_host_buffer(self._h, buffer.handle, data, len(data),
                                                    ctypes.byref(region_id), ctypes.byref(info),
                                                    ctypes.byref(info_len)))
            return region_pb2.RegionInfo.FromString(take_bytes(info, info_len.value))

        return self._track(Region(self, register(), redo=register))

    def register_host_fd(self, fd: int, offset: int, nbytes: int, *,
                         layout: Union[PagedLayout, "region_pb2.PagedKvLayout", None] = None,
                         writable: bool = False, name: Optional[str] = None) -> Region:
        """Registers [offset, offset + nbytes) of `fd` - a memfd or a /dev/shm object the engine
        made and maps itself - as a region of this client's session, without a copy: kvraild maps
        the same pages, so what the engine writes after this call is what a transfer reads, and
        what a transfer writes shows in the engine's own mapping. `layout` (paged KV; default: a
        bytes region) describes those bytes; `writable` lets transfers write them (the fd must
        then be open read-write). The fd stays the caller's: the Region keeps a duplicate (for
        recover()) and the caller may close its own at once. Errors name `fd`, `offset` or
        `nbytes`; a file that is not on tmpfs is refused by the daemon."""
        if not isinstance(fd, int) or fd < 0:
            raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                       f"fd: {fd!r} is not an open file descriptor")
        if int(offset) < 0:
            raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT, f"offset: {offset} < 0")
        if int(nbytes) <= 0:
            raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT, f"nbytes: {nbytes} <= 0")
        try:
            st = os.fstat(fd)
        except OSError as e:
            raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT, f"fd: {fd}: {e}") from None
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                       f"fd: {fd} is not a regular file (a memfd or /dev/shm "
                                       "object)")
        if int(offset) + int(nbytes) > st.st_size:
            raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                       f"nbytes: [{offset}, {int(offset) + int(nbytes)}) does not "
                                       f"fit fd {fd} ({st.st_size} bytes)")
        held = _HeldFd(os.dup(fd))
        data = _host_spec(layout, writable, name).SerializeToString()
        offset, nbytes = int(offset), int(nbytes)

        def register():
            return self._register_fd(held.fd, offset, nbytes, data)

        return self._track(Region(self, register(), keepalive=held, redo=register))

    def register_host_array(self, obj, *,
                            layout: Union[PagedLayout, "region_pb2.PagedKvLayout", None] = None,
                            writable: bool = False, name: Optional[str] = None) -> Region:
        """Registers the memory of `obj` - a numpy ndarray or a torch CPU tensor - without a
        copy, when it is a shared mapping of a memfd or a /dev/shm file: a tensor after
        share_memory_(), numpy over multiprocessing.shared_memory, an mmap of a memfd or /dev/shm
        file, a HostBuffer's ndarray(). The region spans obj's bytes from its lowest to its highest
        element; `layout` (paged KV; default: bytes) describes them from the lowest byte on.
        The Region holds `obj`, so its memory outlives the registration. Anonymous or private
        memory (numpy.zeros, a tensor before share_memory_()) is refused with
        InvalidArgumentError naming `obj`; so is a read-only array with `writable`. torch is
        never imported here."""
        from kvrail import host_memory
        try:
            address, nbytes, readonly = host_memory.array_span(obj)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT, str(e)) from None
        if writable and readonly:
            raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                       "obj: a read-only array cannot back a writable region")
        spec = _host_spec(layout, writable, name)
        if spec.HasField("paged_kv"):
            need = PagedLayout.from_proto(spec.paged_kv).nbytes
            if need > nbytes:
                raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                           f"layout: needs {need} bytes, obj spans {nbytes}")
        data = spec.SerializeToString()

        def register():
            try:
                backing = host_memory.find_backing(address, nbytes, writable=writable, arg="obj")
            except ValueError as e:
                raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT, str(e)) from None
            try:
                return self._register_fd(backing.fd, backing.offset, nbytes, data)
            except KvrailError as e:
                if "spec.share" not in e.message and "spec.writable" not in e.message:
                    raise
                raise type(e)(e.code, f"obj: its memory is a mapping of {backing.path}: "
                                      f"{e.message}") from None
            finally:
                os.close(backing.fd)

        return self._track(Region(self, register(), keepalive=obj, redo=register))

    def _register_fd(self, fd: int, offset: int, nbytes: int, spec: bytes):
        region_id = ctypes.c_uint64()
        info, info_len = out_bytes()
        check(lib().kvrail_register_host_fd(self._h, fd, offset, nbytes, spec, len(spec),
                                            ctypes.byref(region_id), ctypes.byref(info),
                                            ctypes.byref(info_len)))
        return region_pb2.RegionInfo.FromString(take_bytes(info, info_len.value))

    def register_region(self, spec) -> Region:
        """Registers a RegionSpec as it is (e.g. share.shm_name), tied to this client's session."""
        data = spec.SerializeToString()

        def register():
            region_id = ctypes.c_uint64()
            info, info_len = out_bytes()
            check(lib().kvrail_register_region(self._h, data, len(data), ctypes.byref(region_id),
                                               ctypes.byref(info), ctypes.byref(info_len)))
            return region_pb2.RegionInfo.FromString(take_bytes(info, info_len.value))

        return self._track(Region(self, register(), redo=register))

    def register_cuda(self, device_ptr: int, nbytes: int, spec=None, keepalive=None) -> Region:
        """Registers [device_ptr, device_ptr + nbytes) of one cudaMalloc allocation (CUDA IPC).
        `spec` gives name, layout and writable. `keepalive` (e.g. the tensor) is held by the
        Region. Needs a GPU; see kvrail.torch for tensors."""
        data = spec.SerializeToString() if spec is not None else b""

        def register():
            region_id = ctypes.c_uint64()
            info, info_len = out_bytes()
            check(lib().kvrail_register_cuda(self._h, ctypes.c_void_p(device_ptr), int(nbytes),
                                             data, len(data), ctypes.byref(region_id),
                                             ctypes.byref(info), ctypes.byref(info_len)))
            return region_pb2.RegionInfo.FromString(take_bytes(info, info_len.value))

        return self._track(Region(self, register(), keepalive, redo=register))

    def register_host_layers(self, layers: Sequence[Union[HostBuffer, Tuple[HostBuffer, int]]],
                             layout: PagedLayout, *, writable: bool = False,
                             name: str = "") -> Region:
        """A per-layer region: layer L of `layout` is the memory of layers[L], a HostBuffer or a
        (HostBuffer, byte offset) pair (several layers may share a buffer). `layout` describes
        every layer alike: num_layers == len(layers); its layer_stride is ignored (each layer
        has its own base). One transfer then moves any range of the layers."""
        # One layer's span (dense layouts: derived from `order` as for one layer, as the daemon
        # derives them).
        one = dataclasses.replace(layout, num_layers=1, layer_stride=0)
        spec = region_pb2.RegionSpec(name=name, writable=writable, size_bytes=one.nbytes)
        spec.paged_kv.CopyFrom(dataclasses.replace(layout, layer_stride=0).to_proto())
        data = spec.SerializeToString()
        pairs = [(item, 0) if isinstance(item, HostBuffer) else (item[0], int(item[1]))
                 for item in layers]
        if not pairs:
            raise ValueError("layers: empty")

        def register():
            handles = (ctypes.c_void_p * len(pairs))(*[b.handle for b, _ in pairs])
            offsets = (ctypes.c_uint64 * len(pairs))(*[o for _, o in pairs])
            region_id = ctypes.c_uint64()
            info, info_len = out_bytes()
            check(lib().kvrail_register_host_layers(self._h, handles, offsets, len(pairs), data,
                                                    len(data), ctypes.byref(region_id),
                                                    ctypes.byref(info), ctypes.byref(info_len)))
            return region_pb2.RegionInfo.FromString(take_bytes(info, info_len.value))

        return self._track(Region(self, register(), keepalive=[b for b, _ in pairs],
                                  redo=register))

    def register_cuda_layers(self, layer_ptrs: Sequence[int], layer_bytes: int, spec,
                             keepalive=None) -> Region:
        """A per-layer CUDA region: layer L is [layer_ptrs[L], + layer_bytes) of one cudaMalloc
        allocation each, all on one GPU; `spec` (a RegionSpec) gives the paged layout
        (num_layers == len(layer_ptrs), layer_stride 0), name and writable. See
        kvrail.tensors.register_kv_cache for a list of per-layer tensors."""
        data = spec.SerializeToString()
        ptrs = [int(p) for p in layer_ptrs]
        if not ptrs:
            raise ValueError("layer_ptrs: empty")

        def register():
            c_ptrs = (ctypes.c_void_p * len(ptrs))(*ptrs)
            region_id = ctypes.c_uint64()
            info, info_len = out_bytes()
            check(lib().kvrail_register_cuda_layers(self._h, c_ptrs, len(ptrs), int(layer_bytes),
                                                    data, len(data), ctypes.byref(region_id),
                                                    ctypes.byref(info), ctypes.byref(info_len)))
            return region_pb2.RegionInfo.FromString(take_bytes(info, info_len.value))

        return self._track(Region(self, register(), keepalive, redo=register))

    def export_region(self, region: Union[Region, int], peer_node: str):
        """Region.export: lets node `peer_node`'s kvraild write into `region` (a Region or id of
        this client's session) over the fabric; returns the kvrail.v1.RegionLease."""
        if not isinstance(peer_node, str) or not peer_node:
            raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                       "peer_node: a node id of the peer directory")
        region_id = region.id if isinstance(region, Region) else int(region)
        return self._message_call(lib().kvrail_export_region, transfer_pb2.RegionLease, region_id,
                                  peer_node.encode())

    def revoke_grant(self, token: str) -> None:
        """Ends a grant this client created (transfers already accepted under it run on)."""
        check(lib().kvrail_revoke_grant(self._h, token.encode()))

    def unregister_region(self, region_id: int) -> None:
        check(lib().kvrail_unregister_region(self._h, int(region_id)))

    # --- transfers --------------------------------------------------------------------------
    def submit(self, spec) -> Transfer:
        """Submits a kvrail.v1.TransferSpec; returns once the daemon accepted it."""
        data = spec.SerializeToString()
        transfer_id = ctypes.c_uint64()
        response, response_len = out_bytes()
        check(lib().kvrail_submit(self._h, data, len(data), ctypes.byref(transfer_id),
                                  ctypes.byref(response), ctypes.byref(response_len)))
        return Transfer(self, transfer_id.value, take_bytes(response, response_len.value))

    def submit_batch(self, specs: Sequence) -> List[Union[Transfer, KvrailError]]:
        """Submits several kvrail.v1.TransferSpecs at once (the K, V and auxiliary state of one
        chunk, several ranks): with the session's submission queue those that fit go in one
        write, answered without a socket round trip. Returns, in order, a Transfer for each
        accepted spec and the KvrailError (not raised) for each refused one: one refusal refuses
        none of the others. Raises only for misuse (a spec that does not serialize)."""
        count = len(specs)
        if count == 0:
            return []
        datas = [spec.SerializeToString() for spec in specs]
        c_specs = (ctypes.c_char_p * count)(*datas)
        c_lens = (ctypes.c_size_t * count)(*(len(d) for d in datas))
        ids = (ctypes.c_uint64 * count)()
        codes = (ctypes.c_int32 * count)()
        code = lib().kvrail_submit_batch(self._h, c_specs, c_lens, count, ids, codes)
        if code != 0 and not any(codes):
            check(code)  # nothing was answered one by one (a closed client, a malformed spec)
        message = lib().kvrail_last_error_message() if code != 0 else None
        first = message.decode("utf-8", "replace") if message else ""
        out: List[Union[Transfer, KvrailError]] = []
        for i in range(count):
            if codes[i] == 0:
                out.append(Transfer(self, ids[i]))
            else:
                # The library names the first refusal's index; the others carry their code.
                text = first if first.startswith(f"specs[{i}]: ") else f"specs[{i}]: refused"
                out.append(error_for(codes[i], text))
        return out

    def transfer(self, src: Union[Region, int], src_blocks: Sequence[int],
                 dst: Union[Region, int], dst_blocks: Sequence[int], **fields) -> Transfer:
        """Submits a paged transfer of `src_blocks` of `src` into `dst_blocks` of `dst`. Other
        TransferSpec fields by keyword (num_layers=, num_tokens=, layerwise=, priority=, ...;
        digest=True checks every tile end to end, result in the status's `digest`);
        src_/dst_ prefixed ones set the endpoints' (src_layer_begin=, dst_head_begin=, ...)."""
        spec = transfer_pb2.TransferSpec()
        spec.src.region_id = src.id if isinstance(src, Region) else int(src)
        spec.dst.region_id = dst.id if isinstance(dst, Region) else int(dst)
        for key, value in fields.items():
            side, _, rest = key.partition("_")
            if side in ("src", "dst") and rest:
                setattr(getattr(spec, side), rest, value)
            elif hasattr(value, "DESCRIPTOR"):  # a message field (ready_flags=, arrival_flags=)
                getattr(spec, key).CopyFrom(value)
            else:
                setattr(spec, key, value)
        # The ids go to the library as uint32 arrays: no protobuf encoding of them in Python.
        src_ids, dst_ids = _id_array(src_blocks, "src_blocks"), _id_array(dst_blocks, "dst_blocks")
        data = spec.SerializeToString()
        transfer_id = ctypes.c_uint64()
        response, response_len = out_bytes()
        check(lib().kvrail_submit_blocks(self._h, data, len(data), _address(src_ids),
                                         len(src_ids), _address(dst_ids), len(dst_ids),
                                         ctypes.byref(transfer_id), ctypes.byref(response),
                                         ctypes.byref(response_len)))
        return Transfer(self, transfer_id.value, take_bytes(response, response_len.value))

    def prepare(self, src: Union[Region, int], dst: Union[Region, int], src_block_count: int,
                dst_block_count: int = 0, **fields) -> "PreparedTransfer":
        """Prepares a paged transfer's shape from `src` into `dst` (other TransferSpec fields by
        keyword, as transfer(); no block ids) for posts of `src_block_count` source and
        `dst_block_count` destination ids (0: as many as the tokens need). The daemon validates
        and plans it once; each PreparedTransfer.post(src_blocks, dst_blocks) then checks only
        its ids. A context manager that releases it."""
        from kvrail.prepared import PreparedTransfer
        spec = transfer_pb2.TransferSpec()
        spec.src.region_id = src.id if isinstance(src, Region) else int(src)
        spec.dst.region_id = dst.id if isinstance(dst, Region) else int(dst)
        for key, value in fields.items():
            side, _, rest = key.partition("_")
            if side in ("src", "dst") and rest:
                setattr(getattr(spec, side), rest, value)
            else:
                setattr(spec, key, value)
        data = spec.SerializeToString()
        handle = ctypes.c_void_p()
        response, response_len = out_bytes()
        check(lib().kvrail_prepare(self._h, data, len(data), int(src_block_count),
                                   int(dst_block_count), ctypes.byref(handle),
                                   ctypes.byref(response), ctypes.byref(response_len)))
        return PreparedTransfer(self, handle.value, take_bytes(response, response_len.value))

    def _status_call(self, fn, *args):
        state = ctypes.c_int32()
        status, status_len = out_bytes()
        check(fn(self._h, *args, ctypes.byref(state), ctypes.byref(status),
                 ctypes.byref(status_len)))
        return transfer_pb2.TransferStatus.FromString(take_bytes(status, status_len.value))

    def get(self, transfer: TransferLike):
        """The transfer's current kvrail.v1.TransferStatus."""
        return self._status_call(lib().kvrail_get, _id(transfer))

    def wait(self, transfer: TransferLike, timeout: Optional[float] = None):
        """Blocks until the transfer ends or `timeout` seconds pass (None: until it ends; 0: the
        current status at once); returns its status (not final on timeout)."""
        timeout_ms = -1 if timeout is None else max(0, int(timeout * 1000))
        if timeout is not None and timeout > 0 and timeout_ms == 0:
            timeout_ms = 1
        return self._status_call(lib().kvrail_wait, _id(transfer), timeout_ms)

    def wait_end(self, transfer: TransferLike, timeout: Optional[float] = None):
        """As wait(), but an end the completion queue holds is read from it without a call: the
        status then carries transfer_id, state, error_code, bytes_total, bytes_done and
        finished_unix_us only (wait() and get() have the rest: path, engine, phases). An end with
        an error message, and a transfer the queue does not follow, come from the daemon."""
        timeout_ms = -1 if timeout is None else max(0, int(timeout * 1000))
        if timeout is not None and timeout > 0 and timeout_ms == 0:
            timeout_ms = 1
        return self._status_call(lib().kvrail_wait_end, _id(transfer), timeout_ms)

    def cancel(self, transfer: TransferLike):
        return self._status_call(lib().kvrail_cancel, _id(transfer))

    def mark_ready(self, transfer: TransferLike, layer_begin: int, layer_count: int = 1) -> None:
        check(lib().kvrail_mark_ready(self._h, _id(transfer), layer_begin, layer_count))

    def _follows(self, transfer_id: int) -> bool:
        """Whether the transfer's end comes through this client's completion queue."""
        follows = ctypes.c_int(0)
        check(lib().kvrail_completion_follows(self._h, transfer_id, ctypes.byref(follows)))
        return bool(follows.value)

    def _completion_waiter(self, loop: asyncio.AbstractEventLoop) -> "Optional[_CompletionWaiter]":
        """This client's completion waiter on `loop`; None without a completion queue."""
        waiters = self.__dict__.setdefault("_waiters", weakref.WeakKeyDictionary())
        waiter = waiters.get(loop)
        if waiter is None:
            fd = ctypes.c_int(-1)
            check(lib().kvrail_completion_fd(self._h, ctypes.byref(fd)))
            if fd.value < 0:
                return None
            waiter = waiters[loop] = _CompletionWaiter(self, loop, fd.value)
        return waiter

    def poll(self, transfers: Iterable[TransferLike], raise_on_error: bool = True) -> List[int]:
        """The TransferStates of many transfers in one call, read from the completion queue
        where it can tell (no call), else from the daemon. An id the daemon does not know
        raises (NotFoundError naming its index) unless raise_on_error is False, when its state
        reads 0 (TRANSFER_STATE_UNSPECIFIED)."""
        # Converted in C where it can be (ids as ints: one array build, no per-id Python call)
        # and handed to the library without a copy (ctypes views over the arrays' buffers).
        seq = transfers if isinstance(transfers, (list, tuple)) else list(transfers)
        try:
            ids = array.array("Q", seq)
        except (TypeError, OverflowError):
            ids = array.array("Q", [_id(t) % (1 << 64) for t in seq])
        n = len(ids)
        if n == 0:
            return []
        states = array.array("i", bytes(4 * n))
        code = lib().kvrail_poll(self._h, (ctypes.c_uint64 * n).from_buffer(ids), n,
                                 (ctypes.c_int32 * n).from_buffer(states), None)
        if code != 0 and (raise_on_error or code == StatusCode.INVALID_ARGUMENT):
            check(code)
        return states.tolist()

    # --- admin ------------------------------------------------------------------------------
    def _message_call(self, fn, message_type, *args):
        out, out_len = out_bytes()
        check(fn(self._h, *args, ctypes.byref(out), ctypes.byref(out_len)))
        return message_type.FromString(take_bytes(out, out_len.value))

    def list_regions(self) -> list:
        """Every region the daemon holds (kvrail.v1.RegionInfo), of every client."""
        return list(self._message_call(lib().kvrail_list_regions,
                                       admin_pb2.ListRegionsResponse).regions)

    def list_transfers(self, states: Sequence[int] = (), limit: int = 0, *,
                       region: Union[Region, int, None] = None, label: str = "",
                       idempotency_key: str = "") -> list:
        """Recent transfers (kvrail.v1.TransferStatus), newest first. Filters (all must match):
        `states`; `region` (a Region or id of this daemon, either side); `label` and
        `idempotency_key` (exact). `limit` 0: the daemon's default (100)."""
        request = admin_pb2.ListTransfersRequest(states=list(states), limit=int(limit),
                                                 label=label, idempotency_key=idempotency_key)
        if region is not None:
            request.region_id = region.id if isinstance(region, Region) else int(region)
        data = request.SerializeToString()
        return list(self._message_call(lib().kvrail_list_transfers_filtered,
                                       admin_pb2.ListTransfersResponse, data,
                                       len(data)).transfers)

    def stats(self):
        """The daemon's kvrail.v1.Stats."""
        return self._message_call(lib().kvrail_get_stats, admin_pb2.Stats)

    def __repr__(self) -> str:
        return f"Client({self.target!r}{', closed' if self.closed else ''})"


class _HeldFd:
    """A descriptor a Region holds (register_host_fd's duplicate), closed when collected."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._finalizer = weakref.finalize(self, os.close, fd)


def _host_spec(layout, writable: bool, name: Optional[str]):
    spec = region_pb2.RegionSpec(name=name or "", writable=bool(writable))
    if layout is not None:
        spec.paged_kv.CopyFrom(layout.to_proto() if isinstance(layout, PagedLayout) else layout)
    return spec


def _id_array(blocks, name: str) -> "array.array":
    """Block ids as a uint32 array (a numpy array or any sequence of ints)."""
    if isinstance(blocks, array.array) and blocks.typecode == "I":
        return blocks
    try:
        return array.array("I", blocks.astype("uint32", copy=False).tobytes()
                           if hasattr(blocks, "astype") else blocks)
    except (OverflowError, TypeError) as e:
        raise ValueError(f"{name}: block ids must be integers in [0, 2^32): {e}") from None


def _address(ids: "array.array") -> Optional[int]:
    return ids.buffer_info()[0] if len(ids) else None


def _id(transfer: TransferLike) -> int:
    return transfer.id if isinstance(transfer, Transfer) else int(transfer)


def connect(target: Optional[str] = None, probe_timeout: float = 3.0) -> Client:
    """Connects to kvraild: `target` a unix socket path ("unix:PATH" too) or "host:port"; None:
    $KVRAIL_SOCKET, else /run/kvrail/kvrail.sock. UnavailableError when it does not answer."""
    return Client(target, probe_timeout)


def poll(transfers: Sequence[Transfer], raise_on_error: bool = True) -> List[int]:
    """Client.poll over Transfer objects of one client."""
    transfers = list(transfers)
    if not transfers:
        return []
    return transfers[0]._client.poll(transfers, raise_on_error)


async def wait_all(transfers: Sequence[Transfer], poll_interval: float = 0.005) -> list:
    """Awaits many transfers (not one thread each): on the completion queue's eventfd when the
    client has one, else with one poll call per `poll_interval`; returns their final statuses in
    order (no raise on failure)."""
    pending = [t for t in transfers if t._final is None]
    if pending and pending[0]._client._completion_waiter(asyncio.get_running_loop()) is not None \
            and all(t._client._follows(t.id) for t in pending):
        await asyncio.gather(*(t.wait_async() for t in pending))
        pending = [t for t in pending if t._final is None]
    while pending:
        states = poll(pending)
        for t, state in zip(pending, states):
            if is_final(state):
                t.wait(0)
        pending = [t for t in pending if t._final is None]
        if pending:
            await asyncio.sleep(poll_interval)
    return [t._final for t in transfers]


if TYPE_CHECKING:
    from kvrail.prepared import PreparedTransfer

__all__ = ["Client", "HostBuffer", "Region", "Transfer", "connect", "poll", "wait_all",
           "is_final", "KvrailError"]

"""Transfers: Transfer, the handle of a submitted transfer (wait, result, await), and
TransferCalls, the Client's calls that submit, prepare, wait for, cancel and poll transfers.

Thread contract: as the Client's (the calls may run on any thread, concurrently); a Transfer is a
thin handle, safe to share. `await` runs on the awaiting event loop's thread.
"""
from __future__ import annotations

import array
import asyncio
import ctypes
import struct
import threading
from typing import TYPE_CHECKING, Iterable, List, Optional, Sequence, Union

from kvrail._lib import (EndWaitStruct, SpecSubmitStruct, TransferEndStruct, _u8p, check, lib,
                         out_bytes, take_bytes)
from kvrail.errors import KvrailError, StatusCode, TransferFailedError, error_for
from kvrail.proto import transfer_pb2
from kvrail.regions import Region

if TYPE_CHECKING:
    from kvrail.client import Client
    from kvrail.completions import CompletionWaiter

TransferState = transfer_pb2.TransferState
_TransferStatus = transfer_pb2.TransferStatus
_SPEC_CACHE = 256  # kept specs a client holds by shape (cleared when full)
# Scratch memory for the hot calls (_scratch): a kvrail_spec_submit, up to _IDS_INLINE block
# ids right after it, then a kvrail_end_wait; each call's arguments written with one pack and its
# answer read with one unpack (no ctypes field access, no struct made per call; the call itself
# takes the one pointer).
_SUBMIT_IN = struct.Struct("=IIIQQ")  # at 4: src_count, dst_count, reserved, spec, ids
# The answer: kvrail_submitted (struct_size, tiles_total, transfer_id, bytes_total, deduplicated,
# followed), then, past the end's fields (kvrail_transfer_end), the length of the end's
# serialized status at _END_AT (0: it had not ended when answered).
_SUBMITTED = struct.Struct(f"=IIQQII{ctypes.sizeof(TransferEndStruct)}xI")
_END_AT = SpecSubmitStruct.end_status.offset
_SUBMITTED_AT = SpecSubmitStruct.submitted.offset
_IDS_AT = ctypes.sizeof(SpecSubmitStruct)
_IDS_INLINE = 64
# The arguments and `n` ids in one pack (the answer's bytes in between are zeroed: the library
# clears them anyway).
_SUBMIT_IDS = [struct.Struct(f"=IIIQQ{_IDS_AT - _SUBMITTED_AT}x{n}I")
               for n in range(_IDS_INLINE + 1)]
_WAIT_AT = _IDS_AT + 4 * _IDS_INLINE
_WAIT_IN = struct.Struct("=QQq")  # at _WAIT_AT + 8: client, transfer_id, timeout_ms
_WAIT_OUT = struct.Struct("=I24xQ")  # at _WAIT_AT + 4: len, heap
_WAIT_DATA = _WAIT_AT + EndWaitStruct.data.offset
assert _SUBMIT_IN.size == SpecSubmitStruct.ids.offset + 8 - 4 == _SUBMITTED_AT - 4
assert _SUBMITTED.size == SpecSubmitStruct.end_len.offset + 4 - _SUBMITTED_AT
assert _WAIT_IN.size == EndWaitStruct.heap.offset - 8
assert _WAIT_OUT.size == EndWaitStruct.heap.offset + 8 - 4
assert _IDS_AT % 4 == 0 and _WAIT_AT % 8 == 0
_local = threading.local()
_FINAL = (transfer_pb2.TRANSFER_STATE_SUCCEEDED, transfer_pb2.TRANSFER_STATE_FAILED,
          transfer_pb2.TRANSFER_STATE_CANCELLED)


def is_final(state: int) -> bool:
    """Whether a TransferState is final (SUCCEEDED, FAILED or CANCELLED)."""
    return state in _FINAL


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
    # Until set on the instance (fewer attributes for a submit to set): the final TransferStatus
    # once seen; the completion queue's short final status (wait_end, await); the completion
    # waiter's armed spell (completions.Armed) it was submitted in, if any: its end then reaches
    # that waiter without a look at the queue (CompletionWaiter.ended).
    _final = None
    _end = None
    _armed_at = None

    def __init__(self, client: "Client", transfer_id: int, response=None,
                 follows: Optional[bool] = None) -> None:
        self._client = client
        self.id: int = transfer_id
        # kvrail.v1.SubmitTransferResponse, made on first use (the hot path submits and waits
        # without reading it) from its bytes or from kvrail_submitted's fields (a tuple).
        self._response = response
        # Whether its end comes through the completion queue (None: not known yet, asked once).
        self._follows = follows

    @property
    def response(self):
        response = self._response
        if isinstance(response, bytes):
            self._response = transfer_pb2.SubmitTransferResponse.FromString(response)
        elif isinstance(response, tuple):
            tiles_total, bytes_total, deduplicated = response[1], response[3], response[4]
            self._response = transfer_pb2.SubmitTransferResponse(
                transfer_id=self.id, deduplicated=bool(deduplicated), bytes_total=bytes_total,
                tiles_total=tiles_total)
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
        if timeout is None or status.state in _FINAL:  # without a limit it returns the end
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

    def _ended_future(self) -> "Optional[asyncio.Future]":
        """A future of the running loop's completion waiter that the end resolves (with the short
        status, or None: read it with wait_end); None when the queue does not follow it."""
        follows = self._follows
        if follows is None:
            follows = self._follows = self._client._follows(self.id)
        if not follows:
            return None
        waiter = self._client._completion_waiter(asyncio.get_running_loop())
        return waiter.ended(self) if waiter is not None else None

    def _await_end(self):
        # A generator for `yield from`: the waiter's future itself is awaited (no coroutine or
        # Task of its own per transfer).
        if self._final is None and self._end is None:
            future = self._ended_future()
            if future is not None:
                end = yield from future
                if end is not None:
                    self._end = end
                else:
                    # One the queue missed, or with more to say, is read from the daemon; one
                    # still running then is waited for below.
                    self.wait_end(0)
            if self._final is None and self._end is None:
                loop = asyncio.get_running_loop()
                while self._final is None and self._end is None:
                    yield from loop.run_in_executor(None, self.wait,
                                                    self._AWAIT_SLICE_MS / 1000.0)
        return self._final if self._final is not None else self._end

    async def wait_async(self):
        """The final status, awaited without blocking the event loop (no raise on failure):
        the completion queue's short status when it holds the end, else the daemon's."""
        return await _EndAwaitable(self)

    def __await__(self):
        status = yield from self._await_end()
        return self._outcome(status)

    def __repr__(self) -> str:
        return f"Transfer(id={self.id})"


class _EndAwaitable:
    """Awaits a transfer's end without raising on failure (Transfer.wait_async)."""

    __slots__ = ("_transfer",)

    def __init__(self, transfer: Transfer) -> None:
        self._transfer = transfer

    def __await__(self):
        return self._transfer._await_end()


TransferLike = Union[Transfer, int]


class TransferCalls:
    """The Client's transfer calls (a base of Client, which provides _h, _handle, _specs, a dict
    of kept specs (_KeptSpec) by shape, and _armed, the completion waiter armed now if any)."""

    def _armed_now(self):
        """The completion waiter's armed spell now (None: none), after disarming one whose event
        loop was closed while armed (its ends would pile up untaken). Every submit looks."""
        armed = self._armed
        if armed is not None:
            armed.abandon_if_closed()
            armed = self._armed
        return armed

    def submit(self, spec) -> Transfer:
        """Submits a kvrail.v1.TransferSpec; returns once the daemon accepted it."""
        self._armed_now()
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
        self._armed_now()
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
        armed = self._armed
        if armed is not None:
            armed = self._armed_now()
        src_id = src._id if isinstance(src, Region) else int(src)
        dst_id = dst._id if isinstance(dst, Region) else int(dst)
        # The spec without ids is the same for every transfer of one shape: kept parsed by the
        # library (kvrail_spec) once per shape (keyword values that cannot be a dict key, a
        # message, make a spec each time).
        key = (src_id, dst_id, *fields.items()) if fields else (src_id, dst_id)
        specs = self._specs
        try:
            spec = specs[key]
        except KeyError:
            spec = _KeptSpec(self, _spec_bytes(src_id, dst_id, fields))
            if len(specs) >= _SPEC_CACHE:
                specs.clear()
            specs[key] = spec
        except TypeError:
            spec = _KeptSpec(self, _spec_bytes(src_id, dst_id, fields))
        try:
            scratch = _local.free.pop()
        except (AttributeError, IndexError):
            scratch = _scratch()
        view, address, submit_spec, _, _, _ = scratch
        # The ids go to the library as one uint32 array, source's then destination's (no
        # protobuf encoding of them in Python): a few, from lists, packed into the scratch with
        # the call's arguments.
        ids = None
        if type(src_blocks) is list and type(dst_blocks) is list:
            src_count = len(src_blocks)
            count = src_count + len(dst_blocks)
            if count <= _IDS_INLINE:
                try:
                    _SUBMIT_IDS[count].pack_into(view, 4, src_count, count - src_count, 0,
                                                 spec.handle, address + _IDS_AT, *src_blocks,
                                                 *dst_blocks)
                except struct.error:  # converted below, the error naming its side
                    count = -1
            else:
                count = -1
        else:
            count = -1
        if count < 0:
            try:
                ids, src_count = _block_ids(src_blocks, dst_blocks)
            except ValueError:
                _local.free.append(scratch)
                raise
            count = len(ids)
            _SUBMIT_IN.pack_into(view, 4, src_count, count - src_count, 0, spec.handle,
                                 ids.buffer_info()[0] if count else 0)
        code = submit_spec(address)
        if code:
            _local.free.append(scratch)
            check(code)
        answer = _SUBMITTED.unpack_from(view, _SUBMITTED_AT)
        transfer = Transfer(self, answer[2], answer, answer[5] != 0)
        if answer[6]:
            # It ended before the answer (a small host transfer runs inline): its end is what
            # wait_end() and `await` return, with no call and no look at the queue.
            transfer._end = _TransferStatus.FromString(scratch[5][answer[6]])
        _local.free.append(scratch)
        if armed is not None:
            transfer._armed_at = armed
            # Submitted on the event loop that awaits the queue: the ends that came during the
            # submit are dispatched now, so their awaits resume before this coroutine's next
            # step rather than after it (a loop that submits back to back runs the reader only
            # after each step).
            waiter = armed.waiter
            if waiter._loop is asyncio._get_running_loop() and waiter._token is armed:
                waiter._on_ready()
                if answer[6]:  # taken above with no await for it: not kept for one
                    waiter._early.pop(transfer.id, None)
        return transfer

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
        if timeout is None:
            timeout_ms = -1
        else:
            timeout_ms = max(0, int(timeout * 1000))
            if timeout > 0 and timeout_ms == 0:
                timeout_ms = 1
        transfer_id = transfer if type(transfer) is int else _id(transfer)
        try:
            scratch = _local.free.pop()
        except (AttributeError, IndexError):
            scratch = _scratch()
        view, address, _, wait_end_into, statuses, _ = scratch
        # The status comes serialized in this thread's scratch (kvrail_wait_end_into): one parse,
        # no allocation or free in the library.
        try:
            _WAIT_IN.pack_into(view, _WAIT_AT + 8, self._handle or 0, transfer_id, timeout_ms)
        except struct.error:  # outside uint64 / int64: the id wrapped (the daemon's NOT_FOUND
            # names it), the timeout the longest there is
            _WAIT_IN.pack_into(view, _WAIT_AT + 8, self._handle or 0, transfer_id % (1 << 64),
                               min(timeout_ms, (1 << 63) - 1))
        code = wait_end_into(address + _WAIT_AT)
        if code:
            _local.free.append(scratch)
            check(code)
        size, heap = _WAIT_OUT.unpack_from(view, _WAIT_AT + 4)
        if heap:  # longer than the scratch's data (a long error message): the library's bytes
            status = _TransferStatus.FromString(take_bytes(ctypes.cast(heap, _u8p), size))
        else:
            status = _TransferStatus.FromString(statuses[size])
        _local.free.append(scratch)
        return status

    def cancel(self, transfer: TransferLike):
        return self._status_call(lib().kvrail_cancel, _id(transfer))

    def mark_ready(self, transfer: TransferLike, layer_begin: int, layer_count: int = 1) -> None:
        check(lib().kvrail_mark_ready(self._h, _id(transfer), layer_begin, layer_count))

    def _follows(self, transfer_id: int) -> bool:
        """Whether the transfer's end comes through this client's completion queue."""
        follows = ctypes.c_int(0)
        check(lib().kvrail_completion_follows(self._h, transfer_id, ctypes.byref(follows)))
        return bool(follows.value)

    def _completion_waiter(self, loop: asyncio.AbstractEventLoop) -> "Optional[CompletionWaiter]":
        """This client's completion waiter on `loop`; None without a completion queue."""
        from kvrail.completions import CompletionWaiter
        waiters = self._waiters
        waiter = waiters.get(loop)
        if waiter is None:
            fd = ctypes.c_int(-1)
            check(lib().kvrail_completion_fd(self._h, ctypes.byref(fd)))
            if fd.value < 0:
                return None
            waiter = waiters[loop] = CompletionWaiter(self, loop, fd.value)
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


def _spec_bytes(src_id: int, dst_id: int, fields: dict) -> bytes:
    """A paged TransferSpec from `src_id` into `dst_id` with keyword `fields` (Client.transfer),
    serialized, without block ids."""
    spec = transfer_pb2.TransferSpec()
    spec.src.region_id = src_id
    spec.dst.region_id = dst_id
    for key, value in fields.items():
        side, _, rest = key.partition("_")
        if side in ("src", "dst") and rest:
            setattr(getattr(spec, side), rest, value)
        elif hasattr(value, "DESCRIPTOR"):  # a message field (ready_flags=, arrival_flags=)
            getattr(spec, key).CopyFrom(value)
        else:
            setattr(spec, key, value)
    return spec.SerializeToString()


class _KeptSpec:
    """A spec kept parsed by the library (kvrail_spec) for one shape of a client's transfers.
    Freed when the last reference goes: a client's cache may drop it while a submit on another
    thread still holds it."""

    __slots__ = ("handle",)

    def __init__(self, client: "Client", data: bytes) -> None:
        handle = ctypes.c_void_p()
        check(lib().kvrail_spec_create(client._h, data, len(data), ctypes.byref(handle)))
        self.handle: int = handle.value

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        if handle:
            try:
                lib().kvrail_spec_free(handle)
            except Exception:  # interpreter shutdown: the process's end frees it anyway
                pass


def _scratch() -> tuple:
    """A new scratch for the hot calls: (a byte view over it, its address, kvrail_submit_spec,
    kvrail_wait_end_into, views of the first n bytes of the end's status for each n, the same
    of the submit's carried end); a kvrail_spec_submit at 0, up to _IDS_INLINE block ids at
    _IDS_AT, a kvrail_end_wait at _WAIT_AT. A call takes one from its thread's free list
    (_local.free), writes its arguments, calls, reads its answer and puts it back (a failed call
    too): a call made in between on the thread (a signal handler's, a finalizer's) takes another
    one."""
    raw = (ctypes.c_uint8 * (_WAIT_AT + ctypes.sizeof(EndWaitStruct)))()
    view = memoryview(raw).cast("B")  # keeps `raw` alive
    struct.pack_into("=I", view, 0, ctypes.sizeof(SpecSubmitStruct))
    struct.pack_into("=I", view, _WAIT_AT, ctypes.sizeof(EndWaitStruct))
    loaded = lib()
    if not hasattr(_local, "free"):
        _local.free = []
    statuses = [view[_WAIT_DATA:_WAIT_DATA + n] for n in range(EndWaitStruct.data.size + 1)]
    ends = [view[_END_AT:_END_AT + n] for n in range(SpecSubmitStruct.end_status.size + 1)]
    return (view, ctypes.addressof(raw), loaded.kvrail_submit_spec, loaded.kvrail_wait_end_into,
            statuses, ends)


def _block_ids(src_blocks, dst_blocks) -> "tuple[array.array, int]":
    """The source then the destination block ids as one uint32 array, and how many are the
    source's."""
    if type(src_blocks) is list and type(dst_blocks) is list:  # the common case first
        try:
            return array.array("I", src_blocks + dst_blocks), len(src_blocks)
        except (OverflowError, TypeError):
            pass  # converted side by side below, the error naming its side
    src_ids = _id_array(src_blocks, "src_blocks")
    return src_ids + _id_array(dst_blocks, "dst_blocks"), len(src_ids)


def _id_array(blocks, name: str) -> "array.array":
    """Block ids as a uint32 array (a numpy array or any sequence of ints)."""
    if type(blocks) is list:  # the common case first
        try:
            return array.array("I", blocks)
        except (OverflowError, TypeError) as e:
            raise ValueError(f"{name}: block ids must be integers in [0, 2^32): {e}") from None
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
    # The ends the completion queue follows, awaited on its eventfd: one future each on the
    # loop's waiter, no Task each; the rest, and the whole statuses, by the polls below.
    futures = [t._ended_future() for t in pending if t._end is None]
    await asyncio.gather(*(f for f in futures if f is not None))
    while pending:
        states = poll(pending)
        for t, state in zip(pending, states):
            if is_final(state):
                t.wait(0)
        pending = [t for t in pending if t._final is None]
        if pending:
            await asyncio.sleep(poll_interval)
    return [t._final for t in transfers]


__all__ = ["Transfer", "TransferCalls", "TransferLike", "TransferState", "is_final", "poll",
           "wait_all"]

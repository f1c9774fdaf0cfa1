"""Transfer ends awaited on an asyncio event loop through the session's completion queue (its
eventfd registered as the loop's reader): no thread, no Task and no polling slice per transfer.

Thread contract: a CompletionWaiter belongs to one event loop and runs on its thread only. One
event loop at a time should await a client's transfers this way (the queue's ends go to
whichever loop takes them first; the others find theirs in their once-a-second re-check).
"""
from __future__ import annotations

import asyncio
import ctypes
import struct
from typing import TYPE_CHECKING, Dict, List, Optional

from kvrail._lib import TransferEndStruct, check, lib
from kvrail.proto import transfer_pb2
from kvrail.transfers import is_final

if TYPE_CHECKING:
    from kvrail.client import Client
    from kvrail.transfers import Transfer

# kvrail_transfer_end as bytes: struct_size, state, transfer_id, error_code, flags, bytes_total,
# bytes_done, finished_unix_us (native order, no padding: the C struct's own layout).
_END = struct.Struct("=IiQiIQQQ")
assert _END.size == ctypes.sizeof(TransferEndStruct)
_TransferStatus = transfer_pb2.TransferStatus


class Armed:
    """One armed spell of a CompletionWaiter (Client._armed while it lasts; a transfer submitted
    meanwhile records it)."""

    __slots__ = ("waiter",)

    def __init__(self, waiter: "CompletionWaiter") -> None:
        self.waiter = waiter

    def abandon_if_closed(self) -> None:
        """Disarms the queue when the waiter's loop was closed while armed (asyncio.run ends
        between two awaits): nothing would take the ends any more."""
        if self.waiter._loop.is_closed():
            self.waiter._disarm()


class CompletionWaiter:
    """Awaits transfer ends for one client on one event loop. While anything is awaited (and
    for _IDLE_S after the last await, so awaits one after another keep it), the waiter is
    armed: the daemon rings the queue's eventfd, the loop's reader, for every
    completion, and each wake-up takes every end that came in one call (kvrail_take_ends: ids,
    states, counts and finish times in one array) and resolves the awaits' futures with the
    short status in one pass. An end taken before its await began is kept for it (at most
    _KEEP of them). An end the queue cannot tell without a call (a failure's message, a digest,
    one missed while the queue was full) resolves its future with None: the await reads it
    from the daemon. A re-check every second is the safety net."""

    _RECHECK_S = 1.0
    _IDLE_S = 0.05
    _BATCH = 1024
    _KEEP = 65536

    def __init__(self, client: "Client", loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self._client = client
        self._loop = loop
        self._fd = fd
        # Per transfer id, the futures of its awaits (usually one).
        self._futures: Dict[int, List[asyncio.Future]] = {}
        # Ends taken while no await wanted them yet: id -> short status (None: read it).
        self._early: Dict[int, Optional[object]] = {}
        # Set while armed; a transfer submitted meanwhile records it (Transfer._armed_at), and
        # then its end needs no look at the queue when awaited: it comes through this waiter.
        self._token: Optional[Armed] = None
        self._recheck: Optional[asyncio.TimerHandle] = None
        self._idle_check: Optional[asyncio.TimerHandle] = None
        self._last_await = 0.0  # loop.time() of the last await
        self._ends = (TransferEndStruct * self._BATCH)()
        self._ends[0].struct_size = ctypes.sizeof(TransferEndStruct)
        self._ends_address = ctypes.addressof(self._ends)
        self._ends_bytes = memoryview(self._ends).cast("B")
        self._count = ctypes.c_size_t(0)
        self._count_ref = ctypes.byref(self._count)

    def ended(self, transfer: "Transfer") -> asyncio.Future:
        """A future resolved when `transfer` (one the queue follows) has ended: with its short
        status, or None when it must be read with wait_end()."""
        future = self._loop.create_future()
        transfer_id = transfer.id
        self._last_await = self._loop.time()
        if transfer_id in self._early:
            future.set_result(self._early.pop(transfer_id))
            return future
        waiting = self._futures.get(transfer_id)
        if waiting is None:
            self._futures[transfer_id] = [future]
        else:
            waiting.append(future)
        armed_at = transfer._armed_at
        if self._token is None:
            self._arm()
        elif armed_at is not None and armed_at is self._token:
            # Submitted while armed: its end comes through this waiter; no look needed.
            return future
        # It may have ended already (read from the queue: no call); armed before this look, so
        # no end falls between them.
        if is_final(self._client.poll([transfer_id], raise_on_error=False)[0]):
            self._resolve(transfer_id, None)
        return future

    def _arm(self) -> None:
        check(lib().kvrail_arm_completions(self._client._h, 1))
        self._token = Armed(self)
        self._client._armed = self._token
        self._loop.add_reader(self._fd, self._on_ready)
        self._recheck = self._loop.call_later(self._RECHECK_S, self._on_recheck)

    def _disarm(self) -> None:
        if self._token is None:
            return
        if not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        for handle in (self._recheck, self._idle_check):
            if handle is not None:
                handle.cancel()
        self._recheck = self._idle_check = None
        if self._client._armed is self._token:
            self._client._armed = None
        self._token = None
        self._early.clear()
        if not self._client.closed:
            lib().kvrail_arm_completions(self._client._h, 0)

    def _schedule_idle_check(self) -> None:
        # Disarmed once nothing was awaited for _IDLE_S: an await that follows soon after the
        # last one ended (a transfer after a transfer) finds the waiter still armed.
        if self._idle_check is None and self._token is not None:
            self._idle_check = self._loop.call_later(self._IDLE_S, self._on_idle_check)

    def _on_idle_check(self) -> None:
        self._idle_check = None
        self._prune()
        if self._futures or self._token is None:
            return
        idle = self._loop.time() - self._last_await
        if idle >= self._IDLE_S:
            self._disarm()
        else:
            self._idle_check = self._loop.call_later(self._IDLE_S - idle, self._on_idle_check)

    def _prune(self) -> None:
        # Futures whose await was cancelled.
        for transfer_id in [i for i, fs in self._futures.items() if all(f.done() for f in fs)]:
            del self._futures[transfer_id]

    def _resolve(self, transfer_id: int, end) -> None:
        waiting = self._futures.pop(transfer_id, None)
        if waiting is None:
            return
        for future in waiting:
            if not future.done():
                future.set_result(end)
        if not self._futures:
            self._schedule_idle_check()

    def _on_ready(self) -> None:
        client = self._client
        handle = client._handle
        if handle is None:  # closed: the daemon rings no more
            self._loop.remove_reader(self._fd)
            return
        take = lib().kvrail_take_ends
        futures, early = self._futures, self._early
        unpack = _END.iter_unpack
        while True:
            code = take(handle, self._ends_address, self._BATCH, self._count_ref)
            if code:
                check(code)
            n = self._count.value
            for _, state, transfer_id, error_code, flags, total, done, finished in unpack(
                    self._ends_bytes[:n * _END.size]):
                end = None if flags else _TransferStatus(
                    transfer_id=transfer_id, state=state, error_code=error_code,
                    bytes_total=total, bytes_done=done, finished_unix_us=finished)
                waiting = futures.pop(transfer_id, None)
                if waiting is None:
                    if len(early) >= self._KEEP:
                        del early[next(iter(early))]
                    early[transfer_id] = end
                    continue
                for future in waiting:
                    if not future.done():
                        future.set_result(end)
            if n < self._BATCH:
                break
        if not futures:
            self._schedule_idle_check()

    def _on_recheck(self) -> None:
        self._recheck = None
        if self._client.closed or self._token is None:
            return
        self._on_ready()
        self._prune()
        ids = list(self._futures)
        if ids:
            states = self._client.poll(ids, raise_on_error=False)
            for transfer_id, state in zip(ids, states):
                # 0: the daemon could not say (e.g. not found): the transfer's own wait tells why.
                if is_final(state) or state == 0:
                    self._resolve(transfer_id, None)
        self._recheck = self._loop.call_later(self._RECHECK_S, self._on_recheck)
        if not self._futures:
            self._schedule_idle_check()


__all__ = ["Armed", "CompletionWaiter"]

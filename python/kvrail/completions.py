"""Transfer ends awaited on an asyncio event loop through the session's completion queue (its
eventfd registered as the loop's reader): no thread and no polling slice per transfer.

Thread contract: a CompletionWaiter belongs to one event loop and runs on its thread only.
"""
from __future__ import annotations

import asyncio
import ctypes
from typing import TYPE_CHECKING, Dict, List, Optional

from kvrail._lib import check, lib
from kvrail.transfers import is_final

if TYPE_CHECKING:
    from kvrail.client import Client


class CompletionWaiter:
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


__all__ = ["CompletionWaiter"]

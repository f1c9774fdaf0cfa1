"""The kvrail client for Python: a connection to the node's kvraild, over libkvrail.so (the C ABI
of client/c_api/kvrail.h). Its parts: host_buffer (shared host memory), regions (Region and the
registration calls), transfers (Transfer and the transfer calls), completions (awaits on the
completion queue's eventfd), _lib (the library and its signatures).

Thread contract: a Client may be used from any thread, concurrently (the C library is
thread-safe and ctypes releases the GIL around each call, so a blocking wait does not hold up
other Python threads). HostBuffer, Region and Transfer objects are thin handles: safe to share,
with the caller ordering its own reads and writes of buffer memory against transfers.
"""
from __future__ import annotations

import ctypes
import time
import weakref
from typing import Callable, Dict, Iterator, Optional, Sequence, Union

from kvrail._lib import SESSION_LOST_FN, check, lib, out_bytes, take_bytes
from kvrail.errors import KvrailError, SessionLostError, error_for
from kvrail.host_buffer import HostBuffer
from kvrail.proto import admin_pb2, transfer_pb2
from kvrail.prepared import PreparedCalls
from kvrail.regions import Region, RegionCalls
from kvrail.transfers import (Transfer, TransferCalls, TransferState, is_final, poll,
                              wait_all)


class Client(RegionCalls, TransferCalls, PreparedCalls):
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
        # TransferCalls' state: the specs the library keeps parsed, by shape (transfers._KeptSpec),
        # the completion waiter of each event loop, and the token of the one armed now (a
        # transfer submitted meanwhile records it).
        self._specs: Dict[tuple, object] = {}
        self._waiters: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._armed: Optional[object] = None

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
            self._specs.clear()  # frees the kept specs (a submit in progress holds its own)

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


def connect(target: Optional[str] = None, probe_timeout: float = 3.0) -> Client:
    """Connects to kvraild: `target` a unix socket path ("unix:PATH" too) or "host:port"; None:
    $KVRAIL_SOCKET, else /run/kvrail/kvrail.sock. UnavailableError when it does not answer."""
    return Client(target, probe_timeout)


__all__ = ["Client", "HostBuffer", "Region", "Transfer", "TransferState", "connect", "poll",
           "wait_all", "is_final", "KvrailError"]

"""Loads libkvrail.so (the C ABI of client/c_api/kvrail.h) and declares its functions.

Where the library is looked for, first match wins:
  1. $KVRAIL_LIB: the path of the file (an error if it is set and does not load);
  2. next to this package: kvrail/libkvrail.so (what `pip install` of the tree puts there);
  3. the system's search path (ld.so: LD_LIBRARY_PATH, /etc/ld.so.conf, ...): "libkvrail.so".
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Optional

from kvrail.errors import KvrailError, error_for

ABI_VERSION = 1  # KVRAIL_ABI_VERSION of the header this module was written against

_c_client = ctypes.c_void_p
_c_buffer = ctypes.c_void_p
_u8p = ctypes.POINTER(ctypes.c_uint8)
_u8pp = ctypes.POINTER(_u8p)
_sizep = ctypes.POINTER(ctypes.c_size_t)
_u64p = ctypes.POINTER(ctypes.c_uint64)
_i32p = ctypes.POINTER(ctypes.c_int32)
# kvrail_session_lost_fn: void (*)(void* user, int code, const char* message)
SESSION_LOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)


class PagedLayoutStruct(ctypes.Structure):
    """kvrail_paged_layout (struct_size first, as the ABI wants)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("num_layers", ctypes.c_uint32),
        ("num_parts", ctypes.c_uint32),
        ("num_blocks", ctypes.c_uint32),
        ("tokens_per_block", ctypes.c_uint32),
        ("num_heads", ctypes.c_uint32),
        ("head_dim", ctypes.c_uint32),
        ("dtype", ctypes.c_int32),
        ("order", ctypes.c_int32),
        ("layer_stride", ctypes.c_uint64),
        ("part_stride", ctypes.c_uint64),
        ("block_stride", ctypes.c_uint64),
        ("token_stride", ctypes.c_uint64),
        ("head_stride", ctypes.c_uint64),
        ("offset_bytes", ctypes.c_uint64),
    ]


LAYOUT_PER_LAYER = 1  # KVRAIL_LAYOUT_PER_LAYER


class SubmittedStruct(ctypes.Structure):
    """kvrail_submitted: a submit's answer (kvrail_submit_blocks_short)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("tiles_total", ctypes.c_uint32),
        ("transfer_id", ctypes.c_uint64),
        ("bytes_total", ctypes.c_uint64),
        ("deduplicated", ctypes.c_uint32),
        ("followed", ctypes.c_uint32),
    ]


class TransferEndStruct(ctypes.Structure):
    """kvrail_transfer_end: a transfer's end (kvrail_wait_end_short, kvrail_take_ends)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("state", ctypes.c_int32),
        ("transfer_id", ctypes.c_uint64),
        ("error_code", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("bytes_total", ctypes.c_uint64),
        ("bytes_done", ctypes.c_uint64),
        ("finished_unix_us", ctypes.c_uint64),
    ]


END_STATUS_INLINE = 64  # KVRAIL_END_STATUS_INLINE


class SpecSubmitStruct(ctypes.Structure):
    """kvrail_spec_submit: kvrail_submit_spec's arguments and answer (the end too, when it came
    before the answer)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("src_count", ctypes.c_uint32),
        ("dst_count", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("spec", ctypes.c_void_p),
        ("ids", ctypes.c_void_p),
        ("submitted", SubmittedStruct),
        ("end", TransferEndStruct),
        ("end_len", ctypes.c_uint32),
        ("end_status", ctypes.c_uint8 * END_STATUS_INLINE),
    ]


STATUS_INLINE = 240  # KVRAIL_STATUS_INLINE


class EndWaitStruct(ctypes.Structure):
    """kvrail_end_wait: kvrail_wait_end_into's arguments and answer."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("len", ctypes.c_uint32),
        ("client", ctypes.c_void_p),
        ("transfer_id", ctypes.c_uint64),
        ("timeout_ms", ctypes.c_int64),
        ("heap", ctypes.c_void_p),
        ("data", ctypes.c_uint8 * STATUS_INLINE),
    ]


END_MORE = 1  # KVRAIL_END_MORE: the whole status says more than the end's fields
END_ASK = 2  # KVRAIL_END_ASK: kvrail_take_ends could not read it without a call

# name: (restype, argtypes). int-returning functions return the gRPC code.
_SIGNATURES = {
    "kvrail_abi_version": (ctypes.c_uint32, []),
    "kvrail_last_error_message": (ctypes.c_char_p, []),
    "kvrail_last_error_code": (ctypes.c_int, []),
    "kvrail_free": (None, [ctypes.c_void_p]),
    "kvrail_connect": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(_c_client)]),
    "kvrail_close": (None, [_c_client]),
    "kvrail_session_id": (ctypes.c_int, [_c_client, _u64p]),
    "kvrail_host_buffer_create": (ctypes.c_int, [ctypes.c_uint64, ctypes.c_char_p,
                                                 ctypes.POINTER(_c_buffer)]),
    "kvrail_host_buffer_free": (None, [_c_buffer]),
    "kvrail_host_buffer_data": (ctypes.c_void_p, [_c_buffer]),
    "kvrail_host_buffer_size": (ctypes.c_uint64, [_c_buffer]),
    "kvrail_register_host_buffer": (ctypes.c_int, [_c_client, _c_buffer, ctypes.c_char_p,
                                                   ctypes.c_size_t, _u64p, _u8pp, _sizep]),
    "kvrail_register_host_fd": (ctypes.c_int, [_c_client, ctypes.c_int, ctypes.c_uint64,
                                               ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t,
                                               _u64p, _u8pp, _sizep]),
    "kvrail_export_region": (ctypes.c_int, [_c_client, ctypes.c_uint64, ctypes.c_char_p, _u8pp,
                                            _sizep]),
    "kvrail_register_region": (ctypes.c_int, [_c_client, ctypes.c_char_p, ctypes.c_size_t, _u64p,
                                              _u8pp, _sizep]),
    "kvrail_unregister_region": (ctypes.c_int, [_c_client, ctypes.c_uint64]),
    "kvrail_paged_layout_bytes": (ctypes.c_int, [ctypes.POINTER(PagedLayoutStruct), _u64p]),
    "kvrail_paged_layout_check": (ctypes.c_int, [ctypes.POINTER(PagedLayoutStruct),
                                                 ctypes.c_uint64, ctypes.c_uint32, _u64p]),
    "kvrail_register_paged_host": (ctypes.c_int, [_c_client, _c_buffer,
                                                  ctypes.POINTER(PagedLayoutStruct), ctypes.c_int,
                                                  ctypes.c_char_p, _u64p]),
    "kvrail_register_cuda": (ctypes.c_int, [_c_client, ctypes.c_void_p, ctypes.c_uint64,
                                            ctypes.c_char_p, ctypes.c_size_t, _u64p, _u8pp,
                                            _sizep]),
    "kvrail_register_cuda_layers": (ctypes.c_int, [_c_client, ctypes.POINTER(ctypes.c_void_p),
                                                   ctypes.c_size_t, ctypes.c_uint64,
                                                   ctypes.c_char_p, ctypes.c_size_t, _u64p, _u8pp,
                                                   _sizep]),
    "kvrail_register_host_layers": (ctypes.c_int, [_c_client, ctypes.POINTER(ctypes.c_void_p),
                                                   _u64p, ctypes.c_size_t, ctypes.c_char_p,
                                                   ctypes.c_size_t, _u64p, _u8pp, _sizep]),
    "kvrail_submit": (ctypes.c_int, [_c_client, ctypes.c_char_p, ctypes.c_size_t, _u64p, _u8pp,
                                     _sizep]),
    "kvrail_submit_batch": (ctypes.c_int, [_c_client, ctypes.POINTER(ctypes.c_char_p),
                                           ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t,
                                           _u64p, _i32p]),
    "kvrail_submit_blocks": (ctypes.c_int, [_c_client, ctypes.c_char_p, ctypes.c_size_t,
                                            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                            ctypes.c_size_t, _u64p, _u8pp, _sizep]),
    "kvrail_submit_blocks_short": (ctypes.c_int, [_c_client, ctypes.c_char_p, ctypes.c_size_t,
                                                  ctypes.c_void_p, ctypes.c_size_t,
                                                  ctypes.c_void_p, ctypes.c_size_t,
                                                  ctypes.c_void_p]),
    # The hot path's calls take one argument (ctypes converts each one on every call): a
    # struct in the caller's memory with the arguments and the answer.
    "kvrail_spec_create": (ctypes.c_int, [_c_client, ctypes.c_char_p, ctypes.c_size_t,
                                          ctypes.POINTER(ctypes.c_void_p)]),
    "kvrail_submit_spec": (ctypes.c_int, [ctypes.c_void_p]),
    "kvrail_spec_free": (ctypes.c_int, [ctypes.c_void_p]),
    "kvrail_wait_end_into": (ctypes.c_int, [ctypes.c_void_p]),
    "kvrail_prepare": (ctypes.c_int, [_c_client, ctypes.c_char_p, ctypes.c_size_t,
                                      ctypes.c_uint32, ctypes.c_uint32,
                                      ctypes.POINTER(ctypes.c_void_p), _u8pp, _sizep]),
    "kvrail_post": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                   ctypes.c_void_p, ctypes.c_size_t, _u64p, _u8pp, _sizep]),
    "kvrail_prepared_release": (ctypes.c_int, [ctypes.c_void_p]),
    "kvrail_wait": (ctypes.c_int, [_c_client, ctypes.c_uint64, ctypes.c_int64, _i32p, _u8pp,
                                   _sizep]),
    "kvrail_wait_end": (ctypes.c_int, [_c_client, ctypes.c_uint64, ctypes.c_int64, _i32p, _u8pp,
                                       _sizep]),
    "kvrail_wait_end_short": (ctypes.c_int, [_c_client, ctypes.c_uint64, ctypes.c_int64,
                                             ctypes.c_void_p, _u8pp, _sizep]),
    "kvrail_get": (ctypes.c_int, [_c_client, ctypes.c_uint64, _i32p, _u8pp, _sizep]),
    "kvrail_cancel": (ctypes.c_int, [_c_client, ctypes.c_uint64, _i32p, _u8pp, _sizep]),
    "kvrail_mark_ready": (ctypes.c_int, [_c_client, ctypes.c_uint64, ctypes.c_uint32,
                                         ctypes.c_uint32]),
    "kvrail_poll": (ctypes.c_int, [_c_client, _u64p, ctypes.c_size_t, _i32p, _i32p]),
    "kvrail_completion_fd": (ctypes.c_int, [_c_client, ctypes.POINTER(ctypes.c_int)]),
    "kvrail_arm_completions": (ctypes.c_int, [_c_client, ctypes.c_int]),
    "kvrail_completion_follows": (ctypes.c_int, [_c_client, ctypes.c_uint64,
                                                 ctypes.POINTER(ctypes.c_int)]),
    "kvrail_take_completions": (ctypes.c_int, [_c_client, _u64p, ctypes.c_size_t, _sizep]),
    "kvrail_take_ends": (ctypes.c_int, [_c_client, ctypes.c_void_p, ctypes.c_size_t, _sizep]),
    "kvrail_list_regions": (ctypes.c_int, [_c_client, _u8pp, _sizep]),
    "kvrail_list_transfers": (ctypes.c_int, [_c_client, _i32p, ctypes.c_size_t, ctypes.c_uint32,
                                             _u8pp, _sizep]),
    "kvrail_get_stats": (ctypes.c_int, [_c_client, _u8pp, _sizep]),
    "kvrail_list_transfers_filtered": (ctypes.c_int, [_c_client, ctypes.c_char_p, ctypes.c_size_t,
                                                      _u8pp, _sizep]),
    "kvrail_create_grant": (ctypes.c_int, [_c_client, ctypes.c_uint64, ctypes.c_int32,
                                           ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32,
                                           _u8pp, _sizep]),
    "kvrail_revoke_grant": (ctypes.c_int, [_c_client, ctypes.c_char_p]),
    "kvrail_poll_notifications": (ctypes.c_int, [_c_client, ctypes.c_uint32, ctypes.c_int64,
                                                 _u8pp, _sizep]),
    "kvrail_session_lost": (ctypes.c_int, [_c_client, ctypes.POINTER(ctypes.c_int)]),
    "kvrail_reset_session": (ctypes.c_int, [_c_client]),
    "kvrail_on_session_lost": (ctypes.c_int, [_c_client, ctypes.c_void_p, ctypes.c_void_p]),
    "kvrail_cuda_flags_map": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                             ctypes.POINTER(ctypes.c_void_p)]),
    "kvrail_cuda_flags_free": (None, [ctypes.c_void_p]),
    "kvrail_cuda_flags_signal": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                                                ctypes.c_uint32]),
    "kvrail_cuda_flags_wait": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                                              ctypes.c_uint32]),
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None


def _candidates() -> list:
    env = os.environ.get("KVRAIL_LIB", "")
    if env:
        return [env]
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libkvrail.so")
    return [here] if os.path.exists(here) else ["libkvrail.so"]


def lib() -> ctypes.CDLL:
    """The loaded library (loaded and checked on first use; thread-safe)."""
    global _lib
    loaded = _lib  # once set, never changes: no lock on the hot path
    if loaded is not None:
        return loaded
    with _lock:
        if _lib is not None:
            return _lib
        errors = []
        loaded = None
        for path in _candidates():
            try:
                loaded = ctypes.CDLL(path)
                break
            except OSError as e:
                errors.append(f"{path}: {e}")
        if loaded is None:
            raise KvrailError(9, "libkvrail.so not found (set $KVRAIL_LIB, or install the package "
                                 "with the library next to it): " + "; ".join(errors))
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(loaded, name)
            fn.restype = restype
            fn.argtypes = argtypes
        version = loaded.kvrail_abi_version()
        if version != ABI_VERSION:
            raise KvrailError(9, f"libkvrail.so implements ABI {version}, this package needs "
                                 f"{ABI_VERSION}")
        _lib = loaded
        return _lib


def check(code: int) -> None:
    """Raises the KvrailError of a non-zero code, with the thread's last error message.

    ctypes releases the GIL around the call and reads the message on the same OS thread right
    after it, so the thread-local message is the call's own.
    """
    if code != 0:
        message = lib().kvrail_last_error_message()
        raise error_for(code, message.decode("utf-8", "replace") if message else "")


def take_bytes(data: "_u8p", size: int) -> bytes:
    """Copies library-allocated bytes into Python and frees them."""
    if not data:
        return b""
    try:
        return ctypes.string_at(data, size)
    finally:
        lib().kvrail_free(data)


def out_bytes() -> tuple:
    """An (uint8_t*, size_t) out-pair for the byte-returning calls."""
    return _u8p(), ctypes.c_size_t(0)

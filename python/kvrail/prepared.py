"""Prepared transfers: a transfer's shape kvraild validated and planned once, posted many times
with new block ids (Client.prepare). A post checks only its ids, and that the regions and grants
still hold; it is answered as a submit and returns a Transfer.

    with client.prepare(src, dst, src_block_count=2) as shape:
        for src_blocks, dst_blocks in work:
            shape.post(src_blocks, dst_blocks).wait()
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Optional, Sequence, Union

from kvrail._lib import check, lib, out_bytes, take_bytes
from kvrail.errors import FailedPreconditionError, StatusCode
from kvrail.proto import transfer_pb2
from kvrail.regions import Region
from kvrail.transfers import Transfer, _address, _id_array

if TYPE_CHECKING:
    from kvrail.client import Client


class PreparedTransfer:
    """A prepared transfer of one Client (Client.prepare). A context manager: leaving it (or
    release()) frees the daemon's prepared transfer; transfers posted from it run on. It also
    ends with its client's session and with either region's unregistration (a post then raises
    NotFoundError naming prepared_id)."""

    def __init__(self, client: "Client", handle: int, response: bytes) -> None:
        self._client = client
        self._handle: Optional[int] = handle
        self.info = transfer_pb2.PrepareTransferResponse.FromString(response)
        self.id: int = self.info.prepared_id

    @property
    def src_block_count(self) -> int:
        return self.info.src_block_count

    @property
    def dst_block_count(self) -> int:
        return self.info.dst_block_count

    @property
    def released(self) -> bool:
        return self._handle is None

    def post(self, src_blocks: Sequence[int], dst_blocks: Sequence[int]) -> "Transfer":
        """One transfer of this shape moving `src_blocks` into `dst_blocks` (exactly
        src_block_count and dst_block_count ids; a numpy array or any sequence of ints). A bad
        id raises InvalidArgumentError naming it ("post.src_block_ids[3]: ...")."""
        if self._handle is None:
            raise FailedPreconditionError(
                StatusCode.FAILED_PRECONDITION,
                f"prepared_id: prepared transfer {self.id} was released")
        src_ids = _id_array(src_blocks, "src_blocks")
        dst_ids = _id_array(dst_blocks, "dst_blocks")
        self._client._armed_now()
        transfer_id = ctypes.c_uint64()
        response, response_len = out_bytes()
        check(lib().kvrail_post(self._handle, _address(src_ids), len(src_ids), _address(dst_ids),
                                len(dst_ids), ctypes.byref(transfer_id), ctypes.byref(response),
                                ctypes.byref(response_len)))
        return Transfer(self._client, transfer_id.value,
                        take_bytes(response, response_len.value))

    def release(self) -> None:
        """Frees the daemon's prepared transfer. Idempotent; one that already ended (its region
        unregistered, its session gone) is released without error."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            check(lib().kvrail_prepared_release(handle))

    def __enter__(self) -> "PreparedTransfer":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        # A handle dropped unreleased: freed here, errors ignored (the client may be closed).
        if getattr(self, "_handle", None) is not None:
            try:
                lib().kvrail_prepared_release(self._handle)
            except Exception:  # noqa: BLE001 - nothing to report to at collection time
                pass
            self._handle = None



class PreparedCalls:
    """Client's prepare(), a mixin of Client (which supplies _h)."""

    def prepare(self, src: Union[Region, int], dst: Union[Region, int], src_block_count: int,
                dst_block_count: int = 0, **fields) -> "PreparedTransfer":
        """Prepares a paged transfer's shape from `src` into `dst` (other TransferSpec fields by
        keyword, as transfer(); no block ids) for posts of `src_block_count` source and
        `dst_block_count` destination ids (0: as many as the tokens need). The daemon validates
        and plans it once; each PreparedTransfer.post(src_blocks, dst_blocks) then checks only
        its ids. A context manager that releases it."""
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


__all__ = ["PreparedCalls", "PreparedTransfer"]

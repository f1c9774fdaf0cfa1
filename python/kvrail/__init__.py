"""kvrail for Python: register memory with the node's kvraild and move KV cache with it.

    import kvrail
    with kvrail.connect("/run/kvrail/kvrail.sock") as client:
        ...

Pure Python over libkvrail.so (the C ABI, client/c_api/kvrail.h); see docs/python.md.
"""
from kvrail.client import (Client, HostBuffer, Region, Transfer, connect, is_final, poll,
                           wait_all)
from kvrail.errors import (DeadlineExceededError, FailedPreconditionError, InvalidArgumentError,
                           InvalidLayoutError, KvrailError, NotFoundError,
                           ResourceExhaustedError, SessionLostError, StatusCode,
                           TransferFailedError, UnavailableError)
from kvrail.flags import FlagArray, GpuFlags
from kvrail.layouts import KV_LAYOUTS, PagedLayout, layout_from_strides
from kvrail.proto import admin_pb2, region_pb2, transfer_pb2

__all__ = [
    "Client", "HostBuffer", "Region", "Transfer", "connect", "is_final", "poll", "wait_all",
    "KvrailError", "StatusCode", "InvalidArgumentError", "InvalidLayoutError", "NotFoundError",
    "FailedPreconditionError", "UnavailableError", "DeadlineExceededError",
    "ResourceExhaustedError", "SessionLostError", "TransferFailedError", "KV_LAYOUTS", "PagedLayout",
    "layout_from_strides", "FlagArray", "GpuFlags", "admin_pb2", "region_pb2", "transfer_pb2",
]

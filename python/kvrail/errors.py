"""The error model: every failure is a KvrailError carrying the gRPC status code and the daemon's
message, which names the offending field ("spec.dst.block_ids[3]: block 4096 out of range
[0, 4096)"). Common codes have subclasses, so callers can catch just those.
"""
from __future__ import annotations

import enum
from typing import Dict, Type


class StatusCode(enum.IntEnum):
    """gRPC status codes (google.rpc.Code numbering); the C ABI's return values."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class KvrailError(Exception):
    """A failed kvrail call. `code` is a StatusCode, `message` the daemon's (or library's) text."""

    def __init__(self, code: int, message: str) -> None:
        try:
            self.code: StatusCode = StatusCode(code)
        except ValueError:
            self.code = StatusCode.UNKNOWN
        self.message: str = message
        super().__init__(f"{self.code.name}: {message}")

    @property
    def code_name(self) -> str:
        """The code's name, e.g. "INVALID_ARGUMENT"."""
        return self.code.name


class InvalidArgumentError(KvrailError):
    """INVALID_ARGUMENT: a spec or argument the daemon or library rejected; the message names it."""


class InvalidLayoutError(InvalidArgumentError, ValueError):
    """INVALID_ARGUMENT from the paged-layout validator kvraild itself uses (through the C ABI,
    kvrail_paged_layout_check): the message names the PagedKvLayout field ("layout.num_parts:
    ..."). Also a ValueError, as layout errors were before the library judged them."""


class NotFoundError(KvrailError):
    """NOT_FOUND: an unknown region or transfer id (or one aged out of the history)."""


class FailedPreconditionError(KvrailError):
    """FAILED_PRECONDITION: e.g. a host buffer over a TCP connection, a device not served."""


class UnavailableError(KvrailError):
    """UNAVAILABLE: the daemon does not answer (not running, wrong socket)."""


class DeadlineExceededError(KvrailError):
    """DEADLINE_EXCEEDED."""


class ResourceExhaustedError(KvrailError):
    """RESOURCE_EXHAUSTED: the daemon's limits (queue, regions) were reached."""


class SessionLostError(FailedPreconditionError):
    """FAILED_PRECONDITION "session lost: ...": kvraild stopped or restarted, so every region (and
    transfer) of this client's session is gone. Client.recover() opens a new session and
    registers the client's live regions again."""


class TransferFailedError(KvrailError):
    """A transfer ended FAILED or CANCELLED; `status` is its final TransferStatus."""

    def __init__(self, code: int, message: str, status=None) -> None:
        super().__init__(code, message)
        self.status = status


_BY_CODE: Dict[int, Type[KvrailError]] = {
    StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    StatusCode.NOT_FOUND: NotFoundError,
    StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    StatusCode.UNAVAILABLE: UnavailableError,
    StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
}


SESSION_LOST_PREFIX = "session lost:"


def error_for(code: int, message: str) -> KvrailError:
    """The KvrailError (subclass) for a gRPC code."""
    if code == StatusCode.FAILED_PRECONDITION and message.startswith(SESSION_LOST_PREFIX):
        return SessionLostError(code, message)
    return _BY_CODE.get(code, KvrailError)(code, message)

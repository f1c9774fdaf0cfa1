"""Regions: Region, the handle of a registered region, and RegionCalls, the Client's calls that
register host memory (buffers, fds, arrays, per-layer), CUDA memory and specs as regions.

Thread contract: as the Client's (the calls may run on any thread, concurrently); a Region is a
thin handle, safe to share.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import stat
import weakref
from typing import TYPE_CHECKING, Callable, Optional, Sequence, Tuple, Union

from kvrail._lib import check, lib, out_bytes, take_bytes
from kvrail.errors import InvalidArgumentError, KvrailError, StatusCode
from kvrail.host_buffer import HostBuffer
from kvrail.layouts import PagedLayout
from kvrail.proto import region_pb2, transfer_pb2

if TYPE_CHECKING:
    from kvrail.client import Client


class Region:
    """A registered region. Lives as long as its client's session, or until unregister()
    (what leaving a `with` block does)."""

    def __init__(self, client: "Client", info, keepalive=None, redo=None) -> None:
        self._client = client
        self.info = info  # kvrail.v1.RegionInfo (sets _id)
        self._keepalive = keepalive  # e.g. the tensor whose memory the region is
        self._unregistered = False
        # Registers the same memory again and returns the new RegionInfo (Client.recover).
        self._redo: Optional[Callable[[], object]] = redo

    @property
    def info(self):
        return self._info

    @info.setter
    def info(self, info) -> None:
        self._info = info
        # The id as a plain int: a submit reads it without a message field access.
        self._id: int = info.region_id

    @property
    def id(self) -> int:
        return self._id

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


class RegionCalls:
    """The Client's region calls (a base of Client, which provides _h, _track and
    _message_call)."""

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


__all__ = ["Region", "RegionCalls"]

"""kvrail as a vLLM KV connector (vLLM's KVConnectorBase_V1), selected by configuration:

    --kv-transfer-config '{"kv_connector": "KvrailConnector",
                           "kv_connector_module_path": "kvrail.vllm", "kv_role": "kv_both"}'

Prefill/decode disaggregation with the decode pulling (vLLM's usual P/D order, the kv_transfer_params
handshake of its NIXL connector):

- The router sends the prompt to the prefill instance with kv_transfer_params
  {"do_remote_decode": true}. When it finishes (max_tokens 1), request_finished keeps its blocks
  and returns kv_transfer_params naming the prefill's kvrail node, region, read grant, layer
  ready flags and block ids ({"do_remote_prefill": true, "remote_block_ids": [...],
  "remote_num_tokens": n, "kvrail": {...}}).
- The router sends the same prompt with those params to the decode instance. Its scheduler asks
  for the tokens it does not hold locally (a local prefix hit is not pulled again); its worker
  submits one kvrail transfer per request (src: the prefill's blocks, dst: its own, every layer,
  layouts and block sizes converted by the daemon) with the prefill's request id as the
  notification.
- The notification tells the prefill worker (the owner of the source region) that the decode is
  done with the blocks; its get_finished reports the request as sent and vLLM frees the blocks.
  A decode that never pulls (lost, crashed, never routed) frees them too: after
  `kvrail_blocks_ttl_s` seconds (kv_connector_extra_config; default 120) the prefill worker
  reports the request as sent. A decode that ends a request without pulling (aborted before it
  was scheduled, a full local prefix hit) releases the prefill's blocks at once: it submits a
  layer-wise transfer of one block into a scratch region of its own and cancels it before any
  layer is marked ready, so no byte moves and the cancellation's notification reaches the
  prefill.
- Layer streaming: the prefill worker keeps one 32-bit ready flag per layer in shared memory.
  save_kv_layer marks a layer written for the current step (on the CUDA stream for GPU caches),
  wait_for_save marks every layer (it is called every step, also when CUDA graphs skipped
  save_kv_layer). With `kvrail_layer_streaming` on the prefill, a decode's pull waits, per layer,
  for the step that last wrote the request (TransferSpec.ready_flags), so a pull that arrives
  early streams layers as they are written.

Memory: vLLM 0.33's KV cache is one allocation viewed per layer as [blocks, heads, tokens,
K|V content] ([B, H, N, C], C = head_size + head_size_v elements, the physical order given by the
KV cache layout: LBNHC, LBHNC, ...). The connector describes it to kvraild with explicit strides
(one region over every layer when the layers are evenly spaced, else a per-layer region): CUDA
caches through CUDA IPC (Client.register_cuda / register_cuda_layers), CPU caches through the
engine's own shared memory (Client.register_host_array). Nothing is copied at registration.

What is not supported (see docs/integrations.md): a prefill and a decode with different
tensor-parallel sizes, hybrid (several KV cache groups) and MLA-with-separate-rope models, and
pulls from another node (the daemon refuses a remote source; the connector reports the load as
failed and vLLM recomputes or fails it by kv_load_failure_policy).

Thread contract: vLLM calls a connector from one thread per role (the engine core's scheduler
thread, or the worker's execute thread); the connector keeps no locks and must not be shared
across threads beyond that.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorHandshakeMetadata, KVConnectorMetadata, KVConnectorRole,
    KVConnectorTransferResults, KVConnectorWorkerMetadata)

import kvrail
from kvrail.layouts import PagedLayout, dtype_of
from kvrail.proto import region_pb2, transfer_pb2

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

# Under vLLM's logger, so `vllm serve` shows these lines with its own.
logger = logging.getLogger("vllm.kvrail")

# kv_connector_extra_config keys.
EXTRA_SOCKET = "kvrail_socket"  # kvraild's socket (default: $KVRAIL_SOCKET, then the system's)
EXTRA_TTL = "kvrail_blocks_ttl_s"  # how long a prefill keeps blocks nobody pulled
EXTRA_PULL_TIMEOUT = "kvrail_pull_timeout_s"  # a pull's deadline (TransferSpec.timeout_ms)
# true: pulls wait per layer on the prefill's layer ready flags. Off by default: vLLM hands out a
# request's kv_transfer_params only after the step that wrote its KV completed (its sampled token
# is read after the last layer in stream order), and on the host engine the flag-gated pull cost
# 6-16 ms more per 125 MiB request (docs/benchmarks.md). On for a router that forwards params
# before then.
EXTRA_STREAMING = "kvrail_layer_streaming"
DEFAULT_TTL_S = 120.0
DEFAULT_PULL_TIMEOUT_S = 60.0
# A pull must be over this long before the prefill's blocks expire (kvrail_blocks_ttl_s): a pull
# later than that is not started (the prompt is computed locally), and a pull's deadline ends it
# this long before the expiry, so the prefill never frees blocks a pull still reads.
EXPIRY_MARGIN_S = 0.5
# Grants are minted for a day (the daemon's maximum) and renewed after half of it.
GRANT_TTL_S = 86400.0
GRANT_RENEW_S = GRANT_TTL_S / 2

_PARAMS_KEY = "kvrail"  # kv_transfer_params["kvrail"]: what the decode needs to pull


@dataclasses.dataclass
class KvrailHandshake(KVConnectorHandshakeMetadata):
    """What one worker (TP rank) publishes to its scheduler: where its KV cache is and the grants
    letting a decode read it. Plain data (vLLM moves it between processes)."""

    node_id: str
    region_id: int
    grant: str
    flags_region_id: int
    flags_grant: str
    num_layers: int
    # Tokens per kvrail block (vLLM's kernel block) and kernel blocks per vLLM block.
    tokens_per_block: int
    blocks_per_block: int
    grant_expires_unix: float

    def as_params(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class PullOrder:
    """One request's pull (or, with `release`, the message that frees the prefill's blocks
    without a pull), from the decode's scheduler to its workers."""

    req_id: str
    remote_request_id: str
    params: Dict[str, Any]  # the request's kv_transfer_params
    local_block_ids: List[int]  # vLLM block ids of the decode, the whole request
    skip_tokens: int  # tokens held locally (prefix hit): the pull starts at this token
    num_tokens: int  # tokens to pull
    release: bool = False


class KvrailConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> worker, one per step."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch  # this step's number: the value of the layer ready flags it writes
        self.pulls: List[PullOrder] = []
        self.cancels: Set[str] = set()  # decode requests aborted while their pull runs
        self.sends: Dict[str, float] = {}  # prefill requests holding blocks -> seconds to keep
        self.in_batch: Set[str] = set()  # prefill requests that may be pulled once finished
        self.not_processed: Set[str] = set()  # prefill requests that ended without params


class KvrailWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler: renewed handshakes (new grants), keyed by (pp_rank, tp_rank)."""

    def __init__(self, handshakes: Dict[Tuple[int, int], KvrailHandshake]) -> None:
        self.handshakes = dict(handshakes)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if isinstance(other, KvrailWorkerMetadata):
            self.handshakes.update(other.handshakes)
        return self


def _is_pull(params: Optional[Dict[str, Any]]) -> bool:
    return bool(params) and bool(params.get("do_remote_prefill")) and _PARAMS_KEY in params \
        and bool(params.get("remote_block_ids"))


class KvrailConnector(KVConnectorBase_V1):
    """vLLM's KV connector over kvraild. One instance per role: SCHEDULER in the engine core,
    WORKER in each worker process (which holds the kvrail client)."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig") -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self._scheduler: Optional[_SchedulerSide] = None
        self._worker: Optional[_WorkerSide] = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = _SchedulerSide(vllm_config, extra)
        else:
            self._worker = _WorkerSide(vllm_config, kv_cache_config, extra)

    # --- scheduler side ----------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        return self._sched().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        self._sched().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        return self._sched().build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        self._sched().update_connector_output(connector_output)

    def request_finished(self, request: "Request",
                         block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        return self._sched().request_finished(request, block_ids)

    def set_xfer_handshake_metadata(self, metadata: Dict[int, KVConnectorHandshakeMetadata]
                                    ) -> None:
        self._sched().set_handshakes({(0, rank): m for rank, m in metadata.items()})

    def set_xfer_handshake_metadata_pp_aware(
            self, metadata: Dict[Tuple[int, int], KVConnectorHandshakeMetadata]) -> None:
        self._sched().set_handshakes(metadata)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> Optional[str]:
        return None  # kvraild converts block sizes and token/head orders itself

    # --- worker side -------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        self._work().register_kv_caches(kv_caches)

    def get_handshake_metadata(self) -> Optional[KVConnectorHandshakeMetadata]:
        return self._work().handshake()

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvrailConnectorMetadata)
        self._work().start_load_kv(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Pulls are asynchronous (the request waits in WAITING_FOR_REMOTE_KVS until get_finished
        # reports it), so no forward pass reads a layer that is still arriving.
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        worker = self._work()
        if worker.streaming and self.has_connector_metadata():
            worker.mark_layer(layer_name, self._get_connector_metadata().epoch)

    def wait_for_save(self) -> None:
        worker = self._work()
        if worker.streaming and self.has_connector_metadata():
            worker.mark_all_layers(self._get_connector_metadata().epoch)

    def get_finished(self, finished_req_ids: Set[str]
                     ) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        results = self._work().transfer_results()
        return results.finished_sending or None, results.finished_recving or None

    def get_transfer_results(self, finished_req_ids: Set[str]) -> KVConnectorTransferResults:
        return self._work().transfer_results()

    def build_connector_worker_meta(self) -> Optional[KVConnectorWorkerMetadata]:
        return self._work().renewed_handshake()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()

    # --- helpers -----------------------------------------------------------------------------
    def _sched(self) -> "_SchedulerSide":
        if self._scheduler is None:
            raise RuntimeError("KvrailConnector: a scheduler-side method called on a worker")
        return self._scheduler

    def _work(self) -> "_WorkerSide":
        if self._worker is None:
            raise RuntimeError("KvrailConnector: a worker-side method called on the scheduler")
        return self._worker


class _SchedulerSide:
    """The engine core's half: decides what each request pulls or keeps, and hands the workers
    their orders in the step's metadata. No kvrail client (it never touches memory)."""

    def __init__(self, vllm_config: "VllmConfig", extra: Dict[str, Any]) -> None:
        self.block_size = int(vllm_config.cache_config.block_size)
        self.engine_id = str(vllm_config.kv_transfer_config.engine_id)
        self.tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        self.ttl = float(extra.get(EXTRA_TTL, DEFAULT_TTL_S))
        self.streaming = _flag(extra.get(EXTRA_STREAMING, False), EXTRA_STREAMING)
        if not self.ttl > 0:
            raise ValueError(f"kv_connector_extra_config.{EXTRA_TTL}: {self.ttl} must be > 0")
        self.handshakes: Dict[Tuple[int, int], KvrailHandshake] = {}
        self.epoch = 0
        self.last_epoch: Dict[str, int] = {}  # request -> the last step that computed it
        self.pulling: Set[str] = set()  # decode requests whose pull was ordered, not finished
        self.warned_nodes: Set[str] = set()
        self._next = KvrailConnectorMetadata(0)

    def set_handshakes(self, metadata) -> None:
        for key, value in metadata.items():
            if not isinstance(value, KvrailHandshake):
                raise ValueError(f"handshake metadata[{key}]: a {type(value).__name__}, not a "
                                 "KvrailHandshake (another connector's worker?)")
            self.handshakes[tuple(key)] = value

    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int) -> Tuple[int, bool]:
        params = request.kv_transfer_params
        if not _is_pull(params):
            return 0, False
        remote = min(int(params.get("remote_num_tokens") or 0), request.num_prompt_tokens)
        count = remote - num_computed_tokens
        if count <= 0:
            return 0, False
        # A pull starts at the first token of a prefill block: a local hit that ends inside one
        # (a decode block size smaller than the prefill's) is recomputed instead.
        if num_computed_tokens % int(params.get("remote_block_size") or 1):
            return 0, False
        if not self._same_node(params) or _time_left(params) <= 0:
            return 0, False
        return count, True

    def _same_node(self, params: Dict[str, Any]) -> bool:
        """Whether the prefill's KV is on this decode's node. kvraild moves KV across nodes only
        as a push from the source node (Transfer.ExportRegion, then dst.node_id), which a decode's pull
        cannot issue: a prompt prefilled on another node is computed here instead."""
        ranks = params[_PARAMS_KEY].get("ranks") or [{}]
        remote = str(ranks[0].get("node_id", ""))
        local = next(iter(self.handshakes.values())).node_id if self.handshakes else remote
        if remote == local:
            return True
        if remote not in self.warned_nodes:
            self.warned_nodes.add(remote)
            logger.warning("kvrail: requests prefilled on node %r are computed again on this "
                           "node (%r): the kvrail connector pulls within a node only", remote,
                           local)
        return False

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        if not params:
            return
        if params.get("do_remote_decode"):
            self._next.in_batch.add(request.request_id)
            return
        if not _is_pull(params):
            return
        # Called again once the pull is done (with the blocks for the rest): order one pull only.
        params["do_remote_prefill"] = False
        if num_external_tokens <= 0 and (not self._same_node(params)
                                         or _time_left(params) <= 0):
            return  # no release either: the prefill's blocks go at its TTL
        local = list(blocks.get_block_ids()[0]) if num_external_tokens > 0 else []
        remote = min(int(params.get("remote_num_tokens") or 0), request.num_prompt_tokens)
        order = PullOrder(req_id=request.request_id,
                          remote_request_id=str(params.get("remote_request_id", "")),
                          params=params, local_block_ids=local,
                          skip_tokens=remote - num_external_tokens,
                          num_tokens=num_external_tokens, release=num_external_tokens <= 0)
        self._next.pulls.append(order)
        if not order.release:
            self.pulling.add(request.request_id)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KvrailConnectorMetadata:
        self.epoch += 1
        for req_id in scheduler_output.num_scheduled_tokens:
            self.last_epoch[req_id] = self.epoch
        meta, self._next = self._next, KvrailConnectorMetadata(0)
        meta.epoch = self.epoch
        return meta

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        for req_id in connector_output.finished_recving or ():
            self.pulling.discard(req_id)
        worker_meta = connector_output.kv_connector_worker_meta
        if isinstance(worker_meta, KvrailWorkerMetadata):
            self.set_handshakes(worker_meta.handshakes)

    def request_finished(self, request: "Request",
                         block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        from vllm.v1.request import RequestStatus

        req_id = request.request_id
        epoch = self.last_epoch.pop(req_id, 0)
        params = request.kv_transfer_params
        if not params:
            return False, None
        if _is_pull(params):
            # A decode request that ended before it was ever scheduled (aborted): free the
            # prefill's blocks now rather than after their TTL.
            params["do_remote_prefill"] = False
            if not self._same_node(params):
                return False, None
            self._next.pulls.append(PullOrder(
                req_id=req_id, remote_request_id=str(params.get("remote_request_id", "")),
                params=params, local_block_ids=[], skip_tokens=0, num_tokens=0, release=True))
            return False, None
        if req_id in self.pulling:
            # Aborted while pulling: vLLM keeps its blocks until the worker reports the pull
            # final (finished_recving); cancelling makes that quick.
            self._next.cancels.add(req_id)
            return False, None
        if not params.get("do_remote_decode"):
            return False, None
        ranks = self._ranks()
        if (request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED,
                                   RequestStatus.FINISHED_STOPPED)
                or not block_ids or ranks is None):
            if ranks is None and block_ids:
                logger.warning("kvrail: request %s finished before every worker registered its "
                               "KV cache; its blocks are freed now", req_id)
            self._next.not_processed.add(req_id)
            return False, None
        self._next.sends[req_id] = self.ttl
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_request_id": req_id,
            "remote_block_ids": list(block_ids),
            "remote_num_tokens": int(request.num_computed_tokens),
            "remote_block_size": self.block_size,
            "remote_blocks_expire_unix": time.time() + self.ttl,
            _PARAMS_KEY: {"epoch": epoch if self.streaming else 0,
                          "ranks": [h.as_params() for h in ranks]},
        }

    def _ranks(self) -> Optional[List[KvrailHandshake]]:
        """Every TP rank's handshake (pipeline stage 0), in rank order; None while incomplete."""
        ranks = [self.handshakes.get((0, r)) for r in range(self.tp_size)]
        return None if any(h is None for h in ranks) else ranks


def _flag(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"kv_connector_extra_config.{key}: {value!r} is not a boolean")


_LAYER_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def _layer_order(names: List[str]) -> List[str]:
    """Layer names by their layer number ("model.layers.7.self_attn.attn"), the same on every
    instance of a model; names without one keep their order, after the numbered ones."""
    def key(item):
        position, name = item
        found = _LAYER_INDEX.search(name)
        return (0, int(found.group(1)), position) if found else (1, 0, position)
    return [name for _, name in sorted(enumerate(names), key=key)]


@dataclasses.dataclass
class _Pending:
    """A decode pull in flight."""

    transfer: "kvrail.Transfer"
    cancelled: bool = False


class _WorkerSide:
    """A worker's half: one kvrail client, the KV cache as one region, the prefill's layer ready
    flags, the decode's pulls."""

    def __init__(self, vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig",
                 extra: Dict[str, Any]) -> None:
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.socket = extra.get(EXTRA_SOCKET) or os.environ.get("KVRAIL_SOCKET") or None
        self.pull_timeout_ms = int(float(extra.get(EXTRA_PULL_TIMEOUT, DEFAULT_PULL_TIMEOUT_S))
                                   * 1000)
        self.block_size = int(vllm_config.cache_config.block_size)
        self.client: Optional[kvrail.Client] = None
        self.region: Optional[kvrail.Region] = None
        self.layout: Optional[PagedLayout] = None
        self.layer_index: Dict[str, int] = {}
        self.num_layers = 0
        self.blocks_per_block = 1  # kernel blocks per vLLM block
        self.node_id = ""
        self.is_cuda = False
        self._handshake: Optional[KvrailHandshake] = None
        self._grant_minted = 0.0
        self._renewed: Optional[KvrailHandshake] = None
        # Layer ready flags (prefill side) and the scratch block releases cancel into.
        self._flags_buffer: Optional[kvrail.HostBuffer] = None
        self._flags: Optional[kvrail.FlagArray] = None
        self._flags_region: Optional[kvrail.Region] = None
        self._gpu_flags = None
        self._scratch: Optional[kvrail.Region] = None
        self._scratch_buffer: Optional[kvrail.HostBuffer] = None
        # Whether this instance's params make pulls wait on its flags: without, marks are skipped.
        self.streaming = _flag(extra.get(EXTRA_STREAMING, False), EXTRA_STREAMING)
        self._marks_epoch = 0
        self._marked: Set[int] = set()  # layers marked in step _marks_epoch
        # Prefill: requests that may be pulled, those holding blocks (-> monotonic deadline),
        # and notifications that came before the request's deadline did.
        self._in_batch: Set[str] = set()
        self._sending: Dict[str, float] = {}
        self._notified: Dict[str, float] = {}
        # Decode: pulls in flight, and finished/failed ones not yet reported.
        self._pulls: Dict[str, _Pending] = {}
        self._recv_done: Set[str] = set()
        self._recv_failed: Set[str] = set()

    # --- registration ------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        if self.region is not None:
            raise RuntimeError("register_kv_caches: already registered")
        if not kv_caches:
            raise ValueError("kv_caches: empty")
        # Layers sharing another layer's cache (vLLM's KV sharing) map to the same memory: one
        # region layer per distinct tensor, the sharing names pointing at it.
        ordered = _layer_order(list(kv_caches))
        tensors: List[torch.Tensor] = []
        by_ptr: Dict[int, int] = {}
        for name in ordered:
            tensor = kv_caches[name]
            index = by_ptr.setdefault(int(tensor.data_ptr()), len(tensors))
            if index == len(tensors):
                tensors.append(tensor)
            self.layer_index[name] = index
        layout, ptrs = self._layout(tensors)
        self.layout, self.num_layers = layout, len(tensors)
        self.client = kvrail.connect(self.socket)
        self.node_id = self.client.stats().node_id
        self.is_cuda = tensors[0].is_cuda
        evenly = len(ptrs) == 1 or (ptrs[1] > ptrs[0] and all(
            ptrs[i + 1] - ptrs[i] == ptrs[1] - ptrs[0] for i in range(len(ptrs) - 1)))
        if evenly:
            one = dataclasses.replace(layout, layer_stride=(ptrs[1] - ptrs[0]) if len(ptrs) > 1
                                      else layout.part_stride)
            self.region = self._register_one(tensors, one)
            self.layout = one
        elif self.is_cuda:
            spec = region_pb2.RegionSpec(name="vllm kv cache", writable=True)
            spec.paged_kv.CopyFrom(dataclasses.replace(layout, layer_stride=0).to_proto())
            one_layer = dataclasses.replace(layout, num_layers=1, layer_stride=0).nbytes
            self.region = self.client.register_cuda_layers(ptrs, one_layer, spec,
                                                           keepalive=list(tensors))
        else:
            raise ValueError("kv_caches: CPU layers are not evenly spaced in one allocation "
                             "(kvrail registers host memory as one range)")
        self._register_flags_and_scratch()
        self._mint_grants()

    def _layout(self, tensors: List[torch.Tensor]) -> Tuple[PagedLayout, List[int]]:
        """The kvrail layout of vLLM's per-layer [B, H, N, C] views (layer_stride left 0) and
        each layer's address."""
        first = tensors[0]
        for i, t in enumerate(tensors):
            if (tuple(t.shape) != tuple(first.shape) or tuple(t.stride()) != tuple(first.stride())
                    or t.dtype != first.dtype or t.device != first.device):
                raise ValueError(f"kv_caches: layer {i} differs from layer 0 in shape, strides, "
                                 "dtype or device (one kvrail region needs them alike)")
        if first.dim() != 4:
            raise ValueError(f"kv_caches: a {first.dim()}-d tensor per layer; vLLM 0.33's "
                             "attention caches are [blocks, heads, tokens, K|V]")
        groups = self.kv_cache_config.kv_cache_groups
        if len(groups) != 1:
            raise ValueError(f"kv_cache_config: {len(groups)} KV cache groups; the kvrail "
                             "connector moves one (no hybrid models)")
        spec = groups[0].kv_cache_spec
        head_size = int(getattr(spec, "head_size"))
        head_size_v = int(getattr(spec, "head_size_v", head_size) or 0)
        blocks, heads, tokens, content = (int(n) for n in first.shape)
        if head_size_v == 0:  # MLA: one part, the latent
            parts, head_dim = 1, content
        elif head_size_v == head_size and content == 2 * head_size:
            parts, head_dim = 2, head_size
        else:
            raise ValueError(f"kv_cache_config: K head size {head_size} and V head size "
                             f"{head_size_v} in {content} elements; kvrail needs K and V alike")
        size = first.element_size()
        b_stride, h_stride, t_stride, c_stride = (int(s) * size for s in first.stride())
        if c_stride != size:
            raise ValueError("kv_caches: the K|V content axis is not contiguous")
        if self.block_size % tokens:
            raise ValueError(f"kv_caches: {tokens} tokens per kernel block do not divide the "
                             f"block size {self.block_size}")
        self.blocks_per_block = self.block_size // tokens
        layout = PagedLayout(
            num_layers=len(tensors), num_parts=parts, num_blocks=blocks, tokens_per_block=tokens,
            num_heads=heads, head_dim=head_dim, dtype=dtype_of(str(first.dtype)), order=0,
            layer_stride=0, part_stride=head_dim * size, block_stride=b_stride,
            token_stride=t_stride, head_stride=h_stride)
        return layout, [int(t.data_ptr()) for t in tensors]

    def _register_one(self, tensors: List[torch.Tensor], layout: PagedLayout) -> kvrail.Region:
        """One region over every layer: [first layer's address, + layout.nbytes)."""
        assert self.client is not None
        nbytes = layout.nbytes
        if self.is_cuda:
            spec = region_pb2.RegionSpec(name="vllm kv cache", writable=True)
            spec.paged_kv.CopyFrom(layout.to_proto())
            return self.client.register_cuda(int(tensors[0].data_ptr()), nbytes, spec,
                                             keepalive=list(tensors))
        # kvraild maps the engine's own pages, which must be shared memory (a memfd or /dev/shm
        # mapping). vLLM allocates its CPU cache with torch.zeros (private memory): it is moved
        # into shared memory once, here, before the first forward pass (share_memory_() keeps
        # the storage object, so every layer view and binding follows it).
        storage = tensors[0].untyped_storage()
        if not storage.is_shared():
            logger.info("kvrail: moving vLLM's CPU KV cache (%d bytes) into shared memory",
                        storage.nbytes())
            storage.share_memory_()
        span = _host_span(tensors[0], nbytes)
        return self.client.register_host_array(span, layout=layout, writable=True,
                                               name="vllm kv cache")

    def _register_flags_and_scratch(self) -> None:
        assert self.client is not None and self.layout is not None
        self._flags_buffer = kvrail.HostBuffer(4 * self.num_layers, "vllm layer ready flags")
        self._flags_region = self.client.register_host_buffer(self._flags_buffer,
                                                              name="vllm layer ready flags")
        self._flags = kvrail.FlagArray(self._flags_buffer, self._flags_region, 0,
                                       self.num_layers)
        if self.is_cuda:
            self._gpu_flags = self._flags.for_gpu(torch.cuda.current_device())
        # One dense block of one layer: what a release's cancelled pull names as destination.
        scratch = dataclasses.replace(self.layout, num_layers=1, num_blocks=1, layer_stride=0,
                                      part_stride=0, block_stride=0, token_stride=0,
                                      head_stride=0, offset_bytes=0, order=1)
        self._scratch_buffer = kvrail.HostBuffer(scratch.nbytes, "vllm release scratch")
        self._scratch = self.client.register_host_buffer(self._scratch_buffer, layout=scratch,
                                                         writable=True, name="release scratch")

    def _mint_grants(self) -> None:
        assert self.region is not None and self._flags_region is not None
        now = time.time()
        self._handshake = KvrailHandshake(
            node_id=self.node_id, region_id=self.region.id,
            grant=self.region.grant(write=False, ttl=GRANT_TTL_S),
            flags_region_id=self._flags_region.id,
            flags_grant=self._flags_region.grant(write=False, ttl=GRANT_TTL_S),
            num_layers=self.num_layers, tokens_per_block=self.layout.tokens_per_block,
            blocks_per_block=self.blocks_per_block, grant_expires_unix=now + GRANT_TTL_S)
        self._grant_minted = time.monotonic()

    def handshake(self) -> Optional[KvrailHandshake]:
        return self._handshake

    def renewed_handshake(self) -> Optional[KvrailWorkerMetadata]:
        """New grants once the old ones are half-way to expiry (pulls in flight keep theirs)."""
        if self._handshake is None or time.monotonic() - self._grant_minted < GRANT_RENEW_S:
            return None
        self._mint_grants()
        return KvrailWorkerMetadata({(0, _tp_rank()): self._handshake})

    # --- layer streaming (prefill) -----------------------------------------------------------
    def mark_layer(self, layer_name: str, epoch: int) -> None:
        index = self.layer_index.get(layer_name)
        if index is None or self._flags is None or epoch <= 0:
            return
        if index not in self._marked_in(epoch):
            self._signal(index, epoch)
            self._marked.add(index)

    def mark_all_layers(self, epoch: int) -> None:
        """Every layer not yet marked in step `epoch`."""
        if self._flags is None or epoch <= 0:
            return
        marked = self._marked_in(epoch)
        for index in range(self.num_layers):
            if index not in marked:
                self._signal(index, epoch)
        marked.update(range(self.num_layers))

    def _marked_in(self, epoch: int) -> Set[int]:
        if epoch != self._marks_epoch:
            self._marks_epoch, self._marked = epoch, set()
        return self._marked

    def _signal(self, index: int, epoch: int) -> None:
        value = epoch & 0xFFFFFFFF or 1
        if self._gpu_flags is not None:
            # After the kernels that wrote the layer, in stream order.
            self._gpu_flags.signal(index, value, torch.cuda.current_stream())
        else:
            assert self._flags is not None
            self._flags.signal(index, value)

    # --- the step's orders ---------------------------------------------------------------
    def start_load_kv(self, meta: KvrailConnectorMetadata) -> None:
        now = time.monotonic()
        self._in_batch |= meta.in_batch
        for req_id in meta.not_processed:
            self._in_batch.discard(req_id)
            self._notified.pop(req_id, None)
        for req_id, ttl in meta.sends.items():
            self._in_batch.discard(req_id)
            self._sending[req_id] = now + ttl
        for order in meta.pulls:
            if order.release:
                self._release(order)
            else:
                self._pull(order)
        for req_id in meta.cancels:
            pending = self._pulls.get(req_id)
            if pending is not None and not pending.cancelled:
                pending.cancelled = True
                try:
                    pending.transfer.cancel()
                except kvrail.KvrailError as e:
                    logger.warning("kvrail: cancelling the pull of %s: %s", req_id, e)

    def _source(self, order: PullOrder) -> Dict[str, Any]:
        ranks = order.params[_PARAMS_KEY]["ranks"]
        rank = _tp_rank()
        tp_size = int(self.vllm_config.parallel_config.tensor_parallel_size)
        if len(ranks) != tp_size:
            raise ValueError(f"kv_transfer_params.kvrail.ranks: the prefill has {len(ranks)} TP "
                             f"ranks, this decode {tp_size} (the kvrail connector needs them "
                             "equal)")
        return ranks[rank]

    def _pull(self, order: PullOrder) -> None:
        assert self.client is not None and self.region is not None
        try:
            src = self._source(order)
            remote_ids = [int(b) for b in order.params["remote_block_ids"]]
            remote_bs = int(order.params["remote_block_size"])
            src_tpb = int(src["tokens_per_block"])
            src_kernel = _kernel_blocks(remote_ids, int(src["blocks_per_block"]))
            dst_kernel = _kernel_blocks(order.local_block_ids, self.blocks_per_block)
            first, end = order.skip_tokens, order.skip_tokens + order.num_tokens
            dst_tpb = self.layout.tokens_per_block
            if first % remote_bs or first % self.block_size:
                raise ValueError(f"skip_tokens: {first} is not at a block boundary")
            src_ids = src_kernel[first // src_tpb: -(-end // src_tpb)]
            dst_ids = dst_kernel[first // dst_tpb: -(-end // dst_tpb)]
            if len(src_ids) * src_tpb < order.num_tokens or \
                    len(dst_ids) * dst_tpb < order.num_tokens:
                raise ValueError(f"remote_block_ids: {len(remote_ids)} prefill blocks or "
                                 f"{len(order.local_block_ids)} local blocks do not hold "
                                 f"tokens [{first}, {end})")
            left_ms = int(_time_left(order.params) * 1000)
            if left_ms <= 0:
                raise ValueError("remote_blocks_expire_unix: the prefill's blocks expired before "
                                 "the pull could start")
            fields: Dict[str, Any] = dict(
                num_tokens=order.num_tokens, src_grant=str(src["grant"]),
                priority=transfer_pb2.PRIORITY_CRITICAL,
                timeout_ms=min(self.pull_timeout_ms, left_ms),
                notification=order.remote_request_id.encode(), label=f"vllm {order.req_id}")
            if src["node_id"] != self.node_id:
                raise ValueError(f"kv_transfer_params.kvrail.ranks[].node_id: {src['node_id']!r}"
                                 f" is another node than this worker's {self.node_id!r}")
            epoch = int(order.params[_PARAMS_KEY].get("epoch") or 0)
            if epoch > 0:
                fields["ready_flags"] = transfer_pb2.FlagArray(
                    region_id=int(src["flags_region_id"]), byte_offset=0,
                    value=epoch & 0xFFFFFFFF or 1, grant=str(src["flags_grant"]))
            transfer = self.client.transfer(int(src["region_id"]), src_ids, self.region,
                                            dst_ids, **fields)
        except (kvrail.KvrailError, ValueError, KeyError, TypeError) as e:
            logger.error("kvrail: the pull of %s failed to start: %s", order.req_id, e)
            self._recv_failed.add(order.req_id)
            self._recv_done.add(order.req_id)
            return
        self._pulls[order.req_id] = _Pending(transfer)

    def _release(self, order: PullOrder) -> None:
        """Frees the prefill's blocks without pulling: a layer-wise transfer of one block into the
        scratch region, cancelled before any layer was marked ready (nothing moves), whose
        notification reaches the prefill."""
        assert self.client is not None and self._scratch is not None
        try:
            src = self._source(order)
            block = int(order.params["remote_block_ids"][0]) * int(src["blocks_per_block"])
            transfer = self.client.transfer(
                int(src["region_id"]), [block], self._scratch, [0], num_layers=1,
                layerwise=True, src_grant=str(src["grant"]),
                notification=order.remote_request_id.encode(),
                label=f"vllm release {order.req_id}")
            transfer.cancel()
        except (kvrail.KvrailError, ValueError, KeyError, TypeError, IndexError) as e:
            logger.warning("kvrail: releasing the prefill blocks of %s failed (they are freed "
                           "after their TTL): %s", order.req_id, e)

    # --- completions -------------------------------------------------------------------------
    def transfer_results(self) -> KVConnectorTransferResults:
        results = KVConnectorTransferResults()
        if self.client is None:
            return results
        self._poll_pulls()
        results.finished_recving, self._recv_done = self._recv_done, set()
        results.failed_recving, self._recv_failed = self._recv_failed, set()
        results.finished_sending = self._poll_sends()
        return results

    def _poll_pulls(self) -> None:
        if not self._pulls:
            return
        ids = list(self._pulls)
        states = self.client.poll([self._pulls[r].transfer for r in ids], raise_on_error=False)
        for req_id, state in zip(ids, states):
            if state == 0 or kvrail.is_final(state):
                pending = self._pulls.pop(req_id)
                if state != transfer_pb2.TRANSFER_STATE_SUCCEEDED and not pending.cancelled:
                    status = pending.transfer.wait(0) if state else None
                    logger.error("kvrail: the pull of %s ended %s: %s", req_id,
                                 transfer_pb2.TransferState.Name(state),
                                 status.error_message if status is not None else "unknown id")
                    self._recv_failed.add(req_id)
                self._recv_done.add(req_id)

    def _poll_sends(self) -> Set[str]:
        now = time.monotonic()
        region_id = self.region.id if self.region is not None else 0
        while True:
            batch = self.client.poll_notifications(timeout=0)
            for n in batch:
                if n.region_id != region_id or not n.region_is_source:
                    continue  # not a read of this worker's cache: says nothing about a send
                self._notified[n.notification.decode("utf-8", "replace")] = now
            if len(batch) < 256:
                break
        done: Set[str] = set()
        for req_id, deadline in list(self._sending.items()):
            if req_id in self._notified:
                done.add(req_id)
                del self._notified[req_id]
            elif now >= deadline:
                logger.warning("kvrail: no decode pulled %s within its TTL; its blocks are freed",
                               req_id)
                done.add(req_id)
            else:
                continue
            del self._sending[req_id]
        # Notifications for requests this worker will never hold (ended without params) go
        # stale: forget them after a while.
        for req_id, seen in list(self._notified.items()):
            if req_id not in self._in_batch and now - seen > 2 * DEFAULT_TTL_S:
                del self._notified[req_id]
        return done

    def close(self) -> None:
        if self._gpu_flags is not None:
            self._gpu_flags.close()
            self._gpu_flags = None
        if self.client is not None:
            self.client.close()  # the daemon releases the session's regions


def _time_left(params: Dict[str, Any]) -> float:
    """Seconds a pull may still read the prefill's blocks (their expiry less the margin); no
    expiry in the params: the pull timeout alone bounds it."""
    expires = params.get("remote_blocks_expire_unix")
    if expires is None:
        return float("inf")
    return float(expires) - EXPIRY_MARGIN_S - time.time()


def _kernel_blocks(block_ids: List[int], per_block: int) -> List[int]:
    """vLLM block ids as kvrail (kernel) block ids: block b is kernel blocks [b*k, b*k + k)."""
    if per_block == 1:
        return list(block_ids)
    return [b * per_block + j for b in block_ids for j in range(per_block)]


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        return int(get_tensor_model_parallel_rank())
    except (AssertionError, ImportError, RuntimeError, AttributeError):
        return 0  # no distributed state: a single worker


def _host_span(first: torch.Tensor, nbytes: int) -> torch.Tensor:
    """A uint8 CPU tensor over [first.data_ptr(), + nbytes) of first's storage (no copy)."""
    storage = first.untyped_storage()
    offset = int(first.data_ptr()) - int(storage.data_ptr())
    if offset + nbytes > storage.nbytes():
        raise ValueError(f"kv_caches: the layers span {nbytes} bytes past their storage's end")
    span = torch.empty(0, dtype=torch.uint8)
    span.set_(storage, offset, (nbytes,))
    return span


__all__ = ["KvrailConnector", "KvrailConnectorMetadata", "KvrailHandshake",
           "KvrailWorkerMetadata", "PullOrder"]

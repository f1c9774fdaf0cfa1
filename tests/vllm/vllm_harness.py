"""A vLLM instance without a model, for the kvrail connector's tests and benchmark: vLLM's own
Scheduler (built from a VllmConfig as vLLM's connector unit tests build theirs) with the kvrail
connector on its scheduler side, and a worker-side connector over per-layer KV cache views made by
vLLM's own create_kv_cache_views in shared host memory. A step is what vLLM's model runner does
around a forward pass: bind the connector metadata, start_load_kv, the "forward" (this harness
writes each scheduled token's K and V, a pure function of the prompt prefix, the position and the
layer, then calls save_kv_layer per layer), wait_for_save, get_transfer_results, and the
scheduler's update_from_output with the outputs a sampler would give.

Nothing here downloads: the model config is a local config.json of a small Llama (GQA).
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvrail  # noqa: E402
import kvrail.vllm as kvv  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, KVCacheTensor, create_kv_cache_views)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

EOS = 999
_none_hash_ready = False


class Daemon:
    """kvraild from $KVRAIL_DAEMON on a socket in a temporary folder, ended by pid."""

    def __init__(self) -> None:
        binary = os.environ.get("KVRAIL_DAEMON")
        if not binary:
            raise RuntimeError("KVRAIL_DAEMON is not set (run through bazel test)")
        self.dir = tempfile.mkdtemp(prefix="kvvllm.", dir="/tmp")
        self.socket = os.path.join(self.dir, "kvrail.sock")
        self.log_path = os.path.join(self.dir, "kvraild.log")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([binary, "--socket", self.socket, "--log-level",
                                             "warning"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not os.path.exists(self.socket) or not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"kvraild did not start: {self.log()}")
            time.sleep(0.02)

    def _answers(self) -> bool:
        try:
            with kvrail.connect(self.socket, probe_timeout=0.5):
                return True
        except kvrail.KvrailError:
            return False

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> int:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


def model_dir(num_layers: int = 4, kv_heads: int = 2, head_dim: int = 64) -> str:
    """A local Llama config (GQA: 8 query heads, `kv_heads` KV heads), no weights needed."""
    path = tempfile.mkdtemp(prefix="kvvllm-model.")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": 8 * head_dim, "intermediate_size": 1024,
                   "num_attention_heads": 8, "num_key_value_heads": kv_heads,
                   "head_dim": head_dim, "num_hidden_layers": num_layers, "vocab_size": 1000,
                   "max_position_embeddings": 4096, "torch_dtype": "float16"}, f)
    return path


class Instance:
    """One vLLM engine (scheduler + one worker) with the kvrail connector."""

    def __init__(self, name: str, model: str, socket: str, *, block_size: int,
                 kv_layout: KVCacheLayout, num_blocks: int = 64, num_layers: int = 4,
                 kv_heads: int = 2, head_dim: int = 64, ttl_s: float = 120.0,
                 streaming: bool = False, kv_role: str = "kv_both",
                 max_num_batched_tokens: int = 256, layer_prefix: str = "model.layers",
                 write_kv: bool = True) -> None:
        global _none_hash_ready
        if not _none_hash_ready:
            init_none_hash(sha256)
            _none_hash_ready = True
        self.name = name
        self.write_kv = write_kv  # False: the "forward" leaves the cache alone (benchmarks)
        self.block_size = block_size
        self.head_dim = head_dim
        self.kv_heads = kv_heads
        extra = {kvv.EXTRA_SOCKET: socket, kvv.EXTRA_TTL: ttl_s, kvv.EXTRA_STREAMING: streaming}
        self.config = VllmConfig(
            model_config=ModelConfig(model=model, skip_tokenizer_init=True, dtype="float16",
                                     seed=0),
            scheduler_config=SchedulerConfig(
                max_num_seqs=16, max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=4096, enable_chunked_prefill=True, is_encoder_decoder=False),
            cache_config=CacheConfig(block_size=block_size, gpu_memory_utilization=0.9,
                                     cache_dtype="auto", enable_prefix_caching=True),
            kv_transfer_config=KVTransferConfig(
                kv_connector="KvrailConnector", kv_connector_module_path="kvrail.vllm",
                kv_role=kv_role, engine_id=name, kv_connector_extra_config=extra),
            device_config=DeviceConfig("cpu"))
        self.config.cache_config.num_gpu_blocks = num_blocks
        self.layers = [f"{layer_prefix}.{i}.self_attn.attn" for i in range(num_layers)]
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=kv_heads,
                                 head_size=head_dim, dtype=torch.float16)
        page = spec.page_size_bytes
        tensor = KVCacheTensor(size=page * num_blocks * num_layers, layers=list(self.layers),
                               layer_stride=page * num_blocks, block_stride=page)
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[tensor],
            kv_cache_groups=[KVCacheGroupSpec(list(self.layers), spec)])
        self.scheduler = Scheduler(
            vllm_config=self.config, kv_cache_config=self.kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.config),
            block_size=block_size, log_stats=True)
        # The worker's cache: vLLM's own per-layer views over shared host memory.
        # Allocated as vLLM's allocate_kv_cache does (torch.zeros, private memory): the
        # connector moves it into shared memory when it registers the cache.
        self.raw = torch.zeros(tensor.size, dtype=torch.int8)
        self.raw.fill_(0x5A)  # poison: untouched slots read 0x5A5A
        views = create_kv_cache_views(self.raw, spec, num_blocks, kv_layout, tensor)
        self.kv_caches: Dict[str, torch.Tensor] = dict(zip(self.layers, views))
        self.worker = kvv.KvrailConnector(self.config, KVConnectorRole.WORKER,
                                          self.kv_cache_config)
        self.worker.register_kv_caches(self.kv_caches)
        assert self.raw.is_shared()
        # What the engine core does once workers registered: their handshakes to the scheduler.
        self.scheduler.connector.set_xfer_handshake_metadata_pp_aware(
            {(0, 0): self.worker.get_handshake_metadata()})
        self.outputs: Dict[str, list] = {}  # request -> EngineCoreOutputs seen
        self.last_results = None

    @property
    def connector(self) -> kvv.KvrailConnector:
        return self.scheduler.connector

    # --- requests ----------------------------------------------------------------------------
    def request(self, req_id: str, prompt: Sequence[int], max_tokens: int,
                params: Optional[dict] = None) -> Request:
        sampling = SamplingParams(max_tokens=max_tokens)
        sampling.update_from_generation_config({}, EOS)
        req = Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=sampling,
                      pooling_params=None, mm_features=None,
                      block_hasher=get_request_block_hasher(self.block_size, sha256))
        req.kv_transfer_params = params
        self.scheduler.add_request(req)
        return req

    def abort(self, req_id: str) -> None:
        self.scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)

    # --- one engine step ---------------------------------------------------------------------
    def step(self, save_layers: bool = True):
        """One engine step. `save_layers` False leaves the step's layer-ready marks out (a forward
        whose kernels have not finished: async scheduling); mark_saved() does them later."""
        so = self.scheduler.schedule()
        w = self.worker
        w.bind_connector_metadata(so.kv_connector_metadata)
        self._epoch = so.kv_connector_metadata.epoch
        reqs = list(so.num_scheduled_tokens)
        for req_id in reqs if self.write_kv else ():
            self._forward(req_id, so.num_scheduled_tokens[req_id])
        w.start_load_kv(None)  # async loads start after the forward, as vLLM orders them
        if save_layers:
            for name in self.layers:
                w.save_kv_layer(name, self.kv_caches[name], None)
            w.wait_for_save()
        results = w.get_transfer_results(so.finished_req_ids)
        worker_meta = w.build_connector_worker_meta()
        w.clear_connector_metadata()
        self.last_results = results
        out = ModelRunnerOutput(
            req_ids=reqs, req_id_to_index={r: i for i, r in enumerate(reqs)},
            sampled_token_ids=[[self._token(r)] if self._samples(r) else [] for r in reqs],
            kv_connector_output=KVConnectorOutput(
                finished_sending=results.finished_sending or None,
                finished_recving=results.finished_recving or None,
                failed_recving=results.failed_recving,
                kv_connector_worker_meta=worker_meta))
        engine_outputs = self.scheduler.update_from_output(so, out)
        for outputs in engine_outputs.values():
            for o in outputs.outputs:
                self.outputs.setdefault(o.request_id, []).append(o)
        return so

    def mark_saved(self, epoch: int, layers: Optional[Sequence[int]] = None) -> None:
        """The layer ready marks of step `epoch`, as save_kv_layer gives them."""
        meta = kvv.KvrailConnectorMetadata(epoch)
        self.worker.bind_connector_metadata(meta)
        for i in (range(len(self.layers)) if layers is None else layers):
            self.worker.save_kv_layer(self.layers[i], self.kv_caches[self.layers[i]], None)
        self.worker.clear_connector_metadata()

    def _samples(self, req_id: str) -> bool:
        req = self.scheduler.requests[req_id]
        return req.num_computed_tokens >= req.num_tokens

    def _token(self, req_id: str) -> int:
        req = self.scheduler.requests[req_id]
        return 7 + (req.num_tokens % 11)

    def _forward(self, req_id: str, count: int) -> None:
        """Writes K and V of the request's tokens [computed - count, computed) into its blocks:
        the attention layers' cache writes of a forward pass."""
        req = self.scheduler.requests[req_id]
        end = req.num_computed_tokens  # schedule() advanced it by the scheduled count
        blocks = self.scheduler.kv_cache_manager.get_block_ids(req_id)[0]
        tokens = req.all_token_ids
        for pos in range(end - count, end):
            kv = token_kv(tokens[:pos + 1], len(self.layers), self.kv_heads, self.head_dim)
            block, slot = blocks[pos // self.block_size], pos % self.block_size
            for li, name in enumerate(self.layers):
                self.kv_caches[name][block, :, slot, :] = torch.from_numpy(kv[li])

    # --- reading the cache -------------------------------------------------------------------
    def token_bytes(self, req_id: str, positions: Sequence[int]) -> np.ndarray:
        """[positions, layers, heads, K|V] of a request as uint16 (its blocks, this layout)."""
        blocks = self.scheduler.kv_cache_manager.get_block_ids(req_id)[0]
        return self.block_token_bytes(blocks, positions)

    def block_token_bytes(self, blocks: Sequence[int], positions: Sequence[int]) -> np.ndarray:
        rows = []
        for pos in positions:
            block, slot = blocks[pos // self.block_size], pos % self.block_size
            rows.append(np.stack([self.kv_caches[n][block, :, slot, :].view(torch.int16)
                                  .numpy().view(np.uint16) for n in self.layers]))
        return np.stack(rows)

    def poison(self, req_id: str) -> None:
        """Writes the poison over every block of the request (blocks come back with old data)."""
        for block in self.scheduler.kv_cache_manager.get_block_ids(req_id)[0]:
            for name in self.layers:
                self.kv_caches[name][block].view(torch.int16).fill_(0x5A5A)

    def num_free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def close(self) -> None:
        self.worker.shutdown()


def token_kv(prefix: Sequence[int], layers: int, heads: int, head_dim: int) -> np.ndarray:
    """[layers, heads, K|V] fp16 of the last token of `prefix`: a pure function of the prefix (as a
    real model's K and V are), so a prefix hit and a pull must agree byte for byte."""
    seed = int.from_bytes(hashlib.blake2b(np.asarray(prefix, np.int64).tobytes(),
                                          digest_size=8).digest(), "little")
    rng = np.random.default_rng(seed)
    return rng.standard_normal((layers, heads, 2 * head_dim)).astype(np.float16)


def expected_bytes(prompt: Sequence[int], positions: Sequence[int], layers: int, heads: int,
                   head_dim: int) -> np.ndarray:
    return np.stack([token_kv(list(prompt[:p + 1]), layers, heads, head_dim).view(np.uint16)
                     for p in positions])


def run_until(instances: List[Instance], done, timeout_s: float = 60.0,
              sleep: float = 0.001) -> int:
    """Steps every instance until done() is true (an engine loop: a round, then `sleep`); the
    number of rounds. AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    rounds = 0
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not done after {timeout_s} s ({rounds} rounds)")
        for inst in instances:
            inst.step()
        rounds += 1
        if sleep:
            time.sleep(sleep)
    return rounds


def prefill(p: Instance, req_id: str, prompt: Sequence[int]) -> dict:
    """Runs a prompt through the prefill instance (do_remote_decode, max_tokens 1); returns the
    kv_transfer_params its finished output carries."""
    p.request(req_id, prompt, max_tokens=1, params={"do_remote_decode": True})
    run_until([p], lambda: any(o.finished for o in p.outputs.get(req_id, [])))
    final = [o for o in p.outputs[req_id] if o.finished][-1]
    assert final.kv_transfer_params, f"{req_id}: no kv_transfer_params from the prefill"
    return final.kv_transfer_params

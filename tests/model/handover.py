#!/usr/bin/env python3
"""A transformers model across the kvrail handover: the code shared by the CPU test
(tests/model/model_handover_test.py) and the GPU run (tests/gpu/model_handover.py).

A Llama-architecture model with GQA is built from a config with random weights (seeded; nothing is
downloaded). Each role below is its own process; they talk in JSON lines over pipes (no pickle):
  reference  runs the prompt and greedy decoding in one process: the tokens and logits to match.
  prefill    runs the prompt and writes each layer's K/V into its paged pool from a forward hook on
             the decoder layer, as a serving engine's attention writes its cache: one tensor per
             layer, vLLM's [2, blocks, block_size, kv_heads, head_dim] (NHD), at scattered block
             ids. It pushes the request's blocks into the decode process's pool with one transfer
             over every layer (a per-layer region on each side). "streaming" submits the transfer
             layer-wise before the forward and marks each layer ready as soon as it is in the pool
             (Transfer.mark_ready on CPU; on a GPU a flag word written from the layer's CUDA stream,
             TransferSpec.ready_flags); "bulk" submits it after the forward.
  decode     owns a pool with another block size and order ([2, blocks, kv_heads, 32, head_dim],
             HND) and other scattered ids, poisoned with NaN before each request. It waits for the
             daemon's arrival flags (TransferSpec.arrival_flags), rebuilds a transformers
             DynamicCache from its pool and generates greedily from the prefill's first token.
The driver side (Handover) starts kvraild and the three roles and runs requests through them;
each request's tokens and per-step logits are compared with the reference's.

Memory: on the CPU the pools are kvrail.HostBuffers (one per layer) viewed as torch tensors with
torch.frombuffer, registered with Client.register_host_layers; on a GPU they are CUDA tensors
registered with kvrail.tensors.register_kv_cache. Only torch, transformers, numpy and the kvrail
package are imported (the GPU machine has no PyPI).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

PREFILL_TPB = 16  # tokens per block of the prefill pool (vLLM's default block size)
DECODE_TPB = 32  # and of the decode pool


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The model, built identically in every process from these fields."""

    layers: int = 4
    q_heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 1024
    vocab: int = 8192
    dtype: str = "bfloat16"
    # Wider than transformers' 0.02: with 0.02 a random model repeats one token, so its output
    # would hardly depend on the cache; at 0.05 every step's token does.
    init_range: float = 0.05
    seed: int = 1234

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelSpec":
        return cls(**json.loads(text))


CPU_MODEL = ModelSpec()
GPU_MODEL = ModelSpec(layers=12, head_dim=128, intermediate=2816, vocab=32000)


# --- the model --------------------------------------------------------------------------------
def torch_dtype(name: str):
    import torch
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def build_model(spec: ModelSpec, device: str):
    """The model on `device`. Initialized on the CPU in fp32 from the seed, then cast, so every
    process (and device) gets the same weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=spec.vocab, hidden_size=spec.q_heads * spec.head_dim,
                         intermediate_size=spec.intermediate, num_hidden_layers=spec.layers,
                         num_attention_heads=spec.q_heads, num_key_value_heads=spec.kv_heads,
                         head_dim=spec.head_dim, max_position_embeddings=8192,
                         tie_word_embeddings=False, initializer_range=spec.init_range)
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    return model.to(device=device, dtype=torch_dtype(spec.dtype)).eval()


def weights_digest(model) -> str:
    """sha256 over every parameter's bytes: the processes' models must be the same one."""
    import torch
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def prompt_ids(spec: ModelSpec, tokens: int, device: str):
    import torch
    g = torch.Generator().manual_seed(spec.seed + 1)
    return torch.randint(0, spec.vocab, (1, tokens), generator=g).to(device)


def new_cache():
    from transformers import DynamicCache
    return DynamicCache()


def layer_kv(cache, layer: int):
    """Layer `layer`'s K and V of a DynamicCache, [1, kv_heads, tokens, head_dim] each."""
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


def greedy(model, cache, first_token: int, steps: int, device: str, timings=None):
    """`steps` greedy decode steps from `first_token` over `cache`: the tokens (first_token and
    `steps` new ones) and the steps' logits [steps, vocab] as float32 on the CPU. `timings`, a
    list, receives the time after the first step (device work done)."""
    import torch
    tokens = [first_token]
    rows = []
    token = torch.tensor([[first_token]], device=device)
    with torch.inference_mode():
        for step in range(steps):
            logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1]
            token = logits.argmax(-1, keepdim=True)
            tokens.append(int(token))  # a device sync on a GPU
            rows.append(logits[0])
            if step == 0 and timings is not None:
                timings.append(time.time())
        return tokens, torch.stack(rows).float().cpu().numpy()


# --- paged pools ------------------------------------------------------------------------------
class PagedPool:
    """One KV tensor per layer, [2, blocks, tpb, kv_heads, head_dim] ("NHD", vLLM's) or
    [2, blocks, kv_heads, tpb, head_dim] ("HND"), registered as one per-layer region.

    Host pools (device "cpu") are kvrail.HostBuffers seen by torch.frombuffer, without a copy;
    CUDA pools are tensors registered through CUDA IPC. Thread contract: one thread."""

    def __init__(self, client, spec: ModelSpec, blocks: int, tpb: int, order: str, device: str,
                 writable: bool, name: str) -> None:
        import torch
        import kvrail
        from kvrail import layouts
        if order not in ("NHD", "HND"):
            raise ValueError(f"order: {order!r} is neither NHD nor HND")
        self.spec, self.blocks, self.tpb, self.order, self.device = spec, blocks, tpb, order, device
        heads, dim = spec.kv_heads, spec.head_dim
        shape = (2, blocks, tpb, heads, dim) if order == "NHD" else (2, blocks, heads, tpb, dim)
        dtype = torch_dtype(spec.dtype)
        if device == "cpu":
            layout = layouts.PagedLayout(
                num_layers=spec.layers, num_parts=2, num_blocks=blocks, tokens_per_block=tpb,
                num_heads=heads, head_dim=dim, dtype=layouts.dtype_of(spec.dtype),
                order=(layouts.ORDER_LAYER_PART_BLOCK_NHD if order == "NHD"
                       else layouts.ORDER_LAYER_PART_BLOCK_HND))
            one = dataclasses.replace(layout, num_layers=1).nbytes
            self.buffers = [kvrail.HostBuffer(one, f"{name} L{i}") for i in range(spec.layers)]
            count = one // torch.empty((), dtype=dtype).element_size()
            self.tensors = [torch.frombuffer(b.memoryview(), dtype=dtype, count=count).view(shape)
                            for b in self.buffers]
            self.region = client.register_host_layers(self.buffers, layout, writable=writable,
                                                      name=name)
        else:
            from kvrail.tensors import register_kv_cache
            self.buffers = []
            self.tensors = [torch.zeros(shape, dtype=dtype, device=device)
                            for _ in range(spec.layers)]
            self.region = register_kv_cache(client, self.tensors,
                                            "PBTHD" if order == "NHD" else "PBHTD",
                                            writable=writable, name=name)

    def index_of(self, table: Sequence[int]):
        """`table` as a device tensor, made once per table (not a copy per layer)."""
        import torch
        key = tuple(table)
        cached = getattr(self, "_cached_index", None)
        if cached is None or cached[0] != key:
            cached = (key, torch.tensor(key, dtype=torch.long, device=self.device))
            self._cached_index = cached
        return cached[1]

    def write_layer(self, layer: int, keys, values, table: Sequence[int]) -> None:
        """Writes K and V ([1, kv_heads, tokens, head_dim]) into blocks `table` (token i in
        table[i // tpb], slot i % tpb); a partial last block is zero-padded."""
        import torch
        tokens = keys.shape[2]
        nblk = len(table)
        if not (nblk - 1) * self.tpb < tokens <= nblk * self.tpb:
            raise ValueError(f"table: {nblk} blocks of {self.tpb} do not hold {tokens} tokens")
        index = self.index_of(table)
        for part, x in enumerate((keys, values)):
            x = x[0]  # [heads, tokens, dim]
            pad = nblk * self.tpb - tokens
            if pad:
                x = torch.nn.functional.pad(x, (0, 0, 0, pad))
            heads, dim = x.shape[0], x.shape[2]
            if self.order == "NHD":
                paged = x.transpose(0, 1).reshape(nblk, self.tpb, heads, dim)
            else:
                paged = x.reshape(heads, nblk, self.tpb, dim).permute(1, 0, 2, 3)
            self.tensors[layer][part].index_copy_(0, index, paged)

    def read_layer(self, layer: int, table: Sequence[int], tokens: int):
        """K and V of blocks `table`, [1, kv_heads, tokens, head_dim] each (contiguous)."""
        index = self.index_of(table)
        out = []
        for part in range(2):
            paged = self.tensors[layer][part].index_select(0, index)
            heads, dim = self.spec.kv_heads, self.spec.head_dim
            if self.order == "NHD":
                x = paged.reshape(len(table) * self.tpb, heads, dim)[:tokens].transpose(0, 1)
            else:
                x = paged.permute(1, 0, 2, 3).reshape(heads, len(table) * self.tpb, dim)
                x = x[:, :tokens]
            out.append(x.unsqueeze(0).contiguous())
        return out[0], out[1]

    def cache(self, table: Sequence[int], tokens: int):
        """A DynamicCache over every layer of blocks `table`: what decode generates from."""
        cache = new_cache()
        for layer in range(self.spec.layers):
            keys, values = self.read_layer(layer, table, tokens)
            cache.update(keys, values, layer)
        return cache

    def poison(self) -> None:
        for t in self.tensors:
            t.fill_(float("nan"))

    def corrupt_one_byte(self, table: Sequence[int], token: int, layer: int = 0,
                         head: int = 0) -> str:
        """Adds 4 to the most significant byte of one K element: the exponent grows by 8, the
        element by 256x (bf16 and fp32 keep sign and 7 exponent bits in that byte). The element is
        the largest of layer `layer`'s K vector of token `token`, head `head`. Returns what
        changed."""
        import torch
        if self.spec.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"dtype: corrupt_one_byte knows bf16 and fp32, not {self.spec.dtype}")
        block, slot = table[token // self.tpb], token % self.tpb
        kv = self.tensors[layer][0][block]
        vector = kv[slot, head] if self.order == "NHD" else kv[head, slot]
        d = int(vector.float().abs().argmax())
        size = vector.element_size()
        raw = vector[d:d + 1].view(torch.uint8)  # little-endian: the last byte is the top one
        before = float(vector[d])
        raw[size - 1] += 4
        return (f"layer {layer} K, token {token} (block {block} slot {slot}), head {head}, "
                f"element {d}: {before:.4g} -> {float(vector[d]):.4g}")


# --- the roles (child processes) --------------------------------------------------------------
class Channel:
    """JSON lines: requests on stdin, answers on the real stdout. Anything else that writes to
    stdout (a library's print) goes to stderr, so it cannot break the protocol."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, message: dict) -> None:
        self._out.write(json.dumps(message) + "\n")
        self._out.flush()

    def requests(self):
        for line in sys.stdin:
            if line.strip():
                yield json.loads(line)


def setup_torch(args) -> None:
    import torch
    if args.device == "cpu":
        torch.set_num_threads(args.threads)  # the same count in every process: same numerics


def run_reference(args, channel: Channel) -> None:
    import numpy as np
    import torch
    spec = ModelSpec.from_json(args.model)
    model = build_model(spec, args.device)
    ids = prompt_ids(spec, args.tokens, args.device)
    channel.send({"ready": "reference", "weights": weights_digest(model)})
    with torch.inference_mode():
        cache = new_cache()
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
        first = int(logits[:, -1].argmax(-1))
    tokens, rows = greedy(model, cache, first, args.new_tokens, args.device)
    np.save(args.logits, rows)
    channel.send({"tokens": tokens, "logits": args.logits})


def run_prefill(args, channel: Channel) -> None:
    import torch
    import kvrail
    from kvrail import transfer_pb2
    spec = ModelSpec.from_json(args.model)
    model = build_model(spec, args.device)
    ids = prompt_ids(spec, args.tokens, args.device)
    cuda = args.device != "cpu"
    with torch.inference_mode():  # warm-up: kernels, allocator
        model(input_ids=ids[:, :64], past_key_values=new_cache(), use_cache=True)
    with kvrail.connect(args.socket) as client:
        pool = PagedPool(client, spec, args.blocks, PREFILL_TPB, "NHD", args.device,
                         writable=False, name="prefill pool")
        gpu_ready = ready_flags = None
        if cuda:  # layer readiness from the CUDA stream: no CPU round trip per layer
            from kvrail.flags import FlagArray
            ready_buffer = kvrail.HostBuffer(4096, "ready flags")
            ready_region = client.register_host_buffer(ready_buffer, name="ready flags")
            ready_flags = FlagArray(ready_buffer, ready_region, count=spec.layers)
            gpu_ready = ready_flags.for_gpu(torch.device(args.device).index or 0)
            stream = torch.cuda.Stream(device=args.device)
            torch.cuda.synchronize(args.device)  # the pool's zeros, before the side stream
        channel.send({"ready": "prefill", "weights": weights_digest(model)})
        for req in channel.requests():
            r, streaming, peer = req["request"], req["mode"] == "streaming", req["peer"]
            spec_msg = transfer_pb2.TransferSpec(
                num_tokens=args.tokens, label=f"model handover {r}",
                notification=f"request-{r}".encode())
            spec_msg.src.region_id = pool.region.id
            spec_msg.src.block_ids.extend(req["blocks"])
            spec_msg.dst.region_id = peer["region"]
            spec_msg.dst.grant = peer["grant"]
            spec_msg.dst.block_ids.extend(peer["blocks"])
            spec_msg.arrival_flags.CopyFrom(transfer_pb2.FlagArray(
                region_id=peer["arrival_region"], value=r, grant=peer["arrival_grant"]))
            if streaming and cuda:
                spec_msg.ready_flags.CopyFrom(ready_flags.spec(r))
            elif streaming:
                spec_msg.layerwise = True
            transfer = client.submit(spec_msg) if streaming else None
            marks: List[float] = []
            done_at_mark: List[int] = []
            cache = new_cache()

            def hook(layer: int):
                def after_layer(module, inputs, output):
                    keys, values = layer_kv(cache, layer)
                    pool.write_layer(layer, keys, values, req["blocks"])
                    if not streaming:
                        return
                    if cuda:
                        gpu_ready.signal(layer, r, torch.cuda.current_stream())
                        return
                    if req.get("probe"):  # layers landed so far: never one not yet marked
                        done_at_mark.append(transfer.status.layers_done)
                    transfer.mark_ready(layer)
                    marks.append(time.time())
                return after_layer

            pool.index_of(req["blocks"])  # made before the forward, not in the first hook
            handles = [m.register_forward_hook(hook(i)) for i, m in enumerate(model.model.layers)]
            t0 = time.time()
            with torch.inference_mode(), (torch.cuda.stream(stream) if cuda
                                          else contextlib.nullcontext()):
                logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
                first = int(logits[:, -1].argmax(-1))  # syncs the stream
            t_end = time.time()
            for h in handles:
                h.remove()
            if transfer is None:
                transfer = client.submit(spec_msg)
            channel.send({"first_token": first, "t_start": t0, "t_end": t_end,
                          "t_marks": marks, "layers_done_at_mark": done_at_mark,
                          "transfer": transfer.id})
            status = transfer.wait(timeout=60)
            channel.send({"state": transfer_pb2.TransferState.Name(status.state),
                          "error": status.error_message, "engine": status.engine,
                          "bytes": status.bytes_total, "layers_done": status.layers_done})
        if gpu_ready is not None:
            gpu_ready.close()


def run_decode(args, channel: Channel) -> None:
    import numpy as np
    import torch
    import kvrail
    from kvrail.flags import FlagArray
    spec = ModelSpec.from_json(args.model)
    model = build_model(spec, args.device)
    cuda = args.device != "cpu"
    with torch.inference_mode():  # warm-up: a prefill and two decode steps of a short dummy
        warm = new_cache()
        model(input_ids=prompt_ids(spec, 64, args.device), past_key_values=warm, use_cache=True)
    greedy(model, warm, 1, 2, args.device)
    with kvrail.connect(args.socket) as client:
        pool = PagedPool(client, spec, args.blocks, DECODE_TPB, "HND", args.device,
                         writable=True, name="decode pool")
        arrival_buffer = kvrail.HostBuffer(4096, "arrival flags")
        arrival_region = client.register_host_buffer(arrival_buffer, writable=True,
                                                     name="arrival flags")
        arrived = FlagArray(arrival_buffer, arrival_region, count=spec.layers)
        channel.send({"ready": "decode", "weights": weights_digest(model)})
        watcher: Optional[threading.Thread] = None
        landed: List[Optional[float]] = []
        table: List[int] = []
        for req in channel.requests():
            if req["op"] == "expect":
                r, table = req["request"], req["blocks"]
                pool.poison()  # a block the transfer misses reads NaN
                if cuda:
                    torch.cuda.synchronize(args.device)
                landed = [None] * spec.layers

                def watch(r=r, landed=landed):
                    for layer in range(spec.layers):
                        if not arrived.wait(layer, r, timeout=60):
                            return
                        landed[layer] = time.time()

                watcher = threading.Thread(target=watch, daemon=True)
                watcher.start()
                channel.send({"region": pool.region.id, "grant": pool.region.grant(write=True),
                              "blocks": table, "arrival_region": arrival_region.id,
                              "arrival_grant": arrival_region.grant(write=True)})
                continue
            # op "decode": the prefill's first token is known; generate once every layer landed.
            watcher.join(timeout=60)
            if any(t is None for t in landed):
                channel.send({"error": f"layers {[i for i, t in enumerate(landed) if t is None]} "
                                       f"did not arrive in 60 s"})
                continue
            corrupted = ""
            if req.get("corrupt"):
                corrupted = pool.corrupt_one_byte(table, args.tokens // 2)
            cache = pool.cache(table, args.tokens)
            timings = [time.time()]
            tokens, rows = greedy(model, cache, req["first_token"], args.new_tokens, args.device,
                                  timings)
            np.save(req["logits"], rows)
            # The prefill's TransferSpec.notification, delivered when the transfer ended.
            notified = [n.notification.decode() for n in client.poll_notifications(timeout=5)]
            channel.send({"tokens": tokens, "t_landed": landed,
                          "t_step0": timings[0], "t_step1": timings[1], "notified": notified,
                          "corrupted": corrupted})


def child_main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("role", choices=["reference", "prefill", "decode"])
    parser.add_argument("--model", required=True, help="ModelSpec as JSON")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--socket", default="")
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--new-tokens", type=int, required=True)
    parser.add_argument("--blocks", type=int, default=0, help="blocks of the role's pool")
    parser.add_argument("--logits", default="", help="reference: where its logits go (.npy)")
    args = parser.parse_args(argv)
    channel = Channel()
    setup_torch(args)
    {"reference": run_reference, "prefill": run_prefill, "decode": run_decode}[args.role](
        args, channel)
    return 0


# --- the driver side --------------------------------------------------------------------------
class Child:
    """A role process; its answers are read by a thread into a queue, so every read has a
    deadline. Ended by pid."""

    def __init__(self, name: str, argv: List[str], env: Dict[str, str]) -> None:
        self.name = name
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def send(self, message: dict) -> None:
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def read(self, timeout: float = 120) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.name}: no answer in {timeout} s") from None
        if line is None:
            raise RuntimeError(f"{self.name} exited {self.process.wait()} without answering")
        message = json.loads(line)
        if "error" in message and message["error"] and "state" not in message:
            raise RuntimeError(f"{self.name}: {message['error']}")
        return message

    def end(self) -> int:
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()  # its request loop ends
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


@dataclasses.dataclass
class Outcome:
    """One request through prefill -> kvrail -> decode, compared with the reference."""

    mode: str
    tokens: List[int]
    logits: object  # numpy [steps, vocab]
    same_tokens: bool
    max_logit_diff: float  # inf where a logit is NaN on one side only
    state: str
    engine: str
    bytes: int
    notified: List[str]
    layers_done_at_mark: List[int]
    corrupted: str
    prefill_ms: float
    kv_ms: float  # prefill end -> the last layer landed (decode's arrival flags)
    handover_ms: float  # prefill end -> first decode step starts
    step_ms: float  # the first decode step
    first_landed_ms: float  # prefill end -> layer 0 landed (negative: during the forward)

    @property
    def matches(self) -> bool:
        return self.same_tokens and self.max_logit_diff == 0.0

    @property
    def ttft_ms(self) -> float:
        return self.prefill_ms + self.handover_ms + self.step_ms


def logit_diff(a, b) -> float:
    import numpy as np
    if a.shape != b.shape:
        return float("inf")
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if (nan_a != nan_b).any():
        return float("inf")
    diff = np.abs(np.where(nan_a, 0, a) - np.where(nan_b, 0, b))
    return float(diff.max()) if diff.size else 0.0


def scattered(count: int, pool_blocks: int, seed: int) -> List[int]:
    """`count` distinct block ids of [0, pool_blocks) in a shuffled order."""
    return random.Random(seed).sample(range(pool_blocks), count)


class Handover:
    """kvraild and the three roles, for requests of one prompt. A context manager; close() ends
    every process it started, by pid."""

    def __init__(self, daemon: str, work: str, spec: ModelSpec, tokens: int, new_tokens: int,
                 prefill_device: str = "cpu", decode_device: str = "cpu",
                 threads: int = 1, python: str = sys.executable) -> None:
        self.spec, self.tokens, self.new_tokens, self.work = spec, tokens, new_tokens, work
        self.prefill_blocks = 2 * -(-tokens // PREFILL_TPB) + 5
        self.decode_blocks = 2 * -(-tokens // DECODE_TPB) + 3
        self.socket = os.path.join(work, "kvrail.sock")
        self.children: List[Child] = []
        self.daemon_log = os.path.join(work, "kvraild.log")
        with open(self.daemon_log, "wb") as log:
            self.daemon = subprocess.Popen([daemon, "--socket", self.socket, "--log-level",
                                            "info"], stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_daemon()
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            common = ["--model", spec.to_json(), "--threads", str(threads), "--socket",
                      self.socket, "--tokens", str(tokens), "--new-tokens", str(new_tokens)]
            me = os.path.abspath(__file__)
            self.reference_logits = os.path.join(work, "reference.npy")
            self.decode = self._child("decode", [python, me, "decode", "--device", decode_device,
                                                 "--blocks", str(self.decode_blocks), *common],
                                      env)
            self.prefill = self._child("prefill", [python, me, "prefill", "--device",
                                                   prefill_device, "--blocks",
                                                   str(self.prefill_blocks), *common], env)
            self.reference = self._child("reference", [python, me, "reference", "--device",
                                                       prefill_device, "--logits",
                                                       self.reference_logits, *common], env)
            ready = {c.name: c.read(timeout=300) for c in self.children}
            digests = {name: m["weights"] for name, m in ready.items()}
            if len(set(digests.values())) != 1:
                raise RuntimeError(f"the processes built different weights: {digests}")
            self.weights = digests["reference"]
            import numpy as np
            answer = self.reference.read(timeout=300)
            self.ref_tokens: List[int] = answer["tokens"]
            self.ref_logits = np.load(answer["logits"])
        except BaseException:
            self.close()
            raise
        self.requests = 0

    def _child(self, name: str, argv: List[str], env: Dict[str, str]) -> Child:
        child = Child(name, argv, env)
        self.children.append(child)
        return child

    def _wait_daemon(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.daemon.poll() is not None:
                raise RuntimeError(f"kvraild exited {self.daemon.returncode}: {self.log()}")
            if "ready: " in self.log():
                return
            time.sleep(0.02)
        raise RuntimeError(f"kvraild did not become ready: {self.log()}")

    def log(self) -> str:
        with open(self.daemon_log, errors="replace") as f:
            return f.read()

    def run(self, mode: str, corrupt: bool = False, probe: bool = False) -> Outcome:
        """One request: `mode` "streaming" or "bulk"; `corrupt` changes one byte of the decode
        pool after the transfer (the comparison must then fail); `probe` (CPU streaming) has the
        prefill read the transfer's layers_done before each mark."""
        import numpy as np
        if mode not in ("streaming", "bulk"):
            raise ValueError(f"mode: {mode!r}")
        self.requests += 1
        r = self.requests
        n_prefill = -(-self.tokens // PREFILL_TPB)
        n_decode = -(-self.tokens // DECODE_TPB)
        src_blocks = scattered(n_prefill, self.prefill_blocks, 100 + r)
        dst_blocks = scattered(n_decode, self.decode_blocks, 200 + r)
        self.decode.send({"op": "expect", "request": r, "blocks": dst_blocks})
        peer = self.decode.read()
        self.prefill.send({"request": r, "mode": mode, "blocks": src_blocks, "peer": peer,
                           "probe": probe})
        handed = self.prefill.read()
        logits_path = os.path.join(self.work, f"decode.{r}.npy")
        self.decode.send({"op": "decode", "first_token": handed["first_token"],
                          "corrupt": corrupt, "logits": logits_path})
        result = self.decode.read()
        done = self.prefill.read()
        logits = np.load(logits_path)
        end = handed["t_end"]
        return Outcome(
            mode=mode, tokens=result["tokens"], logits=logits,
            same_tokens=result["tokens"] == self.ref_tokens,
            max_logit_diff=logit_diff(logits, self.ref_logits), state=done["state"],
            engine=done["engine"], bytes=done["bytes"], notified=result["notified"],
            layers_done_at_mark=handed["layers_done_at_mark"], corrupted=result["corrupted"],
            prefill_ms=(end - handed["t_start"]) * 1e3,
            kv_ms=(max(result["t_landed"]) - end) * 1e3,
            handover_ms=(result["t_step0"] - end) * 1e3,
            step_ms=(result["t_step1"] - result["t_step0"]) * 1e3,
            first_landed_ms=(result["t_landed"][0] - end) * 1e3)

    def close(self) -> Dict[str, int]:
        """Ends the roles, then kvraild (SIGTERM, by pid); their exit codes."""
        codes = {c.name: c.end() for c in self.children}
        self.children = []
        if self.daemon.poll() is None:
            os.kill(self.daemon.pid, signal.SIGTERM)
            try:
                self.daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.daemon.pid, signal.SIGKILL)
                self.daemon.wait()
        codes["kvraild"] = self.daemon.returncode
        return codes

    def __enter__(self) -> "Handover":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def table(outcomes: Sequence[Outcome]) -> str:
    """The runs as a markdown table: handover time against time to first token."""
    lines = ["| mode | prefill ms | prefill end -> layer 0 landed ms | prefill end -> all KV "
             "landed ms | prefill end -> first decode step ms | first step ms | TTFT ms | "
             "handover share | tokens == reference | max logit diff | engine | bytes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| {o.mode} | {o.prefill_ms:.1f} | {o.first_landed_ms:.1f} | "
                     f"{o.kv_ms:.1f} | {o.handover_ms:.1f} | {o.step_ms:.1f} | "
                     f"{o.ttft_ms:.1f} | {100 * o.handover_ms / o.ttft_ms:.1f}% | "
                     f"{o.same_tokens} | {o.max_logit_diff:.3g} | {o.engine} | {o.bytes} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(child_main())

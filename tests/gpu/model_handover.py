#!/usr/bin/env python3
"""Issue 16's model test, on the GPU machine: a real model generates across the kvrail handover.

A Llama-architecture model with GQA (12 layers, 8 query heads, 2 KV heads, head_dim 128, bf16) is
built from a config with random weights (seeded; nothing is downloaded). Three processes:
  reference  runs the 4,096-token prompt and 64 greedy tokens in one process;
  prefill    runs the prompt, writes each layer's K/V into its paged pool (one tensor per layer,
             vLLM's [2, blocks, 16, kv_heads, head_dim] NHD) from forward hooks, and hands the
             blocks to the decode process through kvraild: "streaming" submits layer-wise
             transfers before the forward and signals each layer from its CUDA stream
             (kvrail.GpuFlags -> cuStreamWriteValue32) right after the layer's K/V copy;
             "bulk" submits after the forward;
  decode     owns a pool with another block size and order (32-token blocks, HND: [2, blocks,
             kv_heads, 32, head_dim]), waits for the daemon's arrival flags (CPU), rebuilds the
             cache from its pool and generates 64 tokens greedily (the first from prefill).
Its tokens must equal the reference's. Reported: time from the end of prefill (forward + first
token on the GPU) to the first decode step, streaming vs bulk, and the handover's share of time to
first token. Processes exchange JSON lines on pipes (no pickle).

  model_handover.py driver --daemon PATH [--layers 12] [--tokens 4096]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import torch

PREFILL_TPB, DECODE_TPB = 16, 32
KV_HEADS, HEAD_DIM, Q_HEADS = 2, 128, 8
NEW_TOKENS = 64


def build_model(layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=32000, hidden_size=Q_HEADS * HEAD_DIM, intermediate_size=2816,
                         num_hidden_layers=layers, num_attention_heads=Q_HEADS,
                         num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         max_position_embeddings=8192, tie_word_embeddings=False)
    torch.manual_seed(1234)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    return model.to(device="cuda:0", dtype=torch.bfloat16).eval()


def prompt_ids(tokens: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(99)
    return torch.randint(0, 32000, (1, tokens), generator=g).to("cuda:0")


def new_cache():
    from transformers import DynamicCache
    return DynamicCache()


def layer_kv(cache, layer: int):
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


@torch.inference_mode()
def greedy_steps(model, cache, first_token: int, steps: int) -> list:
    tokens = [first_token]
    token = torch.tensor([[first_token]], device="cuda:0")
    for _ in range(steps):
        logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits
        token = logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(int(token))
    return tokens


@torch.inference_mode()
def run_reference(args) -> dict:
    model = build_model(args.layers)
    ids = prompt_ids(args.tokens)
    model(input_ids=ids[:, :64], past_key_values=new_cache(), use_cache=True)  # warm-up
    cache = new_cache()
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
    first = int(logits[:, -1].argmax(-1))
    return {"tokens": greedy_steps(model, cache, first, NEW_TOKENS - 1)}


def emit(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def receive() -> dict:
    return json.loads(sys.stdin.readline())


@torch.inference_mode()
def run_decode(args) -> None:
    import kvrail
    from kvrail.flags import FlagArray
    from kvrail.tensors import register_kv_cache, register_tensor
    model = build_model(args.layers)
    blocks = args.tokens // DECODE_TPB
    pool_blocks = 2 * blocks
    # The request's blocks: scattered across the pool (every other block, reversed).
    table = [pool_blocks - 1 - 2 * i for i in range(blocks)]
    pools = [torch.zeros((2, pool_blocks, KV_HEADS, DECODE_TPB, HEAD_DIM), dtype=torch.bfloat16,
                         device="cuda:0") for _ in range(args.layers)]
    # Warm-up: a decode step over a short dummy cache (kernels, cuBLAS) before anything is timed.
    warm = new_cache()
    model(input_ids=prompt_ids(64), past_key_values=warm, use_cache=True)
    greedy_steps(model, warm, 1, 2)
    torch.cuda.synchronize()
    with kvrail.connect(args.socket) as client:
        if args.regions == "per-layer":  # one region over the per-layer tensors
            regions = [register_kv_cache(client, pools, layout="PBHTD", writable=True,
                                         name="decode pool")]
        else:
            regions = [register_tensor(client, p, layout="PBHTD", writable=True,
                                       name=f"decode L{i}") for i, p in enumerate(pools)]
        flag_buffer = kvrail.HostBuffer(4096, "arrival flags")
        flag_region = client.register_host_buffer(flag_buffer, writable=True, name="arrival")
        arrived = FlagArray(flag_buffer, flag_region, count=args.layers)
        # The prefill process writes into this process's regions: write grants go with the ids.
        emit({"regions": [r.id for r in regions], "grants": [r.grant(write=True) for r in regions],
              "blocks": table, "arrival_region": flag_region.id,
              "arrival_grant": flag_region.grant(write=True)})
        handed = receive()  # {"first_token": .., "t_prefill_end": ..}
        t_token = time.time()
        for layer in range(args.layers):
            if not arrived.wait(layer, 1, timeout=60):
                emit({"error": f"layer {layer} did not arrive"})
                return
        t_kv = time.time()
        # The prefill process's notification (TransferSpec.notification) of the handover's end.
        notified = [n.notification.decode() for n in client.poll_notifications(timeout=5)]
        cache = new_cache()
        for layer, pool in enumerate(pools):
            kv = pool[:, table]  # [2, blocks, heads, tpb, dim]
            kv = kv.permute(0, 2, 1, 3, 4).reshape(2, KV_HEADS, args.tokens, HEAD_DIM)
            cache.update(kv[0].unsqueeze(0), kv[1].unsqueeze(0), layer)
        t_step0 = time.time()
        tokens = greedy_steps(model, cache, handed["first_token"], 1)
        torch.cuda.synchronize()
        t_step1 = time.time()
        tokens += greedy_steps(model, cache, tokens[-1], NEW_TOKENS - 2)[1:]
        emit({"tokens": tokens, "t_token": t_token, "t_kv": t_kv, "t_step0": t_step0,
              "t_step1": t_step1, "notified": notified})


@torch.inference_mode()
def run_prefill(args) -> None:
    import kvrail
    from kvrail import transfer_pb2
    from kvrail.flags import FlagArray
    from kvrail.tensors import register_kv_cache, register_tensor
    peer = json.loads(args.peer)
    model = build_model(args.layers)
    ids = prompt_ids(args.tokens)
    blocks = args.tokens // PREFILL_TPB
    pool_blocks = blocks + 37
    table = [(7 * i + 3) % pool_blocks for i in range(blocks)]  # scattered, distinct
    index = torch.tensor(table, device="cuda:0")
    pools = [torch.zeros((2, pool_blocks, PREFILL_TPB, KV_HEADS, HEAD_DIM), dtype=torch.bfloat16,
                         device="cuda:0") for _ in range(args.layers)]
    model(input_ids=ids[:, :64], past_key_values=new_cache(), use_cache=True)  # warm-up
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with kvrail.connect(args.socket) as client:
        if args.regions == "per-layer":
            regions = [register_kv_cache(client, pools, layout="vllm_nhd", writable=False,
                                         name="prefill pool")]
        else:
            regions = [register_tensor(client, p, layout="PBTHD", writable=False,
                                       name=f"prefill L{i}") for i, p in enumerate(pools)]
        ready_buffer = kvrail.HostBuffer(4096, "ready flags")
        ready_region = client.register_host_buffer(ready_buffer, writable=False, name="ready")
        ready = FlagArray(ready_buffer, ready_region, count=args.layers)
        gpu_ready = ready.for_gpu(0) if args.mode == "streaming" else None

        def submit_all():
            """One transfer of every layer (per-layer regions), or one per layer."""
            if args.regions != "per-layer":
                return [submit(layer) for layer in range(args.layers)]
            spec = transfer_pb2.TransferSpec(num_tokens=args.tokens, label="handover",
                                             notification=b"request-0 handed over")
            spec.src.region_id = regions[0].id
            spec.src.block_ids.extend(table)
            spec.dst.region_id = peer["regions"][0]
            spec.dst.grant = peer["grants"][0]
            spec.dst.block_ids.extend(peer["blocks"])
            spec.arrival_flags.CopyFrom(transfer_pb2.FlagArray(
                region_id=peer["arrival_region"], byte_offset=0, value=1,
                grant=peer["arrival_grant"]))
            if gpu_ready is not None:
                spec.ready_flags.CopyFrom(transfer_pb2.FlagArray(
                    region_id=ready_region.id, byte_offset=0, value=1))
            return [client.submit(spec)]

        def submit(layer: int):
            spec = transfer_pb2.TransferSpec(num_tokens=args.tokens, label=f"handover L{layer}",
                                             notification=f"request-0 L{layer}".encode())
            spec.src.region_id = regions[layer].id
            spec.src.block_ids.extend(table)
            spec.dst.region_id = peer["regions"][layer]
            spec.dst.grant = peer["grants"][layer]
            spec.dst.block_ids.extend(peer["blocks"])
            spec.arrival_flags.CopyFrom(transfer_pb2.FlagArray(
                region_id=peer["arrival_region"], byte_offset=4 * layer, value=1,
                grant=peer["arrival_grant"]))
            if gpu_ready is not None:
                spec.ready_flags.CopyFrom(transfer_pb2.FlagArray(
                    region_id=ready_region.id, byte_offset=4 * layer, value=1))
            return client.submit(spec)

        cache = new_cache()

        def hook(layer: int):
            def after_layer(module, inputs, output):
                k, v = layer_kv(cache, layer)  # [1, heads, tokens, dim]
                for part, x in enumerate((k, v)):
                    paged = x[0].transpose(0, 1).reshape(blocks, PREFILL_TPB, KV_HEADS, HEAD_DIM)
                    pools[layer][part].index_copy_(0, index, paged)
                if gpu_ready is not None:
                    gpu_ready.signal(layer, 1, torch.cuda.current_stream())
            return after_layer

        handles = [layer_module.register_forward_hook(hook(i))
                   for i, layer_module in enumerate(model.model.layers)]
        transfers = submit_all() if gpu_ready else []
        t0 = time.time()
        with torch.cuda.stream(stream):
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
            first = logits[:, -1].argmax(-1)
        stream.synchronize()
        t_end = time.time()
        for h in handles:
            h.remove()
        if not transfers:
            transfers = submit_all()
        emit({"first_token": int(first), "t_prefill_start": t0, "t_prefill_end": t_end,
              "transfers": [t.id for t in transfers]})
        statuses = [t.wait(timeout=60) for t in transfers]
        emit({"states": [s.state for s in statuses],
              "engines": sorted({s.engine for s in statuses}),
              "bytes": sum(s.bytes_total for s in statuses)})
        if gpu_ready is not None:
            gpu_ready.close()


def child(mode: str, args, extra=()) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), mode, "--socket", args.socket,
           "--layers", str(args.layers), "--tokens", str(args.tokens), *extra]
    if mode in ("decode", "prefill"):
        cmd += ["--regions", args.regions]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def read_line(process: subprocess.Popen) -> dict:
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"child exited {process.wait()} without answering")
    message = json.loads(line)
    if "error" in message:
        raise RuntimeError(message["error"])
    return message


def run_driver(args) -> int:
    work = tempfile.mkdtemp(prefix="handover.", dir="/tmp")
    args.socket = os.path.join(work, "k.sock")
    log = open(os.path.join(work, "kvraild.log"), "wb")
    daemon = subprocess.Popen([args.daemon, "--socket", args.socket, "--log-level", "info"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(200):
            if os.path.exists(args.socket):
                break
            time.sleep(0.05)
        reference = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "reference", "--socket", args.socket,
             "--layers", str(args.layers), "--tokens", str(args.tokens)],
            check=True, capture_output=True, text=True).stdout
        ref_tokens = json.loads(reference.strip().splitlines()[-1])["tokens"]
        print(f"reference (one process): {len(ref_tokens)} tokens, first 8 {ref_tokens[:8]}")
        rows = []
        ok = True
        runs = [("per-layer", m) for m in ("bulk", "streaming", "bulk", "streaming")]
        runs += [("per-tensor", m) for m in ("bulk", "streaming")]
        for regions, mode in runs:
            args.regions = regions
            decode = child("decode", args)
            peer = read_line(decode)
            prefill = child("prefill", args, ["--mode", mode, "--peer", json.dumps(peer)])
            handed = read_line(prefill)
            decode.stdin.write(json.dumps(handed) + "\n")
            decode.stdin.flush()
            result = read_line(decode)
            done = read_line(prefill)
            prefill.wait(timeout=60)
            decode.wait(timeout=60)
            same = result["tokens"] == ref_tokens
            ok = ok and same and all(s == 3 for s in done["states"])
            prefill_ms = (handed["t_prefill_end"] - handed["t_prefill_start"]) * 1e3
            handover_ms = (result["t_step0"] - handed["t_prefill_end"]) * 1e3
            kv_ms = (result["t_kv"] - handed["t_prefill_end"]) * 1e3
            step_ms = (result["t_step1"] - result["t_step0"]) * 1e3
            ttft = prefill_ms + handover_ms + step_ms
            ok = ok and len(result["notified"]) == len(done["states"])
            rows.append((f"{mode}, {regions} ({len(done['states'])} transfer"
                         f"{'s' if len(done['states']) > 1 else ''})", prefill_ms, kv_ms,
                         handover_ms, step_ms, ttft, 100 * handover_ms / ttft, same,
                         done["engines"], done["bytes"], len(result["notified"])))
            # Each run's row as soon as it is known: a later run that fails loses nothing.
            print(f"run: {rows[-1][0]}: tokens == reference {same}, prefill end -> first "
                  f"decode step {handover_ms:.2f} ms, all KV landed {kv_ms:.2f} ms, states "
                  f"{done['states']}, notified {len(result['notified'])}", flush=True)
        print(f"model: Llama GQA, {args.layers} layers, {Q_HEADS} q / {KV_HEADS} kv heads, "
              f"head_dim {HEAD_DIM}, bf16; prompt {args.tokens} tokens; {NEW_TOKENS} new tokens")
        print("| mode | prefill ms | prefill end -> all KV landed ms | prefill end -> first decode "
              "step ms | first step ms | TTFT ms | handover share | tokens == reference | engine "
              "| bytes | decode notified |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]:.2f} | {r[2]:.2f} | {r[3]:.2f} | {r[4]:.2f} | {r[5]:.2f} | "
                  f"{r[6]:.1f}% | {r[7]} | {','.join(r[8])} | {r[9]} | {r[10]} |")
        print("RESULT:", "identical tokens in every run" if ok else "MISMATCH or failed transfer")
        return 0 if ok else 1
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["driver", "reference", "prefill", "decode"])
    parser.add_argument("--daemon", default=".devpack/bin/kvraild")
    parser.add_argument("--socket", default="")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--mode", choices=["bulk", "streaming"], default="bulk")
    parser.add_argument("--peer", default="{}")
    parser.add_argument("--regions", choices=["per-layer", "per-tensor"], default="per-layer")
    args = parser.parse_args()
    if args.role == "driver":
        return run_driver(args)
    if args.role == "reference":
        emit(run_reference(args))
    elif args.role == "prefill":
        run_prefill(args)
    else:
        run_decode(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

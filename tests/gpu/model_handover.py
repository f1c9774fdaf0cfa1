#!/usr/bin/env python3
"""A real model across the kvrail handover on the GPU machine: prefill on one GPU, decode on
another.

The model (Llama architecture with GQA: 12 layers, 8 query / 2 KV heads, head_dim 128, bf16,
random weights from a seed; nothing is downloaded) and the three processes are those of
tests/model/handover.py, the module the CPU test (//tests/model:model_handover_test) runs in CI:
the prefill process writes each layer's K/V into its vLLM-shaped NHD pool (16-token blocks) from
forward hooks and pushes the blocks through kvraild into the decode process's HND pool (32-token
blocks, other scattered ids), which rebuilds a DynamicCache and generates greedily. Here: a
4,096-token prompt and 64 tokens; the prefill process (and the one-process reference) on
--prefill-gpu (default 0), the decode process on --decode-gpu (default 1 when two GPUs are
visible, else 0). "streaming" submits the transfer before the forward and signals each layer from
its CUDA stream (cuStreamWriteValue32 into TransferSpec.ready_flags); "bulk" submits it after the
forward. Printed: the handover (prefill end -> first decode step) against time to first token,
streaming vs bulk, and whether every run's tokens equal the reference's. Exit 1 on a mismatch or
a failed transfer. Needs only torch, transformers and numpy beside the kvrail package.

  model_handover.py driver --daemon PATH [--prefill-gpu 0] [--decode-gpu 1] [--tokens 4096]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from typing import List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "model"))
import handover  # noqa: E402  (tests/model/handover.py)

SUCCEEDED = "TRANSFER_STATE_SUCCEEDED"


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("role", nargs="?", choices=["driver"], default="driver")
    parser.add_argument("--daemon", default=".devpack/bin/kvraild")
    parser.add_argument("--prefill-gpu", type=int, default=0)
    parser.add_argument("--decode-gpu", type=int, default=None,
                        help="default: 1 when two GPUs are visible, else 0")
    parser.add_argument("--layers", type=int, default=handover.GPU_MODEL.layers)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--runs", default="bulk,streaming,bulk,streaming",
                        help="modes in order, comma-separated")
    return parser.parse_args(argv)


def devices(args: argparse.Namespace, gpu_count: int) -> Tuple[str, str]:
    """The prefill's and the decode's torch devices; ValueError naming the flag that is out of
    range."""
    decode = args.decode_gpu if args.decode_gpu is not None else (1 if gpu_count >= 2 else 0)
    for flag, ordinal in (("--prefill-gpu", args.prefill_gpu), ("--decode-gpu", decode)):
        if not 0 <= ordinal < gpu_count:
            raise ValueError(f"{flag}: GPU {ordinal} is not one of the {gpu_count} visible")
    return f"cuda:{args.prefill_gpu}", f"cuda:{decode}"


def modes(args: argparse.Namespace) -> List[str]:
    runs = [m.strip() for m in args.runs.split(",") if m.strip()]
    bad = [m for m in runs if m not in ("bulk", "streaming")]
    if bad or not runs:
        raise ValueError(f"--runs: {bad or 'empty'}: each run is bulk or streaming")
    return runs


def run_line(o: "handover.Outcome") -> str:
    return (f"run: {o.mode}: tokens == reference {o.same_tokens} (max logit diff "
            f"{o.max_logit_diff:.3g}), prefill end -> first decode step {o.handover_ms:.2f} ms "
            f"of TTFT {o.ttft_ms:.2f} ms, all KV landed {o.kv_ms:.2f} ms, layer 0 landed "
            f"{o.first_landed_ms:.2f} ms, {o.state}, {o.engine}, {o.bytes} bytes, notified "
            f"{o.notified}")


def verdict(outcomes: Sequence["handover.Outcome"]) -> bool:
    """Every run generated the reference's tokens, its transfer succeeded and the decode process
    was notified of it."""
    return bool(outcomes) and all(o.same_tokens and o.state == SUCCEEDED and len(o.notified) == 1
                                  for o in outcomes)


def report(spec: "handover.ModelSpec", tokens: int, new_tokens: int, where: str,
           outcomes: Sequence["handover.Outcome"]) -> bool:
    """Prints the model line, the table and the RESULT line; the verdict."""
    ok = verdict(outcomes)
    print(f"model: Llama GQA, {spec.layers} layers, {spec.q_heads} q / {spec.kv_heads} kv heads, "
          f"head_dim {spec.head_dim}, {spec.dtype}; prompt {tokens} tokens; {new_tokens} new "
          f"tokens; {where}")
    print(handover.table(outcomes))
    print("RESULT:", "identical tokens in every run" if ok else "MISMATCH or failed transfer")
    return ok


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    runs = modes(args)
    import torch
    count = torch.cuda.device_count()
    if count == 0:
        print("model_handover: no GPU visible", file=sys.stderr)
        return 2
    prefill, decode = devices(args, count)
    spec = dataclasses.replace(handover.GPU_MODEL, layers=args.layers)
    work = tempfile.mkdtemp(prefix="handover.", dir="/tmp")
    where = f"prefill on {prefill}, decode on {decode}"
    print(f"model handover: {where}, {count} GPU(s) visible", flush=True)
    with handover.Handover(os.path.abspath(args.daemon), work, spec, args.tokens,
                           args.new_tokens, prefill, decode) as h:
        print(f"reference (one process, {prefill}): {len(h.ref_tokens)} tokens, first 8 "
              f"{h.ref_tokens[:8]}", flush=True)
        outcomes = []
        for mode in runs:
            outcomes.append(h.run(mode))
            print(run_line(outcomes[-1]), flush=True)  # each row as soon as it is known
    return 0 if report(spec, args.tokens, args.new_tokens, where, outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())

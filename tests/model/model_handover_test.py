"""A real model across the kvrail handover, on the CPU (tests/model/handover.py has the roles).

A Llama-architecture model with GQA (4 layers, 8 query / 2 KV heads, head_dim 64, bf16, random
weights from a seed) runs a 512-token prompt in a prefill process, whose forward hooks write each
layer's K/V into a vLLM-shaped NHD pool of 16-token blocks (kvrail HostBuffers seen by torch) and
mark the layer ready; kvraild moves the blocks into a decode process's HND pool of 32-token
blocks at other scattered ids; the decode process rebuilds a DynamicCache from its pool and
generates 32 tokens greedily. Tokens and every step's logits must equal, bit for bit, those of
one process running the same model on the same prompt; one byte changed in the decode pool after
the transfer must make them differ.

KVRAIL_MODEL_CORRUPT=1 corrupts the byte in the runs that must match too: the test then fails,
showing the comparison can fail.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

import handover
import model_handover  # tests/gpu/model_handover.py: its CPU-reachable logic is checked here

TOKENS, NEW_TOKENS = 512, 32
SUCCEEDED = "TRANSFER_STATE_SUCCEEDED"
FORCE_CORRUPT = os.environ.get("KVRAIL_MODEL_CORRUPT") == "1"
OUTCOMES = []


@pytest.fixture(scope="module")
def session():
    daemon = os.environ.get("KVRAIL_DAEMON")
    assert daemon, "KVRAIL_DAEMON is not set (run through bazel test //tests/model:...)"
    work = tempfile.mkdtemp(prefix="kvmodel.", dir="/tmp")
    h = handover.Handover(daemon, work, handover.CPU_MODEL, TOKENS, NEW_TOKENS)
    yield h
    codes = h.close()
    shutil.rmtree(work, ignore_errors=True)
    assert set(codes.values()) == {0}, codes


def expected_bytes() -> int:
    m = handover.CPU_MODEL
    return m.layers * 2 * TOKENS * m.kv_heads * m.head_dim * 2  # bf16


def check_handover(o: handover.Outcome, session) -> None:
    print(model_handover.run_line(o), o.corrupted)
    assert o.state == SUCCEEDED, o
    assert o.engine == "host"
    assert o.bytes == expected_bytes()
    assert o.notified == [f"request-{session.requests}"]
    assert o.same_tokens, f"tokens {o.tokens} != reference {session.ref_tokens}"
    assert o.max_logit_diff == 0.0, f"logits differ from the reference's by {o.max_logit_diff}"


def test_the_reference_depends_on_its_cache(session):
    # A random model that repeated one token would pass any comparison: these tokens vary.
    assert len(session.ref_tokens) == NEW_TOKENS + 1
    assert len(set(session.ref_tokens)) >= NEW_TOKENS // 2, session.ref_tokens
    assert session.ref_logits.shape == (NEW_TOKENS, handover.CPU_MODEL.vocab)


def test_streaming_handover_generates_the_reference_tokens(session):
    o = session.run("streaming", corrupt=FORCE_CORRUPT, probe=True)
    OUTCOMES.append(o)
    # Before the prefill marked layer i, the daemon had moved no layer it was not told of.
    assert len(o.layers_done_at_mark) == handover.CPU_MODEL.layers
    assert all(done <= i for i, done in enumerate(o.layers_done_at_mark)), o.layers_done_at_mark
    print("layers landed when each layer was marked:", o.layers_done_at_mark)
    check_handover(o, session)


def test_bulk_handover_generates_the_reference_tokens(session):
    o = session.run("bulk", corrupt=FORCE_CORRUPT)
    OUTCOMES.append(o)
    check_handover(o, session)


def test_one_corrupted_byte_changes_the_output(session):
    o = session.run("streaming", corrupt=True)
    print(model_handover.run_line(o))
    print("corrupted:", o.corrupted, "| tokens changed:",
          sum(a != b for a, b in zip(o.tokens, session.ref_tokens)), "of", len(o.tokens))
    assert o.state == SUCCEEDED and o.corrupted
    assert not o.matches
    # Detectably: the tokens change or a logit moves by far more than bf16's rounding.
    assert not o.same_tokens or o.max_logit_diff >= 0.1, o.max_logit_diff
    # The GPU script's verdict goes by tokens: it must reject a run whose tokens changed.
    assert o.same_tokens or not model_handover.verdict([o])


def test_gpu_script_logic():
    args = model_handover.parse_args(["driver", "--daemon", "kvraild"])
    assert (args.tokens, args.new_tokens, args.prefill_gpu) == (4096, 64, 0)
    assert model_handover.devices(args, 2) == ("cuda:0", "cuda:1")
    assert model_handover.devices(args, 1) == ("cuda:0", "cuda:0")
    with pytest.raises(ValueError, match="--decode-gpu"):
        model_handover.devices(model_handover.parse_args(["--decode-gpu", "2"]), 2)
    with pytest.raises(ValueError, match="--runs"):
        model_handover.modes(model_handover.parse_args(["--runs", "bulk,fast"]))
    assert model_handover.modes(args) == ["bulk", "streaming", "bulk", "streaming"]
    assert handover.GPU_MODEL.dtype == "bfloat16" and handover.GPU_MODEL.kv_heads == 2


def test_report_of_the_runs():
    assert len(OUTCOMES) == 2, "the handover tests ran first"
    ok = model_handover.report(handover.CPU_MODEL, TOKENS, NEW_TOKENS, "CPU, 1 thread each",
                               OUTCOMES)
    assert ok == all(o.same_tokens for o in OUTCOMES)
    assert ok


def test_pool_round_trip_with_a_partial_last_block():
    # The paging arithmetic on its own: NHD and HND pools, 37 tokens (a partial last block).
    import torch
    spec = handover.ModelSpec(layers=1, kv_heads=2, head_dim=8)

    class Plain(handover.PagedPool):
        def __init__(self, tpb, order):  # host tensors only, no daemon
            self.spec, self.blocks, self.tpb, self.order, self.device = spec, 6, tpb, order, "cpu"
            shape = (2, 6, tpb, 2, 8) if order == "NHD" else (2, 6, 2, tpb, 8)
            self.tensors = [torch.full(shape, float("nan"), dtype=torch.bfloat16)]

    keys = torch.randn(1, 2, 37, 8).to(torch.bfloat16)
    values = torch.randn(1, 2, 37, 8).to(torch.bfloat16)
    for tpb, order, table in ((16, "NHD", [4, 0, 2]), (8, "HND", [5, 1, 3, 0, 2])):
        pool = Plain(tpb, order)
        pool.write_layer(0, keys, values, table)
        k, v = pool.read_layer(0, table, 37)
        assert torch.equal(k, keys) and torch.equal(v, values)
        with pytest.raises(ValueError, match="table"):
            pool.write_layer(0, keys, values, table[:-1])

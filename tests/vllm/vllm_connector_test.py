"""The kvrail vLLM connector between two instances of vLLM's own Scheduler (vllm from PyPI, CPU,
no model: the harness writes each token's K and V the way attention layers do), through a live
kvraild's host engine. The prefill caches NHD (LBNHC) in blocks of 16 tokens, the decode HND
(LBHNC, vLLM's CPU attention layout) in blocks of 32: the daemon converts both.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import pytest

import kvrail
import kvrail.vllm as kvv
import vllm_harness as H
from kvrail.proto import transfer_pb2
from vllm.v1.kv_cache_layout import KVCacheLayout

LAYERS, HEADS, HEAD_DIM = 4, 2, 64
TOKEN_BYTES = LAYERS * 2 * HEADS * HEAD_DIM * 2  # K and V, fp16
POISON = 0x5A5A


@pytest.fixture(scope="module")
def daemon():
    d = H.Daemon()
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture(scope="module")
def model():
    return H.model_dir(num_layers=LAYERS, kv_heads=HEADS, head_dim=HEAD_DIM)


def make(name, model, daemon, **kw):
    block_size = kw.pop("block_size", 16 if name.startswith("p") else 32)
    layout = kw.pop("kv_layout", KVCacheLayout.LBNHC if name.startswith("p")
                    else KVCacheLayout.LBHNC)
    return H.Instance(name, model, daemon.socket, block_size=block_size, kv_layout=layout,
                      num_layers=LAYERS, kv_heads=HEADS, head_dim=HEAD_DIM, **kw)


@pytest.fixture(scope="module")
def pd(daemon, model):
    p, d = make("prefill", model, daemon), make("decode", model, daemon)
    yield p, d
    p.close()
    d.close()


@pytest.fixture(scope="module")
def streaming(daemon, model):
    """A prefill whose params make pulls wait on its layer ready flags."""
    p = make("p-stream", model, daemon, streaming=True)
    yield p
    p.close()


@pytest.fixture
def client(daemon):
    with kvrail.connect(daemon.socket) as c:
        yield c


def prompt_of(n, seed):
    return [int(x) for x in np.random.default_rng(seed).integers(1, 900, n)]


def pull_status(client, req_id):
    found = client.list_transfers(label=f"vllm {req_id}")
    assert len(found) == 1, f"{req_id}: {len(found)} pulls"
    return found[0]


def step_until_received(dec, others, req_id, timeout_s=60.0):
    """Steps until the decode's worker reports `req_id` received; the cache is read right then,
    before a forward pass of the decode writes the request's next tokens."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for inst in [dec] + others:
            inst.step()
            if inst is dec and req_id in (dec.last_results.finished_recving or ()):
                return
        time.sleep(0.001)
    raise AssertionError(f"{req_id}: never received")


def finish(dec, others, req_id):
    H.run_until([dec] + others, lambda: any(o.finished for o in dec.outputs.get(req_id, [])))


def assert_pulled(dec, req_id, prompt, positions):
    got = dec.token_bytes(req_id, positions)
    want = H.expected_bytes(prompt, positions, LAYERS, HEADS, HEAD_DIM)
    bad = np.argwhere((got != want).any(axis=(1, 2, 3)))
    assert bad.size == 0, f"{req_id}: tokens {[positions[i] for i in bad[:, 0]]} differ"


def test_connector_is_vllms_base_class():
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
    from vllm.config import KVTransferConfig
    cls = KVConnectorFactory.get_connector_class(KVTransferConfig(
        kv_connector="KvrailConnector", kv_connector_module_path="kvrail.vllm",
        kv_role="kv_both"))
    assert issubclass(cls, KVConnectorBase_V1) and cls.__module__ == "kvrail.vllm"


def test_pull_byte_for_byte_with_partial_last_block(pd, client):
    p, dec = pd
    prompt = prompt_of(75, 1)  # 4 blocks + 11 tokens at 16, 2 blocks + 11 at 32
    params = H.prefill(p, "a-p", prompt)
    assert params["remote_num_tokens"] == 75 and len(params["remote_block_ids"]) == 5
    assert params["kvrail"]["epoch"] == 0  # kvrail_layer_streaming is off by default
    assert not p.worker._work()._flags_buffer.ndarray("uint32").any(), "marks without streaming"
    assert "a-p" in p.scheduler.requests, "the prefill must hold its blocks until pulled"
    dec.request("a-d", prompt, max_tokens=3, params=params)
    step_until_received(dec, [p], "a-d")
    assert_pulled(dec, "a-d", prompt, range(75))
    # The rest of the last decode block was not written (nothing past the prompt moved).
    tail = dec.token_bytes("a-d", range(75, 96))
    assert (tail == POISON).all()
    status = pull_status(client, "a-d")
    assert status.state == transfer_pb2.TRANSFER_STATE_SUCCEEDED
    assert status.bytes_total == 75 * TOKEN_BYTES and status.engine == "host"
    # The pull's notification frees the prefill's blocks (long before its 120 s TTL).
    started = time.monotonic()
    H.run_until([p], lambda: "a-p" not in p.scheduler.requests, timeout_s=30)
    assert time.monotonic() - started < 30
    finish(dec, [p], "a-d")
    assert len(p.scheduler.requests) == 0
    H.run_until([dec], lambda: not dec.scheduler.requests)


def test_producer_and_consumer_roles(daemon, model, client):
    """kv_role kv_producer on the prefill and kv_consumer on the decode work as kv_both does."""
    p = make("p-producer", model, daemon, kv_role="kv_producer")
    dec = make("d-consumer", model, daemon, kv_role="kv_consumer")
    try:
        prompt = prompt_of(50, 16)
        params = H.prefill(p, "o-p", prompt)
        dec.request("o-d", prompt, max_tokens=2, params=params)
        step_until_received(dec, [p], "o-d")
        assert_pulled(dec, "o-d", prompt, range(50))
        finish(dec, [p], "o-d")
        H.run_until([p, dec], lambda: not p.scheduler.requests and not dec.scheduler.requests)
        assert pull_status(client, "o-d").state == transfer_pb2.TRANSFER_STATE_SUCCEEDED
    finally:
        p.close()
        dec.close()


def test_prefix_hit_pulls_only_the_missing_tokens(pd, client):
    p, dec = pd
    base = prompt_of(64, 2)
    first = base + prompt_of(40, 3)
    params = H.prefill(p, "b1-p", first)
    dec.request("b1-d", first, max_tokens=2, params=params)
    finish(dec, [p], "b1-d")
    assert pull_status(client, "b1-d").bytes_total == 104 * TOKEN_BYTES
    # Same first 64 tokens: both instances hold them (prefill: 4 blocks, decode: 2 blocks).
    second = base + prompt_of(30, 4)
    params = H.prefill(p, "b2-p", second)
    assert params["remote_prefill_cached_tokens"] == 64 if "remote_prefill_cached_tokens" \
        in params else True
    dec.request("b2-d", second, max_tokens=2, params=params)
    step_until_received(dec, [p], "b2-d")
    status = pull_status(client, "b2-d")
    assert status.state == transfer_pb2.TRANSFER_STATE_SUCCEEDED
    assert status.bytes_total == 30 * TOKEN_BYTES, "a local prefix hit must not be pulled again"
    assert_pulled(dec, "b2-d", second, range(94))
    finish(dec, [p], "b2-d")
    H.run_until([p, dec], lambda: not p.scheduler.requests and not dec.scheduler.requests)


def test_layers_stream_as_the_prefill_marks_them(pd, streaming, client):
    """With kvrail_layer_streaming, a pull ordered before the prefill's kernels finished waits per
    layer for the prefill's save_kv_layer marks of the step that wrote the request."""
    _, dec = pd
    p = streaming
    prompt = prompt_of(50, 5)
    p.request("c-p", prompt, max_tokens=1, params={"do_remote_decode": True})
    p.step(save_layers=False)  # one step computes the prompt; its layers are not marked yet
    final = [o for o in p.outputs["c-p"] if o.finished]
    assert final, "the prefill should finish in one step"
    params = final[-1].kv_transfer_params
    epoch = params["kvrail"]["epoch"]
    dec.request("c-d", prompt, max_tokens=2, params=params)
    dec.step()  # orders the pull, which waits for the prefill's layer marks
    dec.poison("c-d")  # its blocks were other requests' before
    for _ in range(2):
        dec.step()
    time.sleep(0.2)
    status = pull_status(client, "c-d")
    assert status.state in (transfer_pb2.TRANSFER_STATE_QUEUED,
                            transfer_pb2.TRANSFER_STATE_RUNNING)
    assert status.layers_done == 0
    assert (dec.token_bytes("c-d", range(50)) == POISON).all()
    words = p.worker._work()._flags_buffer.ndarray("uint32")
    assert (words < epoch).all()
    p.mark_saved(epoch, layers=[0, 1])
    assert (words[:2] == epoch).all() and (words[2:] < epoch).all()
    deadline = time.monotonic() + 5
    while pull_status(client, "c-d").layers_done < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    status = pull_status(client, "c-d")
    assert status.layers_done == 2 and status.state == transfer_pb2.TRANSFER_STATE_RUNNING
    got = dec.token_bytes("c-d", range(50))
    want = H.expected_bytes(prompt, range(50), LAYERS, HEADS, HEAD_DIM)
    assert (got[:, :2] == want[:, :2]).all() and (got[:, 2:] == POISON).all()
    p.mark_saved(epoch, layers=[2, 3])
    step_until_received(dec, [p], "c-d")
    assert_pulled(dec, "c-d", prompt, range(50))
    finish(dec, [p], "c-d")
    H.run_until([p, dec], lambda: not p.scheduler.requests and not dec.scheduler.requests)


def test_decode_abort_while_pulling_frees_both_sides(pd, streaming, client):
    _, dec = pd
    p = streaming  # its unmarked layers hold the pull in flight
    prompt = prompt_of(40, 6)
    p.request("e-p", prompt, max_tokens=1, params={"do_remote_decode": True})
    p.step(save_layers=False)  # the pull will wait for these layers
    params = [o for o in p.outputs["e-p"] if o.finished][-1].kv_transfer_params
    free_before = dec.num_free_blocks()
    dec.request("e-d", prompt, max_tokens=2, params=params)
    dec.step()
    assert dec.num_free_blocks() < free_before and "e-d" in dec.scheduler.requests
    dec.abort("e-d")
    assert "e-d" in dec.scheduler.requests, "vLLM keeps the blocks of a pull in flight"
    started = time.monotonic()
    H.run_until([dec, p], lambda: "e-d" not in dec.scheduler.requests
                and "e-p" not in p.scheduler.requests, timeout_s=30)
    assert time.monotonic() - started < 30, "the cancellation must free the prefill's blocks"
    assert pull_status(client, "e-d").state == transfer_pb2.TRANSFER_STATE_CANCELLED
    assert dec.num_free_blocks() == free_before
    assert "e-d" not in dec.outputs or not any(o.new_token_ids for o in dec.outputs["e-d"])


def test_decode_abort_before_scheduling_releases_the_prefill(pd, client):
    p, dec = pd
    prompt = prompt_of(33, 7)
    params = H.prefill(p, "f-p", prompt)
    dec.request("f-d", prompt, max_tokens=2, params=params)
    dec.abort("f-d")  # never scheduled: the router gave up on it
    started = time.monotonic()
    H.run_until([dec, p], lambda: "f-p" not in p.scheduler.requests
                and "f-d" not in dec.scheduler.requests, timeout_s=30)
    assert time.monotonic() - started < 30
    release = client.list_transfers(label="vllm release f-d")
    assert len(release) == 1 and release[0].state == transfer_pb2.TRANSFER_STATE_CANCELLED
    assert release[0].bytes_done == 0
    assert not client.list_transfers(label="vllm f-d")


def test_prefill_abort_frees_at_once(pd):
    p, _ = pd
    free_before = p.num_free_blocks()
    p.request("g-p", prompt_of(600, 8), max_tokens=1, params={"do_remote_decode": True})
    p.step()  # 256 of 600 tokens (chunked prefill)
    assert p.num_free_blocks() < free_before
    p.abort("g-p")
    assert "g-p" not in p.scheduler.requests and p.num_free_blocks() == free_before
    assert all(o.kv_transfer_params is None for o in p.outputs.get("g-p", []))
    p.step()  # the worker forgets the request (metadata's not_processed)
    assert "g-p" not in p.worker._work()._in_batch


def test_decode_that_never_pulls_frees_after_the_ttl(daemon, model):
    p = make("p-ttl", model, daemon, ttl_s=3.0)
    try:
        free_before = p.num_free_blocks()
        params = H.prefill(p, "h-p", prompt_of(45, 9))  # its params go nowhere
        assert params["remote_blocks_expire_unix"] > time.time()
        started = time.monotonic()
        for _ in range(5):
            p.step()
            time.sleep(0.05)
        assert "h-p" in p.scheduler.requests, "freed before the TTL"
        H.run_until([p], lambda: "h-p" not in p.scheduler.requests, timeout_s=30, sleep=0.01)
        assert 2.9 <= time.monotonic() - started < 30
        assert p.num_free_blocks() == free_before
    finally:
        p.close()


def test_a_decode_after_the_expiry_computes_locally(daemon, model, pd, client):
    """Blocks past their TTL may be reused by the prefill: a decode scheduled after
    remote_blocks_expire_unix (less the margin) never reads them; it computes the prompt."""
    _, dec = pd
    p = make("p-expired", model, daemon, ttl_s=1.0)
    try:
        prompt = prompt_of(30, 12)
        params = H.prefill(p, "k-p", prompt)
        H.run_until([p], lambda: not p.scheduler.requests, sleep=0.01)
        dec.request("k-d", prompt, max_tokens=2, params=params)
        dec.step()
        assert dec.scheduler.requests["k-d"].num_computed_tokens == 30
        assert_pulled(dec, "k-d", prompt, range(30))
        finish(dec, [p], "k-d")
        assert not client.list_transfers(label="vllm k-d")
        assert not client.list_transfers(label="vllm release k-d")
    finally:
        p.close()


def test_only_a_read_of_the_prefill_frees_its_blocks(daemon, model, pd):
    """A notification naming the request for a transfer that wrote into the prefill's cache (not
    a read of it) does not free the request's blocks."""
    _, dec = pd
    p = make("p-written", model, daemon, ttl_s=3.0)
    try:
        params = H.prefill(p, "n-p", prompt_of(20, 15))
        pw, dw = p.worker._work(), dec.worker._work()
        write = pw.region.grant(write=True, ttl=60)
        dw.client.transfer(dw.region, [0], pw.region.id, [params["remote_block_ids"][0]],
                           num_layers=1, num_tokens=16, dst_grant=write,
                           notification=b"n-p").result(timeout=30)
        started = time.monotonic()
        while time.monotonic() - started < 1.0:
            p.step()
            time.sleep(0.01)
        assert "n-p" in p.scheduler.requests, "a write into the cache freed the request"
        H.run_until([p], lambda: not p.scheduler.requests, timeout_s=30, sleep=0.01)
    finally:
        p.close()


def test_unusable_params_fail_the_load_not_the_engine(daemon, model, pd, client):
    """A pull the daemon refuses (a forged grant) is a load failure: vLLM's
    kv_load_failure_policy ('fail', its default) ends the request with an error and the engine
    carries on; the prefill, which nobody read, frees its blocks at the TTL."""
    from vllm.v1.engine import FinishReason
    _, dec = pd
    p = make("p-forged", model, daemon, ttl_s=1.0)
    try:
        prompt = prompt_of(20, 10)
        params = H.prefill(p, "i-p", prompt)
        params["kvrail"]["ranks"][0]["grant"] = "kvg1." + "0" * 32
        dec.request("i-d", prompt, max_tokens=2, params=params)
        finish(dec, [p], "i-d")
        final = [o for o in dec.outputs["i-d"] if o.finished][-1]
        assert final.finish_reason == FinishReason.ERROR
        assert not client.list_transfers(label="vllm i-d")
        H.run_until([p, dec], lambda: not p.scheduler.requests and not dec.scheduler.requests,
                    sleep=0.01)
    finally:
        p.close()


def test_a_tp_mismatch_is_a_failed_load(daemon, model, pd, client, caplog):
    from vllm.v1.engine import FinishReason
    _, dec = pd
    p = make("p-tp2", model, daemon, ttl_s=1.0)
    try:
        prompt = prompt_of(20, 14)
        params = H.prefill(p, "m-p", prompt)
        params["kvrail"]["ranks"] *= 2  # as a TP-2 prefill's params would be
        dec.request("m-d", prompt, max_tokens=2, params=params)
        kvlog = logging.getLogger("vllm.kvrail")  # vLLM's loggers do not propagate to root
        kvlog.addHandler(caplog.handler)
        try:
            finish(dec, [p], "m-d")
        finally:
            kvlog.removeHandler(caplog.handler)
        assert [o for o in dec.outputs["m-d"] if o.finished][-1].finish_reason == \
            FinishReason.ERROR
        assert "kv_transfer_params.kvrail.ranks" in caplog.text
        assert not client.list_transfers(label="vllm m-d")
        H.run_until([p, dec], lambda: not p.scheduler.requests and not dec.scheduler.requests,
                    sleep=0.01)
    finally:
        p.close()


def test_a_prefill_on_another_node_is_computed_locally(daemon, model, pd, client):
    """kvraild crosses nodes only as a push from the source node: a decode handed params of
    another node's prefill computes the prompt itself (no pull, no failure)."""
    _, dec = pd
    p = make("p-remote", model, daemon, ttl_s=1.0)
    try:
        prompt = prompt_of(40, 11)
        params = H.prefill(p, "j-p", prompt)
        for rank in params["kvrail"]["ranks"]:
            rank["node_id"] = "another-node"
        dec.request("j-d", prompt, max_tokens=2, params=params)
        dec.step()  # computes the whole prompt here
        assert dec.scheduler.requests["j-d"].num_computed_tokens == 40
        assert_pulled(dec, "j-d", prompt, range(40))  # written by the decode's own forward
        finish(dec, [p], "j-d")
        final = [o for o in dec.outputs["j-d"] if o.finished][-1]
        assert final.finish_reason is not None and str(final.finish_reason) != "error"
        assert not client.list_transfers(label="vllm j-d")
        assert not client.list_transfers(label="vllm release j-d")
        H.run_until([p, dec], lambda: not p.scheduler.requests and not dec.scheduler.requests,
                    sleep=0.01)
    finally:
        p.close()


def test_grants_are_renewed_through_the_worker_metadata(pd, client):
    """Grants last a day; after half of it the worker mints new ones and its scheduler learns
    them through build_connector_worker_meta -> update_connector_output."""
    p, dec = pd
    worker = p.worker._work()
    old = worker.handshake().grant
    worker._grant_minted -= kvv.GRANT_RENEW_S  # as if 12 hours had passed
    p.step()
    new = p.connector._sched().handshakes[(0, 0)].grant
    assert new != old and new == worker.handshake().grant
    prompt = prompt_of(24, 13)
    params = H.prefill(p, "l-p", prompt)
    assert params["kvrail"]["ranks"][0]["grant"] == new
    dec.request("l-d", prompt, max_tokens=2, params=params)
    step_until_received(dec, [p], "l-d")
    assert_pulled(dec, "l-d", prompt, range(24))
    finish(dec, [p], "l-d")
    H.run_until([p, dec], lambda: not p.scheduler.requests and not dec.scheduler.requests)


def test_every_block_is_free_at_the_end(pd):
    p, dec = pd
    for inst in pd:
        H.run_until([inst], lambda: not inst.scheduler.requests)
        pool = inst.scheduler.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
        assert all(b.ref_cnt == 0 for b in pool.blocks)

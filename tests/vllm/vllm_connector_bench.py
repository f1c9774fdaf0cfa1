"""Connector overhead: one request's KV (a 32-layer model, vLLM's per-layer cache views) pulled
from a prefill instance into a decode instance through kvraild's host engine, three ways, the same
blocks and bytes each time:

  api        the Python API directly: client.transfer(src, blocks, dst, blocks) + result()
  connector  the connector's worker path: start_load_kv (block mapping, grant, notification,
             submit) then get_transfer_results until the request is received
  streaming  the same with the layer ready flags (kvrail_layer_streaming true on the prefill)
  engine     the decode engine: add_request -> vLLM scheduler steps (get_num_new_matched_tokens,
             update_state_after_alloc, build_connector_meta) + the worker path, until the
             scheduler has the request back as received

Prints a table: median, min and max over --runs runs (interleaved), and the median's GB/s.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import vllm_harness as H
from vllm.v1.kv_cache_layout import KVCacheLayout

import kvrail.vllm as kvv

# Between completion polls and engine steps: a busy loop would take a core from the daemon's host
# engine on a small machine.
POLL_S = 0.0005


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()
    if args.runs < 3:
        ap.error("--runs: at least 3")
    daemon = H.Daemon()
    try:
        run(args, daemon)
    finally:
        daemon.stop()


def run(args, daemon) -> None:
    model = H.model_dir(num_layers=args.layers, kv_heads=args.kv_heads, head_dim=args.head_dim)
    blocks = -(-args.tokens // 16) + 8
    common = dict(num_layers=args.layers, kv_heads=args.kv_heads, head_dim=args.head_dim,
                  write_kv=False, max_num_batched_tokens=max(2048, args.tokens + 16))
    p = H.Instance("prefill", model, daemon.socket, block_size=16,
                   kv_layout=KVCacheLayout.LBNHC, num_blocks=blocks, streaming=True, **common)
    d = H.Instance("decode", model, daemon.socket, block_size=16,
                   kv_layout=KVCacheLayout.LBNHC, num_blocks=blocks, **common)
    nbytes = args.tokens * args.layers * 2 * args.kv_heads * args.head_dim * 2
    worker = d.worker._work()
    times = {"api": [], "connector": [], "streaming": [], "engine": []}
    submits = {"api": [], "connector": [], "streaming": []}  # the submitting call alone
    for i in range(args.runs + 1):  # run 0 warms up (first submit, page faults)
        prompt = [1 + (i * 7919 + j) % 900 for j in range(args.tokens)]
        flagged = H.prefill(p, f"p{i}", prompt)  # streaming on: carries the step's epoch
        params = dict(flagged, kvrail=dict(flagged["kvrail"], epoch=0))  # the default
        # engine: vLLM's decode scheduler and worker through the connector.
        t0 = time.perf_counter()
        d.request(f"e{i}", prompt, max_tokens=1, params=params)
        while not d.last_results or f"e{i}" not in (d.last_results.finished_recving or ()):
            d.step()
            time.sleep(POLL_S)
        t_engine = time.perf_counter() - t0
        local = d.scheduler.kv_cache_manager.get_block_ids(f"e{i}")[0]
        H.run_until([d, p], lambda: not d.scheduler.requests and not p.scheduler.requests)
        # connector: the worker path alone, on the same blocks.
        order = kvv.PullOrder(req_id=f"c{i}", remote_request_id=f"p{i}", params=params,
                              local_block_ids=list(local), skip_tokens=0,
                              num_tokens=args.tokens)
        meta = kvv.KvrailConnectorMetadata(0)
        meta.pulls.append(order)
        t0 = time.perf_counter()
        d.worker.bind_connector_metadata(meta)
        d.worker.start_load_kv(None)
        s_connector = time.perf_counter() - t0
        d.worker.clear_connector_metadata()
        while f"c{i}" not in d.worker.get_transfer_results(set()).finished_recving:
            time.sleep(POLL_S)
        t_connector = time.perf_counter() - t0
        # streaming: the same pull waiting on the layer ready flags (already set).
        meta = kvv.KvrailConnectorMetadata(0)
        meta.pulls.append(dataclasses.replace(order, req_id=f"n{i}", params=flagged))
        t0 = time.perf_counter()
        d.worker.bind_connector_metadata(meta)
        d.worker.start_load_kv(None)
        s_bare = time.perf_counter() - t0
        d.worker.clear_connector_metadata()
        while f"n{i}" not in d.worker.get_transfer_results(set()).finished_recving:
            time.sleep(POLL_S)
        t_bare = time.perf_counter() - t0
        # api: one transfer by hand, same source grant, blocks and destination.
        src = params["kvrail"]["ranks"][0]
        t0 = time.perf_counter()
        transfer = worker.client.transfer(src["region_id"], params["remote_block_ids"],
                                          worker.region, list(local), num_tokens=args.tokens,
                                          src_grant=src["grant"])
        s_api = time.perf_counter() - t0
        transfer.result(timeout=60)
        t_api = time.perf_counter() - t0
        if i:
            times["engine"].append(t_engine)
            times["connector"].append(t_connector)
            times["streaming"].append(t_bare)
            times["api"].append(t_api)
            submits["connector"].append(s_connector)
            submits["streaming"].append(s_bare)
            submits["api"].append(s_api)
    p.close()
    d.close()
    print(f"one request: {args.tokens} tokens x {args.layers} layers x {args.kv_heads} KV heads x "
          f"{args.head_dim} fp16 (K and V) = {nbytes / 2**20:.1f} MiB, prefill NHD/16 -> decode "
          f"NHD/16, host engine, {args.runs} runs")
    print(f"{'path':<10} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'GB/s':>6} "
          f"{'submit median ms (min-max)':>27}")
    for name in times:
        xs = times[name]
        med = statistics.median(xs)
        sub = submits.get(name)
        sub_text = (f"{statistics.median(sub) * 1e3:.3f} ({min(sub) * 1e3:.3f}-"
                    f"{max(sub) * 1e3:.3f})" if sub else "-")
        print(f"{name:<10} {med * 1e3:>10.2f} {min(xs) * 1e3:>8.2f} {max(xs) * 1e3:>8.2f} "
              f"{nbytes / med / 1e9:>6.2f} {sub_text:>27}")


if __name__ == "__main__":
    main()

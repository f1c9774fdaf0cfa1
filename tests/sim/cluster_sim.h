// Cluster simulation: a disaggregated prefill/decode cluster built from a
// topology fixture, driven by a replayed workload on a discrete-event clock. What is real and what
// is simulated:
//   real      the planner (planner::MakePlan builds every GPU-to-GPU transfer's plan from a
//             paged-KV TransferSpec against the two regions; tiles, tile bytes and layers come
//             from the plan), the rail router (scheduler::ChooseRailRoute decides every
//             transfer's NICs, rails and relays from the fixture, with the live NIC load as
//             input), and the scheduler's queueing (scheduler::TileQueues orders each sending
//             GPU's tiles by priority class and round robin between its transfers).
//   simulated prefill compute (a rate in tokens/s per instance, layers produced evenly over it),
//             links (NIC egress and ingress, NVLink relay hops: rate, latency, busy-until
//             reservations in tile order, i.e. cut-through per tile at the slower end's rate on a
//             non-blocking rail switch), the fabric engine (up to `inflight_tiles` tiles per
//             sending GPU, striped over its route's lanes by the route's shares:
//             scheduler::LaneStriper), and decode (only receiving is modelled).
// Single-threaded and deterministic: the same config and workload give the same report.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/scheduler/rails.h"
#include "proto/kvrail/v1/topology.pb.h"

namespace kvrail::sim {

// A replayed workload: requests in arrival order.
struct Request {
  double arrival_s = 0;
  uint32_t prompt_tokens = 0;
};
struct Workload {
  std::vector<Request> requests;
};

struct WorkloadOptions {
  double seconds = 60;          // arrivals in [0, seconds)
  double rate_per_s = 10;       // Poisson arrivals, requests per second (whole cluster)
  double median_tokens = 1536;  // prompt lengths: log-normal with this median ...
  double sigma = 0.8;           // ... and this sigma, clipped to [min_tokens, max_tokens]
  uint32_t min_tokens = 64;
  uint32_t max_tokens = 16384;
  uint64_t seed = 1;
};

// Pure and deterministic for a seed.
Workload SyntheticWorkload(const WorkloadOptions& options);
// "arrival_s,prompt_tokens" lines (a header line first), to save a trace and replay it.
std::string WorkloadToCsv(const Workload& workload);
absl::StatusOr<Workload> WorkloadFromCsv(const std::string& text);

// The model whose KV moves (defaults: a Llama-3-70B-like GQA model, bf16).
struct ModelShape {
  uint32_t layers = 80;
  uint32_t kv_heads = 8;
  uint32_t head_dim = 128;
  uint32_t dtype_bytes = 2;
  uint32_t tokens_per_block = 16;
};

struct SimConfig {
  v1::TopologyDesc node;  // every node of the cluster is this machine
  int nodes = 16;
  int prefill_nodes = 4;  // the first ones; the rest decode
  int prefill_tp = 8;     // GPUs per prefill instance (instances never span nodes)
  int decode_tp = 8;      // GPUs per decode instance
  ModelShape model;
  double prefill_tokens_per_s = 12000;  // per prefill instance
  double prefill_overhead_s = 0.005;    // per request
  uint64_t tile_bytes = 4 << 20;        // the plan's tile size (the fabric's slot size)
  int inflight_tiles = 8;               // per sending GPU
  double nic_latency_s = 5e-6;          // per fabric hop
  double nvlink_latency_s = 2e-6;       // per relay hop
  scheduler::RailOptions routing;       // bytes is set per transfer
  bool load_aware = true;               // pass the live NIC load to the router
};

struct Percentiles {
  double p50 = 0, p99 = 0, max = 0;
  uint64_t count = 0;
};

struct SimReport {
  uint64_t requests = 0, completed = 0;
  uint64_t transfers = 0, tiles = 0, events = 0;
  uint64_t routes_fabric = 0, routes_hierarchical = 0, routes_cross_rail = 0;
  uint64_t bytes_planned = 0;     // sum of the plans' bytes_total
  uint64_t bytes_tiles_done = 0;  // sum of finished tiles' bytes
  uint64_t bytes_egress = 0;      // over all NIC egress links
  uint64_t bytes_ingress = 0;     // over all NIC ingress links
  uint64_t bytes_nvlink = 0;      // over NVLink relay hops
  double sim_seconds = 0;         // clock at the last event
  double wall_seconds = 0;
  std::vector<uint64_t> rail_bytes;  // egress bytes per rail, whole cluster
  double rail_spread = 0;            // (max - min) / mean over rails
  // Utilization (busy time / sim_seconds) of NIC egress on prefill nodes and NIC ingress on
  // decode nodes: mean and max over the NICs.
  double egress_util_mean = 0, egress_util_max = 0;
  double ingress_util_mean = 0, ingress_util_max = 0;
  double prefill_util_mean = 0;  // prefill instances' busy fraction
  Percentiles transfer_s;   // per GPU-to-GPU transfer: created (prefill start) to last tile landed
  Percentiles handover_s;   // per request: prefill end (last layer produced) to last tile landed
  Percentiles tile_wait_s;  // per tile: produced to on the wire
  std::string example_routes;  // a few routes' reasons, for people
};

// Runs the workload to completion (every request's KV delivered). Errors: a config the cluster
// cannot have (INVALID_ARGUMENT naming the field), a plan or route the real code refuses.
absl::StatusOr<SimReport> RunSimulation(const SimConfig& config, const Workload& workload);

std::string FormatReport(const SimReport& report);

}  // namespace kvrail::sim

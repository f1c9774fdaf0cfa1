// Prepared transfers against plain submits, host engine, one printed table: the client's call ->
// the daemon's acceptance ("accept", what a prepared post saves: the spec's parsing, its
// regions' lookup and access checks, the route and the plan's header) and call -> completion
// seen by the client ("done"), p50 and p99 of sequential transfers, for a 4 KiB transfer (one
// block) and a 1024-block one (128-byte blocks, 128 KiB: the ids dominate). Paths: "submit-sq"
// (Client::Submit through the submission queue where the request fits an entry),
// "submit-pkt" (SUBMIT packets: KVRAIL_SUBMISSION_QUEUE=0), "post-sq" (PreparedTransfer::Post
// through the submission queue, an entry of kind 4, where it fits) and "post-pkt" (POST
// packets). New ids every transfer. Each figure is taken `runs` times (default 3) in this
// one process against one kvraild; median/min/max printed. A second table isolates the
// planning a post skips, in this process (no daemon, no sockets): MakePlan of the spec with its
// ids against PlanTemplate::Instantiate of the same ids, mean us per plan over 2,000 plans.
// Usage: prepared_bench [runs]
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "client/kvrail_client.h"
#include "daemon/planner/planner.h"
#include "tests/bench/host_pools.h"
#include "tests/harness/daemon_process.h"

namespace kvrail::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

struct Shape {
  const char* name;
  uint32_t blocks_per_transfer;
  uint32_t pool_blocks;
  uint32_t head_dim;  // bf16 elements of one block (1 layer, 1 part, 1 token, 1 head)
  int transfers;
};

// One run of one shape and path: p50 / p99 of accept and done, into `out`.
bool RunOnce(const std::string& socket, const Shape& shape, const std::string& path,
             std::map<std::string, std::vector<double>>* out) {
  const bool post = path.rfind("post", 0) == 0;
  ::setenv("KVRAIL_SUBMISSION_QUEUE", path.find("-sq") != std::string::npos ? "1" : "0", 1);
  auto client = client::Client::Connect(socket);
  if (!client.ok()) return false;
  const auto layout = testing::MakeLayout(1, 1, shape.pool_blocks, 1, 1, shape.head_dim,
                                          v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  absl::StatusOr<HostPools> pools = RegisterHostPools(**client, layout);
  if (!pools.ok()) return false;
  v1::TransferSpec base;
  base.mutable_src()->set_region_id(pools->src_region);
  base.mutable_dst()->set_region_id(pools->dst_region);
  absl::StatusOr<client::PreparedTransfer> prepared =
      (*client)->Prepare(base, shape.blocks_per_transfer);
  if (!prepared.ok()) {
    std::fprintf(stderr, "prepare: %s\n", prepared.status().ToString().c_str());
    return false;
  }
  const uint32_t n = shape.blocks_per_transfer;
  std::vector<uint32_t> s(n), d(n);
  std::vector<double> accept, done;
  for (int i = 0; i < shape.transfers; ++i) {
    // New ids every time: a rotation of the pool (the destination's distinct).
    for (uint32_t k = 0; k < n; ++k) {
      s[k] = (i * 7 + k * 3) % shape.pool_blocks;
      d[k] = (i * 13 + k) % shape.pool_blocks;
    }
    const auto t0 = Clock::now();
    absl::StatusOr<v1::SubmitTransferResponse> r;
    if (post) {
      r = prepared->Post(s, d);
    } else {
      v1::TransferSpec t = base;
      t.mutable_src()->mutable_block_ids()->Add(s.begin(), s.end());
      t.mutable_dst()->mutable_block_ids()->Add(d.begin(), d.end());
      r = (*client)->Submit(t);
    }
    const auto t1 = Clock::now();
    if (!r.ok()) {
      std::fprintf(stderr, "%s: %s\n", path.c_str(), r.status().ToString().c_str());
      return false;
    }
    auto ended = (*client)->Wait(r->transfer_id());
    if (!ended.ok() || ended->state() != v1::TRANSFER_STATE_SUCCEEDED) return false;
    if (i >= shape.transfers / 10) {  // the first tenth warms up
      accept.push_back(Us(t1 - t0));
      done.push_back(Us(Clock::now() - t0));
    }
  }
  (*out)["accept_p50_us"].push_back(Percentile(accept, 0.5));
  (*out)["accept_p99_us"].push_back(Percentile(accept, 0.99));
  (*out)["done_p50_us"].push_back(Percentile(done, 0.5));
  (*out)["done_p99_us"].push_back(Percentile(done, 0.99));
  return true;
}

// Mean us per plan of MakePlan (spec with ids) and of PlanTemplate::Instantiate (ids only), for
// `shape`, new ids every plan; false when either fails.
bool PlanOnce(const Shape& shape, std::map<std::string, std::vector<double>>* out) {
  const auto layout = testing::MakeLayout(1, 1, shape.pool_blocks, 1, 1, shape.head_dim,
                                          v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  absl::StatusOr<planner::KvLayout> resolved =
      planner::ResolveLayout(layout, testing::LayoutBytes(layout), "x.");
  if (!resolved.ok()) return false;
  const planner::RegionView view{testing::LayoutBytes(layout), true, true, *resolved};
  absl::StatusOr<planner::PlanTemplate> shaped = planner::PlanTemplate::Make(
      v1::TransferSpec(), view, view, planner::PlanOptions(), shape.blocks_per_transfer, 0);
  if (!shaped.ok()) return false;
  const uint32_t n = shape.blocks_per_transfer;
  constexpr int kPlans = 2000;
  std::vector<uint32_t> s(n), d(n);
  double make_us = 0, post_us = 0;
  for (int i = 0; i < kPlans; ++i) {
    for (uint32_t k = 0; k < n; ++k) {
      s[k] = (i * 7 + k * 3) % shape.pool_blocks;
      d[k] = (i * 13 + k) % shape.pool_blocks;
    }
    v1::TransferSpec spec;
    spec.mutable_src()->mutable_block_ids()->Add(s.begin(), s.end());
    spec.mutable_dst()->mutable_block_ids()->Add(d.begin(), d.end());
    const auto t0 = Clock::now();
    absl::StatusOr<planner::Plan> made = planner::MakePlan(spec, view, view, {});
    const auto t1 = Clock::now();
    absl::StatusOr<planner::Plan> posted =
        shaped->Instantiate(planner::TableRef{s.data(), n, "post.src_block_ids"},
                            planner::TableRef{d.data(), n, "post.dst_block_ids"}, {});
    const auto t2 = Clock::now();
    if (!made.ok() || !posted.ok() || made->num_runs() != posted->num_runs()) return false;
    make_us += Us(t1 - t0);
    post_us += Us(t2 - t1);
  }
  (*out)["MakePlan_us"].push_back(make_us / kPlans);
  (*out)["Instantiate_us"].push_back(post_us / kPlans);
  return true;
}

int Main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  testing::TempDir dir;
  testing::DaemonProcess daemon;
  daemon.set_log_level("info");  // a benchmark: no per-transfer debug lines
  if (!daemon.Start(dir.path())) {
    std::fprintf(stderr, "kvraild did not start\n");
    return 1;
  }
  const Shape shapes[] = {{"4KiB", 1, 256, 2048, 2000}, {"1024blk", 1024, 4096, 64, 600}};
  std::printf("prepared post vs submit, host engine, C++ client (%d runs each)\n", runs);
  std::printf("%-8s %-11s %-14s %10s %10s %10s\n", "shape", "path", "figure", "median", "min",
              "max");
  for (const Shape& shape : shapes) {
    for (const std::string path : {"submit-sq", "post-sq", "submit-pkt", "post-pkt"}) {
      std::map<std::string, std::vector<double>> figures;
      // Runs of the three paths interleave with each other's only by shape: each path's runs
      // back to back, all in this process against this daemon.
      for (int r = 0; r < runs; ++r) {
        if (!RunOnce(daemon.socket(), shape, path, &figures)) {
          std::fprintf(stderr, "run failed\n");
          return 1;
        }
      }
      for (auto& [name, xs] : figures) {
        std::printf("%-8s %-11s %-14s %10.1f %10.1f %10.1f\n", shape.name, path.c_str(),
                    name.c_str(), Percentile(xs, 0.5), *std::min_element(xs.begin(), xs.end()),
                    *std::max_element(xs.begin(), xs.end()));
      }
    }
  }
  std::printf("\nplanning a post skips, in process (mean us per plan over 2000)\n");
  std::printf("%-8s %-14s %10s %10s %10s\n", "shape", "figure", "median", "min", "max");
  for (const Shape& shape : shapes) {
    std::map<std::string, std::vector<double>> figures;
    for (int r = 0; r < runs; ++r) {
      if (!PlanOnce(shape, &figures)) {
        std::fprintf(stderr, "plan run failed\n");
        return 1;
      }
    }
    for (auto& [name, xs] : figures) {
      std::printf("%-8s %-14s %10.2f %10.2f %10.2f\n", shape.name, name.c_str(),
                  Percentile(xs, 0.5), *std::min_element(xs.begin(), xs.end()),
                  *std::max_element(xs.begin(), xs.end()));
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvrail::bench

int main(int argc, char** argv) { return kvrail::bench::Main(argc, argv); }

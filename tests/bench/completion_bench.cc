// The submission and completion queues against the packet path, host engine, one printed table:
// a 4 KiB transfer's submit -> completion seen by the C++ client (p50/p99 of sequential
// transfers), three such transfers submitted as one batch (Client::SubmitBatch: K, V and aux of
// a chunk) -> all three seen, and the batch status of 10,000 ended transfers
// (Client::LocalStates with the completion queue; one GetTransfer each without: what
// kvrail_poll does). Modes: "sq" (submission and completion queues), "queue" (completion queue,
// SUBMIT packets), "packets" (neither). Each figure is taken `runs` times (default 3);
// median/min/max printed. Starts its own kvraild from runfiles or ./daemon/kvraild.
// Usage: completion_bench [runs]
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "client/kvrail_client.h"
#include "tests/harness/daemon_process.h"

namespace kvrail::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// One configuration's figures: p50 and p99 (us) of 4 KiB submit -> completion, batch status of
// 10,000 (ms).
bool RunOnce(const std::string& socket, const std::string& mode,
             std::map<std::string, std::vector<double>>* out) {
  ::setenv("KVRAIL_COMPLETION_QUEUE", mode != "packets" ? "1" : "0", 1);
  ::setenv("KVRAIL_SUBMISSION_QUEUE", mode == "sq" ? "1" : "0", 1);
  auto client = client::Client::Connect(socket);
  if (!client.ok()) return false;
  // 4 KiB blocks: 1 layer x 1 part x 256 blocks of 1 token x 1 head x 2048 bf16.
  const auto layout = testing::MakeLayout(1, 1, 256, 1, 1, 2048, v1::DTYPE_BF16,
                                          v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const uint64_t bytes = testing::LayoutBytes(layout);
  auto src = (*client)->CreateHostBuffer(bytes);
  auto dst = (*client)->CreateHostBuffer(bytes);
  if (!src.ok() || !dst.ok()) return false;
  v1::RegionSpec spec;
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  *spec.mutable_paged_kv() = layout;
  auto a = (*client)->RegisterHostBuffer(**src, spec);
  spec.set_writable(true);
  auto b = (*client)->RegisterHostBuffer(**dst, spec);
  if (!a.ok() || !b.ok()) return false;
  std::vector<double> lat;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3000; ++i) {
    const auto t = client::MakeBlockTransfer(a->region_id(), {static_cast<uint32_t>(i % 256)},
                                             b->region_id(), {static_cast<uint32_t>(i * 7 % 256)});
    const auto t0 = Clock::now();
    auto submitted = (*client)->Submit(t);
    if (!submitted.ok()) return false;
    auto done = (*client)->Wait(submitted->transfer_id());
    if (!done.ok() || done->state() != v1::TRANSFER_STATE_SUCCEEDED) return false;
    if (i >= 300) lat.push_back(Us(Clock::now() - t0));
    ids.push_back(submitted->transfer_id());
  }
  (*out)["p50_us"].push_back(Percentile(lat, 0.5));
  (*out)["p99_us"].push_back(Percentile(lat, 0.99));
  // Three transfers as one batch -> all three seen.
  std::vector<double> batch_lat;
  for (int i = 0; i < 1000; ++i) {
    std::vector<v1::TransferSpec> specs;
    for (uint32_t k = 0; k < 3; ++k) {
      specs.push_back(client::MakeBlockTransfer(a->region_id(), {(i * 3 + k) % 256u},
                                                b->region_id(), {(i * 5 + k) % 256u}));
    }
    const auto t0 = Clock::now();
    std::vector<absl::StatusOr<v1::SubmitTransferResponse>> submitted =
        (*client)->SubmitBatch(specs);
    for (const auto& r : submitted) {
      if (!r.ok()) return false;
      auto done = (*client)->Wait(r->transfer_id());
      if (!done.ok() || done->state() != v1::TRANSFER_STATE_SUCCEEDED) return false;
    }
    if (i >= 100) batch_lat.push_back(Us(Clock::now() - t0));
  }
  (*out)["batch3_p50_us"].push_back(Percentile(batch_lat, 0.5));
  // The path really taken: with the queue every request went through it.
  const auto [queued, handed_back] = (*client)->SubmissionQueueCounts();
  if ((mode == "sq") != (queued > 0) || handed_back > 0) {
    std::fprintf(stderr, "mode %s: %llu requests queued, %llu handed back to packets\n",
                 mode.c_str(), static_cast<unsigned long long>(queued),
                 static_cast<unsigned long long>(handed_back));
    return false;
  }
  // Batch status of 10,000 ended transfers.
  ids.resize(3000);
  std::vector<uint64_t> batch;
  while (batch.size() < 10000) batch.insert(batch.end(), ids.begin(), ids.end());
  batch.resize(10000);
  std::vector<int32_t> states(batch.size());
  const auto t0 = Clock::now();
  (*client)->LocalStates(batch.data(), batch.size(), states.data());
  for (size_t i = 0; i < batch.size(); ++i) {
    if (states[i] != 0) continue;  // what the queue cannot tell: one call each
    auto s = (*client)->Get(batch[i]);
    if (!s.ok()) return false;
    states[i] = s->state();
  }
  (*out)["poll_10000_ms"].push_back(Us(Clock::now() - t0) / 1000);
  for (int32_t s : states) {
    if (s != v1::TRANSFER_STATE_SUCCEEDED) return false;
  }
  return true;
}

int Main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  testing::TempDir dir;
  testing::DaemonProcess daemon;
  if (!daemon.Start(dir.path())) {
    std::fprintf(stderr, "kvraild did not start\n");
    return 1;
  }
  std::printf(
      "submission queue vs completion queue vs packets, 4 KiB host transfers, C++ client "
      "(%d runs)\n",
      runs);
  std::printf("%-8s %-14s %10s %10s %10s\n", "path", "figure", "median", "min", "max");
  for (const std::string mode : {"sq", "queue", "packets"}) {
    std::map<std::string, std::vector<double>> figures;
    for (int r = 0; r < runs; ++r) {
      if (!RunOnce(daemon.socket(), mode, &figures)) {
        std::fprintf(stderr, "run failed\n");
        return 1;
      }
    }
    for (auto& [name, xs] : figures) {
      std::printf("%-8s %-14s %10.1f %10.1f %10.1f\n", mode.c_str(), name.c_str(),
                  Percentile(xs, 0.5), *std::min_element(xs.begin(), xs.end()),
                  *std::max_element(xs.begin(), xs.end()));
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvrail::bench

int main(int argc, char** argv) { return kvrail::bench::Main(argc, argv); }

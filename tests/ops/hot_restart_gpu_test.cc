// Hot restart with GPU memory (runs on the lent GPU machine, not in CI): a successor kvraild
// takes over from the running one, both with the CUDA engine required, while client processes
// keep transfers between their GPU regions (cudaMalloc, CUDA IPC) in flight. Nothing fails, every
// transfer ran on the CUDA engine, every byte is copied back to the host and checked, and after
// the take-over each client moves one more transfer between the regions it registered before it:
// the successor opened their IPC handles again. Stats shows the new instance under the same
// lineage. Without a GPU the case prints its SKIPPED line (tests/gpu/gpu_skip.h).
//
// kvraild and hot_restart_client are found in the runfiles under Bazel, and beside this binary in
// the GPU pack (bin/, tests/gpu/run.sh step "restart").
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cuda_export.h"
#include "tests/gpu/gpu_skip.h"
#include "tests/integration/kv_fixture.h"
#include "tests/ops/child_process.h"

namespace kvrail::testing {
namespace {

v1::Stats StatsOf(const std::string& socket) {
  auto c = client::Client::Connect(socket);
  REQUIRE(c.ok());
  auto stats = (*c)->GetStats();
  REQUIRE(stats.ok());
  return *stats;
}

TEST_CASE(
    "GPU regions: a successor takes over while 96 GPU transfers from 3 processes are in "
    "flight") {
  if (!gpu_test::HaveGpus(1, client::CudaDeviceCount())) return;
  const std::vector<std::string> daemon_args = {"--cuda-engine", "required"};
  TempDir dir;
  DaemonProcess old_daemon;
  REQUIRE(old_daemon.Start(dir.path(), daemon_args, true, "kvraild.log", 30000));
  const v1::Stats before = StatsOf(old_daemon.socket());
  REQUIRE_FALSE(before.lineage_id().empty());

  constexpr int kClients = 3;
  constexpr int kBatch = 32;  // 1 MiB transfers in flight per client: 96 in all
  const std::string client_path = RunfilePath("tests/ops/hot_restart_client");
  std::vector<std::unique_ptr<ChildProcess>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{client_path, old_daemon.socket(), std::to_string(kBatch),
                                 std::to_string(i + 1), "--cuda-device", "0"}));
  }
  for (auto& c : clients) {
    INFO(old_daemon.ReadLog());
    REQUIRE(c->ReadLine() == "READY");  // each has its first batch submitted
  }

  const absl::Time started = absl::Now();
  std::vector<std::string> successor_args = daemon_args;
  successor_args.insert(successor_args.end(), {"--take-over", "auto"});
  DaemonProcess successor;
  REQUIRE(successor.Start(dir.path(), successor_args, true, "successor.log", 30000));
  INFO(successor.ReadLog());
  INFO(old_daemon.ReadLog());
  // The predecessor handed over and exited 0 by itself.
  CHECK(old_daemon.Stop(0, 20000) == 0);
  const absl::Duration took = absl::Now() - started;
  CHECK(old_daemon.ReadLog().find("handed over to the successor") != std::string::npos);
  CHECK(successor.ReadLog().find("take_over: committed") != std::string::npos);

  // Clients keep going a moment on the successor, then stop; each moves one more transfer on its
  // pre-restart GPU regions and reports.
  absl::SleepFor(absl::Milliseconds(300));
  uint64_t transfers = 0;
  for (auto& c : clients) c->CloseStdin();
  for (auto& c : clients) {
    const std::string done = c->ReadLine();
    INFO(done);
    CHECK(done.find("failed=0 corrupt=0 lost=0 lineage_kept=1 instance_changed=1") !=
          std::string::npos);
    CHECK(c->Wait() == 0);
    const size_t at = done.find("transfers=");
    REQUIRE(at != std::string::npos);
    transfers += std::stoull(done.substr(at + 10));
  }
  CHECK(transfers >= kClients * (kBatch + 1));
  const v1::Stats after = StatsOf(successor.socket());
  CHECK(after.instance_id() != before.instance_id());
  CHECK(after.lineage_id() == before.lineage_id());
  CHECK(after.transfers_failed() == 0);
  std::printf(
      "hot restart with GPU regions: successor start to predecessor exit %s; %llu "
      "transfers, 0 failed\n",
      absl::FormatDuration(took).c_str(), static_cast<unsigned long long>(transfers));
  CHECK(successor.Stop(SIGTERM) == 0);
}

}  // namespace
}  // namespace kvrail::testing

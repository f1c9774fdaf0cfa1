// A multi-client checksummed load against a real kvraild.
// Several clients (tests/load/checksum_worker.h), each on its own thread with its own connection
// and session, run thousands of checksummed transfers with cancels, deadlines and invalid
// requests mixed in. The sources are checked untouched at the end, and the daemon's RSS
// (/proc/<pid>/status VmRSS) may grow only by a bound between the end of the warm-up round and the
// end of the run.
//
// The size comes from the environment (BUILD: load_test ~1 minute in CI, load_test_long manual):
//   KVRAIL_LOAD_CLIENTS (4), KVRAIL_LOAD_OPS (ops per client, 600); KVRAIL_LOAD_RSS_MIB (64): the
//   growth allowed (an ASan build's quarantine alone holds up to 256 MiB of freed memory).
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/harness/daemon_process.h"
#include "tests/load/checksum_worker.h"

namespace kvrail::testing {
namespace {

TEST_CASE(
    "several clients, thousands of checksummed transfers with cancels, deadlines and "
    "invalid requests; nothing outside destinations, bounded daemon RSS") {
  const uint64_t clients = EnvOr("KVRAIL_LOAD_CLIENTS", 4);
  const uint64_t ops = EnvOr("KVRAIL_LOAD_OPS", 600);
  TempDir dir;
  DaemonProcess daemon;
  // A short history, so it is full well before the warm-up ends: from then on the daemon's
  // memory must stay flat however many transfers pass.
  const std::string config = dir.path() + "/kvraild.conf";
  {
    std::ofstream out(config);
    out << "transfer_history: 256\n";
  }
  REQUIRE(daemon.Start(dir.path(), {"--config", config, "--tile-bytes", "16384"}));

  std::vector<std::unique_ptr<ChecksumWorker>> workers;
  for (uint32_t i = 0; i < clients; ++i) {
    workers.push_back(ChecksumWorker::Create(daemon.socket(), i));
    REQUIRE(workers.back()->Setup());
  }
  std::atomic<uint64_t> done{0};
  // Each worker runs all its ops; the baseline is taken once every worker passed a tenth.
  std::atomic<uint64_t> finished{0};
  std::vector<std::thread> threads;
  for (auto& w : workers) {
    threads.emplace_back([&, w = w.get()] {
      w->Run(ops, &done);
      finished.fetch_add(1);
    });
  }
  // (A worker stops early after 5 errors: then the baseline is taken when all have stopped.)
  while (done.load() < clients * ops / 10 && finished.load() < clients) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const uint64_t rss_warm = VmRssKib(daemon.pid());
  for (auto& t : threads) t.join();
  const uint64_t rss_end = VmRssKib(daemon.pid());

  Tally total;
  for (auto& w : workers) {
    w->CheckSourceUntouched();
    const Tally& t = w->tally();
    total.succeeded += t.succeeded;
    total.cancelled += t.cancelled;
    total.expired += t.expired;
    total.refused += t.refused;
    total.failed_other += t.failed_other;
    total.errors.insert(total.errors.end(), t.errors.begin(), t.errors.end());
  }
  WARN(absl::StrCat(clients, " clients x ", ops, " ops: ", total.succeeded, " succeeded, ",
                    total.cancelled, " cancelled, ", total.expired, " expired, ", total.refused,
                    " refused at submit, ", total.failed_other, " failed; daemon VmRSS ", rss_warm,
                    " KiB after warm-up, ", rss_end, " KiB at the end"));
  for (const std::string& e : total.errors) FAIL_CHECK(e);
  CHECK(total.errors.empty());
  CHECK(total.succeeded > clients * ops / 3);
  CHECK(total.refused + total.failed_other > 0);
  // The daemon keeps a bounded history; thousands of transfers may not grow it without bound.
  CHECK(rss_warm > 0);
  CHECK(rss_end <= rss_warm + EnvOr("KVRAIL_LOAD_RSS_MIB", 64) * 1024);
  // Still serving after all that, and it stops cleanly.
  for (auto& w : workers) w->Close();
  CHECK(daemon.Stop(SIGTERM) == 0);
}

}  // namespace
}  // namespace kvrail::testing

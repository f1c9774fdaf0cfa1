#include "daemon/metrics/metrics.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "base/dcheck.h"
#include "tests/harness/daemon_process.h"

namespace kvrail::metrics {
namespace {

using testing::HttpGet;

TEST_CASE("metrics count ended transfers and read gauges and counters from stats at scrape time") {
  int scrapes = 0;
  MetricsOptions options;
  options.listen = "127.0.0.1:0";
  options.version = "9.9.9";
  options.build_info = "kvraild 9.9.9 (gcc, opt)";
  options.stats = [&] {
    ++scrapes;
    v1::Stats s;
    s.set_regions(3);
    s.set_transfers_active(2);
    s.set_started_unix_us(1700000000500000);
    (*s.mutable_queued_tiles())["critical"] = 5;
    s.add_engines("host: 4 threads, 0.7 GB/s per worker");
    v1::OpsEngineState* e = s.add_engine_states();
    e->set_name("host");
    e->set_description("host: 4 threads, 0.7 GB/s per worker");
    (*e->mutable_gauges())["threads"] = 4;
    (*e->mutable_gauges())["worker_bytes_per_second"] = 7e8;
    v1::OpsByteCount* b = s.add_bytes_by_class();
    b->set_path("host_local");
    b->set_priority("critical");
    b->set_bytes(8192);
    (*s.mutable_bytes_by_link())["host"] = 8192;
    (*s.mutable_rejected_by_code())["INVALID_ARGUMENT"] = 7;
    s.mutable_mps()->set_active(true);
    s.mutable_mps()->set_verdict("not co-running: ...");
    return s;
  };
  options.peers = [] {
    v1::PeerInfo up, down;
    up.set_node_id("b");
    up.set_state(v1::PEER_STATE_UP);
    down.set_node_id("c");
    down.set_state(v1::PEER_STATE_DOWN);
    return std::vector<v1::PeerInfo>{up, down};
  };
  options.gpu_labels = {{0, "GPU-0b1c2d3e-0000-1111-2222-333344445555", "NVIDIA H200"},
                        {1, "GPU-9f8e7d6c-0000-1111-2222-333344445555", "NVIDIA H200"}};
  auto m = Metrics::Start(std::move(options));
  REQUIRE(m.ok());
  REQUIRE((*m)->port() > 0);
  v1::TransferStatus t;
  t.set_path(v1::PATH_HOST_LOCAL);
  t.mutable_spec()->set_priority(v1::PRIORITY_CRITICAL);
  t.set_state(v1::TRANSFER_STATE_SUCCEEDED);
  t.set_bytes_done(4096);
  t.set_submitted_unix_us(1000);
  t.set_started_unix_us(1020);
  t.set_finished_unix_us(1300);
  (*m)->OnTransferFinished(t);
  (*m)->OnTransferFinished(t);
  t.set_state(v1::TRANSFER_STATE_FAILED);
  t.set_bytes_done(0);
  t.set_started_unix_us(0);  // failed before it started: no queue wait observed
  (*m)->OnTransferFinished(t);
  const std::string body = HttpGet((*m)->port(), "/metrics");
  INFO(body);
  CHECK(body.find("200 OK") != std::string::npos);
  CHECK(
      body.find(
          R"(kvrail_transfers_total{path="host_local",priority="critical",result="succeeded"} 2)") !=
      std::string::npos);
  CHECK(body.find(
            R"(kvrail_transfers_total{path="host_local",priority="critical",result="failed"} 1)") !=
        std::string::npos);
  // Bytes come from the stats' tile-by-tile counts, not from ended transfers.
  CHECK(body.find(R"(kvrail_bytes_total{path="host_local",priority="critical"} 8192)") !=
        std::string::npos);
  CHECK(body.find("# TYPE kvrail_bytes_total counter") != std::string::npos);
  CHECK(body.find(R"(kvrail_link_bytes_total{link="host"} 8192)") != std::string::npos);
  CHECK(body.find(R"(kvrail_submits_rejected_total{code="INVALID_ARGUMENT"} 7)") !=
        std::string::npos);
  CHECK(body.find(
            R"(kvrail_transfer_duration_seconds_count{path="host_local",priority="critical"} 3)") !=
        std::string::npos);
  CHECK(
      body.find(
          R"(kvrail_transfer_duration_seconds_bucket{path="host_local",priority="critical",le="0.0005"} 3)") !=
      std::string::npos);
  CHECK(body.find(R"(kvrail_transfer_queue_wait_seconds_count{priority="critical"} 2)") !=
        std::string::npos);
  CHECK(
      body.find(R"(kvrail_transfer_queue_wait_seconds_bucket{priority="critical",le="5e-05"} 2)") !=
      std::string::npos);
  CHECK(body.find("kvrail_regions 3") != std::string::npos);
  CHECK(body.find(R"(kvrail_queued_tiles{priority="critical"} 5)") != std::string::npos);
  // The engine's label is its stable name; the measurement is a gauge, never a label.
  CHECK(body.find(R"(kvrail_engine_info{engine="host"} 1)") != std::string::npos);
  CHECK(body.find("GB/s") == std::string::npos);
  CHECK(body.find(R"(kvrail_engine_threads{engine="host"} 4)") != std::string::npos);
  CHECK(body.find(R"(kvrail_engine_worker_bytes_per_second{engine="host"} 700000000)") !=
        std::string::npos);
  CHECK(body.find(R"x(kvrail_build_info{version="9.9.9",build="kvraild 9.9.9 (gcc, opt)"} 1)x") !=
        std::string::npos);
  CHECK(body.find(R"(kvrail_peer_up{peer="b"} 1)") != std::string::npos);
  CHECK(body.find(R"(kvrail_peer_up{peer="c"} 0)") != std::string::npos);
  CHECK(body.find("kvrail_mps_active 1") != std::string::npos);
  CHECK(body.find("kvrail_mps_corunning 0") != std::string::npos);
  CHECK(body.find("kvrail_start_time_seconds 1700000000.5") != std::string::npos);
  CHECK(
      body.find(
          R"(kvrail_gpu_info{gpu="1",UUID="GPU-9f8e7d6c-0000-1111-2222-333344445555",modelName="NVIDIA H200"} 1)") !=
      std::string::npos);
  CHECK(scrapes == 1);
}

TEST_CASE("ended transfers count into their own series: kept children, unknown enum values too") {
  MetricsOptions options;
  options.listen = "127.0.0.1:0";
  options.stats = [] { return v1::Stats(); };
  auto m = Metrics::Start(std::move(options));
  REQUIRE(m.ok());
  v1::TransferStatus t;
  t.set_submitted_unix_us(1000);
  t.set_started_unix_us(1010);
  t.set_finished_unix_us(1100);
  t.set_state(v1::TRANSFER_STATE_SUCCEEDED);
  // Many ends of a few label sets, interleaved: each counts into its own series only.
  for (int i = 0; i < 100; ++i) {
    t.set_path(i % 2 == 0 ? v1::PATH_HOST_LOCAL : v1::PATH_CUDA_LOCAL);
    t.mutable_spec()->set_priority(i % 5 == 0 ? v1::PRIORITY_BACKGROUND : v1::PRIORITY_UNSPECIFIED);
    (*m)->OnTransferFinished(t);
  }
  // Unspecified priority is "normal", the same series as PRIORITY_NORMAL.
  t.set_path(v1::PATH_HOST_LOCAL);
  t.mutable_spec()->set_priority(v1::PRIORITY_NORMAL);
  (*m)->OnTransferFinished(t);
  // Values no array holds (a newer proto's enum) still count, by Family::Add each time.
  t.set_path(static_cast<v1::Path>(42));
  (*m)->OnTransferFinished(t);
  (*m)->OnTransferFinished(t);
  const std::string body = HttpGet((*m)->port(), "/metrics");
  INFO(body);
  auto has = [&](const std::string& line) {
    return body.find("\n" + line + "\n") != std::string::npos;
  };
  CHECK(
      has(R"(kvrail_transfers_total{path="host_local",priority="normal",result="succeeded"} 41)"));
  CHECK(has(
      R"(kvrail_transfers_total{path="host_local",priority="background",result="succeeded"} 10)"));
  CHECK(
      has(R"(kvrail_transfers_total{path="cuda_local",priority="normal",result="succeeded"} 40)"));
  CHECK(has(
      R"(kvrail_transfers_total{path="cuda_local",priority="background",result="succeeded"} 10)"));
  CHECK(has(R"(kvrail_transfer_duration_seconds_count{path="cuda_local",priority="normal"} 40)"));
  CHECK(has(R"(kvrail_transfer_queue_wait_seconds_count{priority="normal"} 83)"));
  CHECK(has(R"(kvrail_transfer_queue_wait_seconds_count{priority="background"} 20)"));
  CHECK(body.find(R"(priority="normal",result="succeeded"} 2)") != std::string::npos);
}

TEST_CASE("metrics: invariant violations and the process_* families") {
  MetricsOptions options;
  options.listen = "127.0.0.1:0";
  options.stats = [] { return v1::Stats(); };
  auto m = Metrics::Start(std::move(options));
  REQUIRE(m.ok());
  std::string body = HttpGet((*m)->port(), "/metrics");
  CHECK(body.find("# TYPE kvrail_invariant_violations_total counter") != std::string::npos);
  CHECK(body.find("kvrail_invariant_violations_total 0") != std::string::npos);
  SetInvariantModeForTest(InvariantMode::kCount);
  const int broken = 2;
  KVRAIL_DCHECK(broken < 1, "a test's invariant");
  SetInvariantModeForTest(BuildInvariantMode());
  body = HttpGet((*m)->port(), "/metrics");
  INFO(body);
  CHECK(body.find("kvrail_invariant_violations_total 1") != std::string::npos);
  CHECK(body.find("# TYPE process_cpu_seconds_total counter") != std::string::npos);
  for (const char* name :
       {"process_resident_memory_bytes ", "process_virtual_memory_bytes ", "process_open_fds ",
        "process_max_fds ", "process_start_time_seconds "}) {
    INFO(name);
    CHECK(body.find(std::string("\n") + name) != std::string::npos);
  }
}

TEST_CASE("engine gauges: units spelled out in base units, counts that only grow are counters") {
  const EngineSeries ms = EngineSeriesOf("failover_first_resend_ms", 250);
  CHECK(ms.name == "kvrail_engine_failover_first_resend_seconds");
  CHECK(ms.value == Approx(0.25));
  CHECK_FALSE(ms.counter);
  const EngineSeries us = EngineSeriesOf("launch_us", 5);
  CHECK(us.name == "kvrail_engine_launch_seconds");
  CHECK(us.value == Approx(5e-6));
  const EngineSeries total = EngineSeriesOf("fabric_tiles_resent_total", 7);
  CHECK(total.name == "kvrail_engine_fabric_tiles_resent_total");
  CHECK(total.counter);
  CHECK(total.value == 7);
  const EngineSeries plain = EngineSeriesOf("threads", 4);
  CHECK(plain.name == "kvrail_engine_threads");
  CHECK_FALSE(plain.counter);
}

TEST_CASE("engine gauge names keep to Prometheus' alphabet") {
  CHECK(EngineGaugeName("worker_bytes_per_second") == "kvrail_engine_worker_bytes_per_second");
  CHECK(EngineGaugeName("sm budget/ctas") == "kvrail_engine_sm_budget_ctas");
}

TEST_CASE("a busy metrics address is an error naming the key") {
  auto first = Metrics::Start("127.0.0.1:0", [] { return v1::Stats(); });
  REQUIRE(first.ok());
  auto second =
      Metrics::Start("127.0.0.1:" + std::to_string((*first)->port()), [] { return v1::Stats(); });
  REQUIRE(!second.ok());
  CHECK(std::string(second.status().message()).rfind("metrics_listen:", 0) == 0);
}

TEST_CASE("the session admission queues are gauges read at each scrape, and pass promtool") {
  std::atomic<size_t> queued{0};
  MetricsOptions options;
  options.listen = "127.0.0.1:0";
  options.stats = [] { return v1::Stats(); };
  options.session_admission = [&] {
    SessionAdmission a;
    a.queued = queued.load();
    a.running = queued.load() > 0 ? 2 : 0;
    a.deepest = queued.load() / 2;
    a.promoted = queued.load() + 1;
    return a;
  };
  auto m = Metrics::Start(std::move(options));
  REQUIRE(m.ok());
  std::string body = HttpGet((*m)->port(), "/metrics");
  CHECK(body.find("# TYPE kvrail_session_admission_queued gauge") != std::string::npos);
  CHECK(body.find("\nkvrail_session_admission_queued 0\n") != std::string::npos);
  CHECK(body.find("\nkvrail_session_admission_running 0\n") != std::string::npos);
  queued.store(37);
  body = HttpGet((*m)->port(), "/metrics");
  INFO(body);
  CHECK(body.find("\nkvrail_session_admission_queued 37\n") != std::string::npos);
  CHECK(body.find("\nkvrail_session_admission_running 2\n") != std::string::npos);
  CHECK(body.find("\nkvrail_session_admission_queue_max 18\n") != std::string::npos);
  CHECK(body.find("# TYPE kvrail_session_admission_bulk_promoted_total counter") !=
        std::string::npos);
  CHECK(body.find("\nkvrail_session_admission_bulk_promoted_total 38\n") != std::string::npos);
  // The exposition as Prometheus' own checker reads it (promtool: Debian's prometheus package,
  // deploy/dev.sh): nothing to report.
  testing::TempDir dir;
  const std::string file = dir.path() + "/scrape.txt";
  std::ofstream(file) << body.substr(body.find("\r\n\r\n") + 4);
  const testing::CommandResult lint = testing::RunCommand(
      {"/bin/sh", "-c",
       "command -v promtool >/dev/null || { echo 'promtool not installed'; exit 2; }; "
       "promtool check metrics < '" +
           file + "' 2>&1"});
  INFO(lint.out);
  CHECK(lint.exit_code == 0);
  CHECK(lint.out.find("session_admission") == std::string::npos);
  // Without the callback: no such series.
  auto plain = Metrics::Start("127.0.0.1:0", [] { return v1::Stats(); });
  REQUIRE(plain.ok());
  CHECK(HttpGet((*plain)->port(), "/metrics").find("kvrail_session_admission") ==
        std::string::npos);
}

TEST_CASE("the session poll thread's predicted spins are counters by outcome") {
  std::atomic<uint64_t> spins{0};
  MetricsOptions options;
  options.listen = "127.0.0.1:0";
  options.stats = [] { return v1::Stats(); };
  options.session_wake = [&] {
    SessionWake w;
    w.spins = spins.load();
    w.hits = spins.load() * 3 / 4;
    w.misses = spins.load() / 5;
    return w;
  };
  auto m = Metrics::Start(std::move(options));
  REQUIRE(m.ok());
  std::string body = HttpGet((*m)->port(), "/metrics");
  CHECK(body.find("# TYPE kvrail_session_predicted_spins_total counter") != std::string::npos);
  CHECK(body.find("\nkvrail_session_predicted_spins_total{outcome=\"begun\"} 0\n") !=
        std::string::npos);
  spins.store(100);
  body = HttpGet((*m)->port(), "/metrics");
  INFO(body);
  CHECK(body.find("\nkvrail_session_predicted_spins_total{outcome=\"begun\"} 100\n") !=
        std::string::npos);
  CHECK(body.find("\nkvrail_session_predicted_spins_total{outcome=\"hit\"} 75\n") !=
        std::string::npos);
  CHECK(body.find("\nkvrail_session_predicted_spins_total{outcome=\"miss\"} 20\n") !=
        std::string::npos);
  // Without the callback: no such series.
  auto plain = Metrics::Start("127.0.0.1:0", [] { return v1::Stats(); });
  REQUIRE(plain.ok());
  CHECK(HttpGet((*plain)->port(), "/metrics").find("kvrail_session_predicted") ==
        std::string::npos);
}

TEST_CASE("the peer directory's state is a gauge: 1 ok, 0 degraded") {
  std::atomic<bool> ok{true};
  MetricsOptions options;
  options.listen = "127.0.0.1:0";
  options.stats = [&] {
    v1::Stats s;
    s.mutable_directory()->set_kind(v1::DIRECTORY_KIND_ETCD);
    s.mutable_directory()->set_state(ok.load() ? v1::DIRECTORY_STATE_OK
                                               : v1::DIRECTORY_STATE_DEGRADED);
    s.mutable_directory()->set_registrations(2);
    return s;
  };
  auto m = Metrics::Start(std::move(options));
  REQUIRE(m.ok());
  std::string body = HttpGet((*m)->port(), "/metrics");
  CHECK(body.find(R"(kvrail_directory_up{kind="etcd"} 1)") != std::string::npos);
  CHECK(body.find("kvrail_directory_registrations_total 2") != std::string::npos);
  ok.store(false);
  body = HttpGet((*m)->port(), "/metrics");
  CHECK(body.find(R"(kvrail_directory_up{kind="etcd"} 0)") != std::string::npos);
}

}  // namespace
}  // namespace kvrail::metrics

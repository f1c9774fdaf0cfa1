#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <string>

#include "daemon/metrics/metrics.h"
#include "tests/harness/daemon_process.h"

namespace kvrail::metrics {
namespace {

using testing::HttpGet;

TEST_CASE("metrics count ended transfers and read gauges from stats at scrape time") {
  int scrapes = 0;
  auto m = Metrics::Start("127.0.0.1:0", [&] {
    ++scrapes;
    v1::Stats s;
    s.set_regions(3);
    s.set_transfers_active(2);
    (*s.mutable_queued_tiles())["critical"] = 5;
    s.add_engines("host: 4 threads");
    return s;
  });
  REQUIRE(m.ok());
  REQUIRE((*m)->port() > 0);
  v1::TransferStatus t;
  t.set_path(v1::PATH_HOST_LOCAL);
  t.mutable_spec()->set_priority(v1::PRIORITY_CRITICAL);
  t.set_state(v1::TRANSFER_STATE_SUCCEEDED);
  t.set_bytes_done(4096);
  t.set_submitted_unix_us(1000);
  t.set_finished_unix_us(1300);
  (*m)->OnTransferFinished(t);
  (*m)->OnTransferFinished(t);
  t.set_state(v1::TRANSFER_STATE_FAILED);
  t.set_bytes_done(0);
  (*m)->OnTransferFinished(t);
  const std::string body = HttpGet((*m)->port(), "/metrics");
  INFO(body);
  CHECK(body.find("200 OK") != std::string::npos);
  CHECK(body.find(R"(kvrail_transfers_total{path="host_local",priority="critical",result="succeeded"} 2)") != std::string::npos);
  CHECK(body.find(R"(kvrail_transfers_total{path="host_local",priority="critical",result="failed"} 1)") != std::string::npos);
  CHECK(body.find(R"(kvrail_bytes_total{path="host_local",priority="critical"} 8192)") != std::string::npos);
  CHECK(body.find(R"(kvrail_transfer_duration_seconds_count{path="host_local",priority="critical"} 3)") != std::string::npos);
  CHECK(body.find(R"(kvrail_transfer_duration_seconds_bucket{path="host_local",priority="critical",le="0.0005"} 3)") != std::string::npos);
  CHECK(body.find("kvrail_regions 3") != std::string::npos);
  CHECK(body.find(R"(kvrail_queued_tiles{priority="critical"} 5)") != std::string::npos);
  CHECK(scrapes == 1);
}

TEST_CASE("a busy metrics address is an error naming the key") {
  auto first = Metrics::Start("127.0.0.1:0", [] { return v1::Stats(); });
  REQUIRE(first.ok());
  auto second = Metrics::Start("127.0.0.1:" + std::to_string((*first)->port()), [] { return v1::Stats(); });
  REQUIRE(!second.ok());
  CHECK(std::string(second.status().message()).rfind("metrics_listen:", 0) == 0);
}

}  // namespace
}  // namespace kvrail::metrics

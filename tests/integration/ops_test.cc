// Operations: the Prometheus endpoint scraped over HTTP after transfers, with the right counts;
// JSON logs are one valid object per line.
#include <signal.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "base/eventually.h"
#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

TEST_CASE("metrics: counts by path, priority and result after real transfers") {
  TempDir dir;
  DaemonProcess daemon;
  REQUIRE(daemon.Start(dir.path(), {"--metrics-listen", "127.0.0.1:0", "--log-format", "json"}));
  std::smatch m;
  const std::string log = daemon.ReadLog();
  REQUIRE(std::regex_search(log, m, std::regex(R"(metrics on 127\.0\.0\.1:0 \(port (\d+)\))")));
  const int port = std::stoi(m[1]);
  auto c = client::Client::Connect(daemon.socket());
  REQUIRE(c.ok());
  const auto layout =
      MakeLayout(2, 2, 16, 16, 2, 64, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(**c, layout, false);
  Pool dst = MakePool(**c, layout, true);
  auto spec = client::MakeBlockTransfer(src.id(), {0, 1}, dst.id(), {2, 3});
  spec.set_priority(v1::PRIORITY_CRITICAL);
  for (int i = 0; i < 3; ++i) {
    auto t = (*c)->Submit(spec);
    REQUIRE(t.ok());
    REQUIRE((*c)->Wait(t->transfer_id(), absl::Seconds(10))->state() ==
            v1::TRANSFER_STATE_SUCCEEDED);
  }
  auto stuck = spec;
  stuck.set_layerwise(true);
  stuck.set_priority(v1::PRIORITY_BACKGROUND);
  auto s = (*c)->Submit(stuck);
  REQUIRE(s.ok());
  REQUIRE((*c)->Cancel(s->transfer_id()).ok());
  const uint64_t per_transfer = 2ull * 2 * 2 * 16 * 2 * 64 * 2;
  // A transfer's counters are updated after its waiters hear of its end (the WAIT's DONE goes
  // out first, off the critical path), so the last transfer's and the cancelled one's counts may
  // land a moment after Wait and Cancel return: scraped until the end counts show (a liveness
  // bound).
  std::string body;
  Eventually(
      [&] {
        body = HttpGet(port, "/metrics");
        return body.find(R"(result="succeeded"} 3)") != std::string::npos &&
               body.find(R"(result="cancelled"} 1)") != std::string::npos &&
               body.find("kvrail_transfers_active 0") != std::string::npos;
      },
      absl::Seconds(10));
  INFO(body);
  CHECK(
      body.find(
          R"(kvrail_transfers_total{path="host_local",priority="critical",result="succeeded"} 3)") !=
      std::string::npos);
  CHECK(
      body.find(
          R"(kvrail_transfers_total{path="host_local",priority="background",result="cancelled"} 1)") !=
      std::string::npos);
  CHECK(body.find(R"(kvrail_bytes_total{path="host_local",priority="critical"} )" +
                  std::to_string(3 * per_transfer)) != std::string::npos);
  CHECK(body.find(
            R"(kvrail_transfer_duration_seconds_count{path="host_local",priority="critical"} 3)") !=
        std::string::npos);
  CHECK(body.find(R"(kvrail_link_bytes_total{link="host"} )" + std::to_string(3 * per_transfer)) !=
        std::string::npos);
  // The two pools and the client library's block-table region (registered by Connect).
  CHECK(body.find("kvrail_regions 3") != std::string::npos);
  CHECK(body.find("kvrail_transfers_active 0") != std::string::npos);
  CHECK(body.find(R"(kvrail_queued_tiles{priority="background"} 0)") != std::string::npos);
  CHECK(body.find("kvrail_engine_info{engine=\"host\"} 1") != std::string::npos);
  // The session poll thread's predictive wake is counted (how many of these sequential transfers
  // it predicted depends on the machine's timing: only that the daemon exports its counts).
  for (const char* outcome : {"begun", "hit", "miss"}) {
    CHECK(body.find(std::string("kvrail_session_predicted_spins_total{outcome=\"") + outcome +
                    "\"} ") != std::string::npos);
  }
  c->reset();
  CHECK(daemon.Stop(SIGTERM) == 0);
  // Every log line is a JSON object.
  std::istringstream lines(daemon.ReadLog());
  std::string line;
  int parsed = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    INFO(line);
    auto j = nlohmann::json::parse(line);
    CHECK(j.contains("msg"));
    CHECK(j.contains("level"));
    ++parsed;
  }
  CHECK(parsed > 3);
}

}  // namespace
}  // namespace kvrail::testing

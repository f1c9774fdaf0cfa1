// What an operator sees of a live kvraild: metrics with the start time, bytes counted
// tile by tile while a transfer runs, engines under stable labels, refused submits by code,
// build info; liveness SERVING (readiness NOT_SERVING) during a drain; transfer ids by `last` and
// prefix; debug per-transfer lines with JSON fields. (The operator's cancel: operator_cancel_test.)
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

int MetricsPort(const DaemonProcess& daemon) {
  std::smatch m;
  const std::string log = daemon.ReadLog();
  if (!std::regex_search(log, m, std::regex(R"(metrics on 127\.0\.0\.1:0 \(port (\d+)\))")))
    return 0;
  return std::stoi(m[1]);
}

// The value of the sample `series` (exact name and labels) in a Prometheus text body; -1 if absent.
double Sample(const std::string& body, const std::string& series) {
  std::istringstream lines(body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

CommandResult Cli(const DaemonProcess& daemon, std::vector<std::string> args) {
  args.insert(args.begin(), {RunfilePath("tools/kvrail/kvrail"), "--socket", daemon.socket()});
  return RunCommand(args);
}

TEST_CASE("metrics: start time, bytes while a transfer runs, stable engine labels, refusals") {
  TempDir dir;
  DaemonProcess daemon;
  const double before =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // (The harness starts kvraild with --log-level debug.)
  REQUIRE(daemon.Start(dir.path(), {"--metrics-listen", "127.0.0.1:0", "--log-format", "json",
                                    "--drain-timeout-ms", "4000"}));
  const int port = MetricsPort(daemon);
  REQUIRE(port > 0);
  auto c = client::Client::Connect(daemon.socket());
  REQUIRE(c.ok());
  const auto layout =
      MakeLayout(4, 2, 16, 16, 2, 64, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(**c, layout, false);
  Pool dst = MakePool(**c, layout, true);
  // Layer-wise: only layer 0 is marked ready, so the transfer runs (and stays running) with one
  // layer's tiles landed.
  auto spec = client::MakeBlockTransfer(src.id(), {0, 1}, dst.id(), {2, 3});
  spec.set_layerwise(true);
  spec.set_priority(v1::PRIORITY_CRITICAL);
  auto t = (*c)->Submit(spec);
  REQUIRE(t.ok());
  REQUIRE((*c)->MarkReady(t->transfer_id(), 0, 1).ok());
  const uint64_t per_layer =
      2ull * 2 * 16 * 2 * 64 * 2;  // parts * blocks * tokens * heads * dim * 2 B
  // Layer 0 lands (waited for, 20 s at most: a loaded CI machine may take longer than the 2 s
  // this waited before, and the byte counts below need it landed).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  uint32_t layers_done = 0;
  while (layers_done < 1 && std::chrono::steady_clock::now() < until) {
    auto s = (*c)->Get(t->transfer_id());
    REQUIRE(s.ok());
    layers_done = s->layers_done();
    if (layers_done < 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(layers_done == 1);
  // A refused submit (unknown region), counted by code.
  auto bad = client::MakeBlockTransfer(src.id(), {0}, 999999, {0});
  REQUIRE_FALSE((*c)->Submit(bad).ok());

  const std::string body = HttpGet(port, "/metrics");
  INFO(body);
  // Bytes of the landed layer show while the transfer is still running; nothing has ended.
  CHECK(Sample(body, R"(kvrail_bytes_total{path="host_local",priority="critical"})") ==
        static_cast<double>(per_layer));
  CHECK(Sample(body, R"(kvrail_link_bytes_total{link="host"})") == static_cast<double>(per_layer));
  CHECK(Sample(body, "kvrail_transfers_active") == 1);
  CHECK(body.find("kvrail_transfers_total{") == std::string::npos);
  CHECK(Sample(body, R"(kvrail_submits_rejected_total{code="NOT_FOUND"})") == 1);
  // The start time is now-ish, not 0.
  const double started = Sample(body, "kvrail_start_time_seconds");
  CHECK(started >= before - 1);
  CHECK(started <= before + 60);
  // Engines: one stable label each; the changing rate is a gauge.
  CHECK(Sample(body, R"(kvrail_engine_info{engine="host"})") == 1);
  CHECK(Sample(body, R"(kvrail_engine_threads{engine="host"})") >= 1);
  CHECK(body.find("kvrail_engine_worker_bytes_per_second{engine=\"host\"}") != std::string::npos);
  CHECK(body.find("GB/s") == std::string::npos);
  CHECK(body.find("kvrail_build_info{version=\"0.1.0\",build=\"kvraild 0.1.0 (") !=
        std::string::npos);

  // Drain: readiness turns NOT_SERVING, liveness stays SERVING while the transfer holds the drain.
  REQUIRE(::kill(daemon.pid(), SIGTERM) == 0);
  bool saw_drain = false;
  for (int i = 0; i < 100 && !saw_drain; ++i) {
    CommandResult ready = Cli(daemon, {"health", "--service", "kvrail.v1.Transfer"});
    if (ready.exit_code == 1 && ready.out.find("NOT_SERVING") != std::string::npos)
      saw_drain = true;
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(saw_drain);
  CommandResult live = Cli(daemon, {"health"});
  INFO(live.out << live.err);
  CHECK(live.exit_code == 0);
  CHECK(live.out == "kvraild: SERVING\n");
  CHECK((*c)->Get(t->transfer_id())->state() == v1::TRANSFER_STATE_RUNNING);
  c->reset();
  CHECK(daemon.Stop(SIGTERM) == 0);

  // Per-transfer lines are debug, with fields as JSON members.
  std::istringstream lines(daemon.ReadLog());
  std::string line;
  bool ended_line = false;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line);
    if (j["msg"] == "transfer ended") {
      ended_line = true;
      CHECK(j["level"] == "debug");
      CHECK(j["transfer_id"] == t->transfer_id());
      CHECK(j["path"] == "host_local");
      CHECK(j["state"] == "failed");  // the drain failed it
      CHECK(j["bytes"] == per_layer);
    }
  }
  CHECK(ended_line);
}

// Ids by `last` and prefix (the CLI lists the transfers the grants' owner submitted: it runs as
// the daemon's uid, so it is the operator and lists every transfer).
TEST_CASE("kvrail transfers show: 'last' and a unique prefix name the transfer") {
  TempDir dir;
  DaemonProcess daemon;
  REQUIRE(daemon.Start(dir.path()));
  auto c = client::Client::Connect(daemon.socket());
  REQUIRE(c.ok());
  const auto layout =
      MakeLayout(4, 2, 16, 16, 2, 64, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(**c, layout, false);
  Pool dst = MakePool(**c, layout, true);
  // The CLI owns no regions: the owner hands it grants.
  auto read = (*c)->CreateGrant(src.id(), v1::GRANT_ACCESS_READ);
  auto write = (*c)->CreateGrant(dst.id(), v1::GRANT_ACCESS_WRITE);
  REQUIRE(read.ok());
  REQUIRE(write.ok());
  CommandResult submitted =
      Cli(daemon, {"submit", "--src-region", std::to_string(src.id()), "--src-blocks", "0-1",
                   "--dst-region", std::to_string(dst.id()), "--dst-blocks", "2-3", "--src-grant",
                   read->token(), "--dst-grant", write->token(), "--layerwise"});
  INFO(submitted.out << submitted.err);
  REQUIRE(submitted.exit_code == 0);
  const std::string id = submitted.out.substr(0, submitted.out.find('\n'));
  for (const std::string& name : {std::string("last"), id.substr(0, id.size() - 1)}) {
    CommandResult shown = Cli(daemon, {"transfers", "show", name, "--json"});
    INFO(name << ": " << shown.out << shown.err);
    CHECK(shown.exit_code == 0);
    CHECK(shown.out.find("\"transfer_id\": \"" + id + "\"") != std::string::npos);
    CHECK(shown.out.find("\"layerwise\": true") != std::string::npos);
  }
  CommandResult bad = Cli(daemon, {"transfers", "show", "x1"});
  CHECK(bad.exit_code == 2);
  c->reset();
  CHECK(daemon.Stop(SIGTERM) == 0);
}

}  // namespace
}  // namespace kvrail::testing

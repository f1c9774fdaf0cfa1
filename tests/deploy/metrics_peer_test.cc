// Prometheus's own checker on what a working pair of daemons exports: two kvraild peered over
// tcp;ofi_rxm on loopback addresses (--insecure-peers, no root), each serving metrics on port 0,
// move KV blocks a -> b; then `promtool check metrics` must find nothing on either /metrics, the
// families an operator relies on are there (process_*, fabric bytes, peers), and both daemons
// name the link of the transfer the same way. The CLI's calls (status, health, regions) register
// no region and log no info line. promtool is Debian's prometheus package (deploy/dev.sh): without
// it the test fails. About 5 s.
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/integration/kv_fixture.h"
#include "tests/netns/netns.h"

namespace kvrail::testing {
namespace {

constexpr uint32_t kLayers = 4, kBlocks = 32, kMoved = 16, kTpb = 16;

v1::PagedKvLayout Layout() {
  return MakeLayout(kLayers, 2, kBlocks, kTpb, 8, 128, v1::DTYPE_BF16,
                    v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

bool PeerUp(NsDaemon& node, const std::string& peer) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  do {
    auto peers = node.client->ListPeers();
    if (peers.ok()) {
      for (const auto& p : peers->peers()) {
        if (p.node_id() == peer && p.state() == v1::PEER_STATE_UP) return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (absl::Now() < until);
  return false;
}

// The port of "metrics on 127.0.0.1:0 (port N)" in the daemon's log (0 when not there yet).
int MetricsPort(const NsDaemon& node) {
  std::smatch m;
  const std::string log = node.Log();
  static const std::regex kPort(R"(metrics on 127\.0\.0\.1:0 \(port (\d+)\))");
  return std::regex_search(log, m, kPort) ? std::stoi(m[1]) : 0;
}

std::string Scrape(int port) {
  const std::string response = HttpGet(port, "/metrics");
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The values of `label` on the samples of `family` in an exposition text.
std::set<std::string> LabelValues(const std::string& text, const std::string& family,
                                  const std::string& label) {
  std::set<std::string> out;
  const std::regex sample("^" + family + R"(\{[^}]*\b)" + label + R"(="([^"]*)\")");
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, sample)) out.insert(m[1]);
  }
  return out;
}

// promtool check metrics on `text`: its findings ("" when clean), or why it could not run.
std::string PromtoolFindings(const std::string& text, const std::string& dir) {
  const std::string file = dir + "/scrape.txt";
  std::ofstream(file) << text;
  CommandResult r = RunCommand({"/bin/sh", "-c",
                                "command -v promtool >/dev/null || "
                                "{ echo 'promtool not installed'; exit 2; }; "
                                "promtool check metrics < '" +
                                    file + "' 2>&1"});
  if (r.exit_code != 0 && r.out.empty()) return "promtool exited " + std::to_string(r.exit_code);
  return r.out;
}

TEST_CASE("a peered pair's /metrics pass promtool after moving bytes, and name the link alike") {
  NsDaemon a, b;
  const std::string ip_a = LoopbackIp(), ip_b = LoopbackIp();
  NsDaemonOptions options;
  options.nics = 1;
  options.extra_config = "metrics_listen: \"127.0.0.1:0\"";
  REQUIRE(a.Start("", "metrics-a", ip_a, "metrics-b", ip_b, options));
  REQUIRE(b.Start("", "metrics-b", ip_b, "metrics-a", ip_a, options));
  INFO("a log:\n" << a.Log() << "\nb log:\n" << b.Log());
  REQUIRE(PeerUp(a, "metrics-b"));
  REQUIRE(PeerUp(b, "metrics-a"));
  const int port_a = MetricsPort(a), port_b = MetricsPort(b);
  REQUIRE(port_a > 0);
  REQUIRE(port_b > 0);

  // The CLI and probes register no region and log no info line per call. The peer's
  // introduction is logged at info on its own time (after PeerUp may already be true): wait for
  // it first, so that it does not land among the CLI's calls.
  const absl::Time introduced_by = absl::Now() + absl::Seconds(10);
  while (a.Log().find("peer 'metrics-b' introduced") == std::string::npos &&
         absl::Now() < introduced_by)
    absl::SleepFor(absl::Milliseconds(20));
  REQUIRE(a.Log().find("peer 'metrics-b' introduced") != std::string::npos);
  const std::string cli = RunfilePath("tools/kvrail/kvrail");
  const size_t log_before = a.Log().size();
  for (int i = 0; i < 3; ++i) {
    CHECK(RunCommand({cli, "--socket", a.socket, "status"}).exit_code == 0);
    CHECK(RunCommand({cli, "--socket", a.socket, "health"}).exit_code == 0);
    CHECK(RunCommand({cli, "--socket", a.socket, "regions"}).exit_code == 0);
  }
  const std::string cli_log = a.Log().substr(log_before);
  INFO("the log during the CLI's calls:\n" << cli_log);
  CHECK(cli_log.find("\"level\":\"info\"") == std::string::npos);
  CHECK(cli_log.find(" info ") == std::string::npos);
  auto stats = a.client->GetStats();
  REQUIRE(stats.ok());
  // Only the test's own client's block-table region, none of the CLI's nine calls.
  CHECK(stats->regions() <= 1);

  Pool src = MakePool(*a.client, Layout(), false, "src");
  Pool dst = MakePool(*b.client, Layout(), true, "dst");
  REQUIRE(b.Export(dst.id(), "metrics-a").ok());
  const auto src_blocks = ScatteredBlocks(kBlocks, kMoved, 1);
  const auto dst_blocks = ScatteredBlocks(kBlocks, kMoved, 2);
  FillPool(src, 3, src_blocks, kMoved * kTpb);
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  spec.mutable_dst()->set_node_id("metrics-b");
  spec.mutable_dst()->set_grant(b.WriteGrant(dst.id()));
  const v1::TransferStatus done = RunToEnd(*a.client, spec);
  INFO(done.DebugString());
  REQUIRE(done.state() == v1::TRANSFER_STATE_SUCCEEDED);

  TempDir dir;
  const std::string text_a = Scrape(port_a), text_b = Scrape(port_b);
  INFO("a /metrics:\n" << text_a << "\nb /metrics:\n" << text_b);
  CHECK(PromtoolFindings(text_a, dir.path()) == "");
  CHECK(PromtoolFindings(text_b, dir.path()) == "");
  for (const std::string* text : {&text_a, &text_b}) {
    for (const char* family :
         {"process_cpu_seconds_total ", "process_resident_memory_bytes ", "process_open_fds ",
          "process_max_fds ", "process_start_time_seconds ", "kvrail_invariant_violations_total ",
          "kvrail_peer_up{"}) {
      INFO(family);
      CHECK(text->find(std::string("\n") + family) != std::string::npos);
    }
  }
  CHECK(LabelValues(text_a, "kvrail_bytes_total", "path").count("fabric") == 1);
  // The link the bytes crossed, as each side names it: one name for one link.
  const std::set<std::string> links_a = LabelValues(text_a, "kvrail_link_bytes_total", "link");
  const std::set<std::string> links_b = LabelValues(text_b, "kvrail_link_bytes_total", "link");
  INFO("a links: " << absl::StrJoin(links_a, ", ")
                   << "; b links: " << absl::StrJoin(links_b, ", "));
  std::set<std::string> fabric_a, fabric_b;
  for (const std::string& l : links_a)
    if (l.rfind("fabric:", 0) == 0) fabric_a.insert(l);
  for (const std::string& l : links_b)
    if (l.rfind("fabric:", 0) == 0) fabric_b.insert(l);
  CHECK(!fabric_a.empty());
  CHECK(fabric_a == fabric_b);
}

}  // namespace
}  // namespace kvrail::testing

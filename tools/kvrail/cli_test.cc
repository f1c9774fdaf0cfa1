#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "tools/kvrail/cli_format.h"
#include "tools/kvrail/cli_top.h"
#include "tools/kvrail/cli_topo.h"
#include "topology/topology.h"

namespace kvrail::client::cli {
namespace {

TEST_CASE("top --json is built by a JSON library: control characters and quotes stay valid") {
  v1::Stats s;
  (*s.mutable_queued_tiles())["critical"] = 3;
  s.set_transfers_active(2);
  // The old hand-built JSON escaped only '"' and '\\': a newline or tab broke the line.
  s.add_engines("cuda:0 BROKEN: \"bad\"\n\tnext \\ line");
  const std::string line = TopFrameJson({{"nvlink_p2p gpu0-gpu1", 312.5}}, s);
  INFO(line);
  CHECK(line.find('\n') == std::string::npos);
  const auto j = nlohmann::json::parse(line);
  CHECK(j["engines"][0] == "cuda:0 BROKEN: \"bad\"\n\tnext \\ line");
  CHECK(j["gbps_by_path"]["nvlink_p2p gpu0-gpu1"] == 312.5);
  CHECK(j["queued_tiles"]["critical"] == 3);
  CHECK(j["transfers_active"] == 2);
}

TEST_CASE("peer and directory states print as the short names of their enums") {
  CHECK(PeerStateName(v1::PEER_STATE_UP) == "up");
  CHECK(PeerStateName(v1::PEER_STATE_DOWN) == "down");
  CHECK(PeerStateName(v1::PEER_STATE_UNKNOWN) == "unknown");
  CHECK(DirectoryKindName(v1::DIRECTORY_KIND_ETCD) == "etcd");
  CHECK(DirectoryKindName(v1::DIRECTORY_KIND_STATIC) == "static");
}

TEST_CASE("transfer ids: 'last', unique prefixes, whole ids, ambiguity named") {
  const std::vector<uint64_t> ids = {8734001, 8734000, 1200055};  // newest first
  CHECK(*MatchTransferId("last", ids) == 8734001);
  CHECK(*MatchTransferId("12", ids) == 1200055);
  CHECK(*MatchTransferId("8734000", ids) == 8734000);
  // Not listed (older than the history page): used as given.
  CHECK(*MatchTransferId("99", ids) == 99);
  auto ambiguous = MatchTransferId("8734", ids);
  REQUIRE_FALSE(ambiguous.ok());
  CHECK(ambiguous.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(ambiguous.status().message()).find("8734001, 8734000") != std::string::npos);
  CHECK_FALSE(MatchTransferId("12x", ids).ok());
  CHECK_FALSE(MatchTransferId("", ids).ok());
  CHECK(MatchTransferId("last", {}).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("rate meter: the last second's rate and the ETA it implies") {
  RateMeter meter;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  CHECK(meter.BytesPerSecond() < 0);
  meter.Add(t0, 0);
  CHECK(meter.EtaSeconds(100) < 0);
  meter.Add(t0 + absl::Milliseconds(500), 1000000000);  // 2 GB/s
  CHECK(meter.BytesPerSecond() == Approx(2e9));
  CHECK(meter.EtaSeconds(3000000000) == Approx(1.0));
  // Slows down: the rate follows the last second, not the average since the start.
  meter.Add(t0 + absl::Milliseconds(1500), 1100000000);
  meter.Add(t0 + absl::Milliseconds(2500), 1200000000);
  CHECK(meter.BytesPerSecond() == Approx(1e8));
  CHECK(meter.EtaSeconds(1200000000) == 0);
  v1::TransferStatus s;
  s.set_bytes_total(2048);
  s.set_bytes_done(1024);
  s.set_state(v1::TRANSFER_STATE_RUNNING);
  CHECK(ProgressLine(s, 0, 1.5, 0, 4.2).find("1.50 GB/s  ETA 4.2s  running") != std::string::npos);
  CHECK(ProgressLine(s, 0, 1.5, 0).find("ETA") == std::string::npos);
}

TEST_CASE("colour: only when asked, and colour codes take no table columns") {
  CHECK(ColourState(v1::TRANSFER_STATE_FAILED, "failed", false) == "failed");
  const std::string red = ColourState(v1::TRANSFER_STATE_FAILED, "failed", true);
  CHECK(red == "\x1b[31mfailed\x1b[0m");
  CHECK(DisplayWidth(red) == 6);
  Table t({"STATE", "N"});
  t.AddRow({red, "1"});
  t.AddRow({"succeeded", "2"});
  const std::string out = t.Render();
  INFO(out);
  CHECK(out.find("\x1b[31mfailed\x1b[0m     1") != std::string::npos);
  // A pipe is not a terminal: no colour in scripts.
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  CHECK_FALSE(UseColour(fds[1]));
  ::close(fds[0]);
  ::close(fds[1]);
}

v1::GetTopologyResponse Fixture(const std::string& name) {
  auto desc = topology::LoadTopologyFile("topology/fixtures/" + name + ".textproto");
  REQUIRE(desc.ok());
  v1::GetTopologyResponse r;
  *r.mutable_desc() = *desc;
  *r.mutable_graph() = topology::ComputeGraph(*desc);
  r.set_source(name);
  return r;
}

size_t Longest(const std::string& text, const std::string& until) {
  size_t longest = 0, start = 0;
  const size_t stop = text.find(until);
  while (start < text.size() && start < stop) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    longest = std::max(longest, end - start);
    start = end + 1;
  }
  return longest;
}

TEST_CASE("topo: identical GPU pairs collapse into one line") {
  const std::string text = RenderTopo(Fixture("dgx_h100"), 0);
  INFO(text);
  CHECK(text.find("every pair (28): nvlink_p2p") != std::string::npos);
  CHECK(text.find("GPU0 <-> GPU1:") == std::string::npos);  // no longer one line per pair
}

TEST_CASE("topo: p5's 32 NICs fit a 120-column terminal (NICs grouped per GPU)") {
  const auto p5 = Fixture("p5_48xlarge");
  REQUIRE(p5.desc().nics_size() == 32);
  const std::string wide = RenderTopo(p5, 0);
  CHECK(Longest(wide, "\nLegend:") > 120);  // unlimited: the full nvidia-smi style matrix
  const std::string text = RenderTopo(p5, 120);
  INFO(text);
  CHECK(Longest(text, "\nLegend:") <= 120);
  CHECK(text.find("GPU to NIC paths") != std::string::npos);
  CHECK(text.find("  GPU0: ") != std::string::npos);
  CHECK(text.find("NIC Legend:") != std::string::npos);  // the names stay
  CHECK(text.find("NIC31") != std::string::npos);
}

TEST_CASE("topo --dot: a Graphviz graph of GPUs, NICs, links and rails") {
  const std::string dot = RenderTopoDot(Fixture("dgx_h100"));
  INFO(dot);
  CHECK(dot.rfind("graph ", 0) == 0);
  CHECK(dot.find("\"GPU0\" -- \"GPU1\" [label=\"NV18") != std::string::npos);
  CHECK(dot.find("subgraph \"cluster_numa0\"") != std::string::npos);
  CHECK(dot.back() == '\n');
  // Balanced braces: one graph, one block per NUMA cluster.
  CHECK(std::count(dot.begin(), dot.end(), '{') == std::count(dot.begin(), dot.end(), '}'));
}

TEST_CASE("top: keys sort the transfers table; unknown keys change nothing") {
  auto row = [](double gbps, uint64_t id, uint64_t done, uint64_t total, v1::Priority p) {
    v1::TransferStatus t;
    t.set_transfer_id(id);
    t.set_bytes_done(done);
    t.set_bytes_total(total);
    t.mutable_spec()->set_priority(p);
    return std::make_pair(gbps, t);
  };
  const std::vector<std::pair<double, v1::TransferStatus>> base = {
      row(1.0, 10, 500, 1000, v1::PRIORITY_BACKGROUND),
      row(9.0, 11, 100, 5000, v1::PRIORITY_NORMAL),
      row(5.0, 12, 900, 900, v1::PRIORITY_CRITICAL),
      row(7.0, 13, 0, 100, v1::PRIORITY_UNSPECIFIED),
  };
  auto ids = [](const std::vector<std::pair<double, v1::TransferStatus>>& rows) {
    std::vector<uint64_t> out;
    for (const auto& r : rows) out.push_back(r.second.transfer_id());
    return out;
  };
  auto sorted = [&](char key) {
    auto rows = base;
    REQUIRE(SortTopRows(key, &rows));
    return ids(rows);
  };
  CHECK(sorted('r') == std::vector<uint64_t>{11, 13, 12, 10});
  CHECK(sorted('b') == std::vector<uint64_t>{12, 10, 11, 13});
  CHECK(sorted('l') == std::vector<uint64_t>{11, 10, 13, 12});
  CHECK(sorted('i') == std::vector<uint64_t>{13, 12, 11, 10});
  // Critical, then normal and unspecified by rate, then background.
  CHECK(sorted('p') == std::vector<uint64_t>{12, 11, 13, 10});
  auto rows = base;
  CHECK_FALSE(SortTopRows('x', &rows));
  CHECK(ids(rows) == ids(base));
  CHECK(TopSortName('x').empty());
  CHECK(TopSortName('l') == "left");
}

TEST_CASE("top: sparklines scale to the window's peak; idle frames are blank") {
  CHECK(Sparkline({}) == "");
  CHECK(Sparkline({0, 0}) == "  ");
  CHECK(Sparkline({1, 0, 8, 4}) == "\u2581 \u2588\u2584");
  CHECK(DisplayWidth(Sparkline({1, 2, 3, 4, 5, 6, 7, 8})) == 8);
}

TEST_CASE("permission denied names the group to join") {
  const std::string hint = PermissionHint("/run/kvrail/kvrail.sock", "kvrail", 990, 0140660);
  CHECK(hint ==
        "permission denied on /run/kvrail/kvrail.sock (group kvrail, mode 0660): join the "
        "socket's group: `sudo usermod -aG kvrail $USER`, then log in again (or run "
        "`newgrp kvrail`)");
  CHECK(PermissionHint("/s", "", 4242, 0660).find("group 4242") != std::string::npos);
  // Not a socket, not a path, or reachable: nothing to say.
  CHECK(SocketPermissionProblem("/nonexistent/kvrail.sock").empty());
  CHECK(SocketPermissionProblem("127.0.0.1:7070").empty());
}

TEST_CASE("a socket the user may not open is reported with its group (run as another user)") {
  if (::geteuid() != 0) {
    WARN("needs root to drop to another user; skipped");
    return;
  }
  char dir[] = "/tmp/kvrail-perm-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  REQUIRE(::chmod(dir, 0755) == 0);
  const std::string path = std::string(dir) + "/k.sock";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::chmod(path.c_str(), 0660) == 0);  // root:root 0660
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(pipefd[0]);
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(3);
    const std::string hint = SocketPermissionProblem(path);
    (void)!::write(pipefd[1], hint.data(), hint.size());
    _exit(0);
  }
  ::close(pipefd[1]);
  std::string hint;
  char buf[512];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof(buf))) > 0) hint.append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  // Root may open it: nothing to report.
  const std::string as_root = SocketPermissionProblem(path);
  ::close(fd);
  ::unlink(path.c_str());
  ::rmdir(dir);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 3) {
    WARN("could not switch to uid 65534 here (a sandbox without that uid); skipped");
    return;
  }
  REQUIRE(WEXITSTATUS(status) == 0);
  INFO(hint);
  CHECK(hint.rfind("permission denied on " + path + " (group root, mode 0660)", 0) == 0);
  CHECK(as_root.empty());
}

}  // namespace
}  // namespace kvrail::client::cli

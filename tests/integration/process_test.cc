// kvraild as a process among processes: a client that dies mid-transfer, SIGTERM with transfers
// in flight, restart on the same socket, and the `kvrail` CLI against a live daemon.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/integration/kv_fixture.h"

extern char** environ;

namespace kvrail::testing {
namespace {

using client::Client;

// Runs source_client with stdout to a file; returns its pid.
pid_t SpawnSourceClient(const std::vector<std::string>& args, const std::string& out_path) {
  std::vector<std::string> all = {RunfilePath("tests/integration/source_client")};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT, 0644);
  pid_t pid = -1;
  posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

uint64_t ReadId(const std::string& path) {
  std::ifstream in(path);
  uint64_t id = 0;
  in >> id;
  return id;
}

Expectation ProcessExpectation(uint32_t seed) {
  Expectation e;
  e.seed = seed;
  e.dst_blocks = ScatteredBlocks(ProcessTestLayout().num_blocks(), kProcessTestBlocks, 22);
  e.tokens = uint64_t{kProcessTestBlocks} * ProcessTestLayout().tokens_per_block();
  e.num_layers = kProcessTestLayers;
  e.num_heads = ProcessTestLayout().num_heads();
  return e;
}

// "<id>:<write grant>" of a destination pool the test's client owns, for source_client.
std::string DstArg(Client& c, const Pool& dst) {
  auto grant = c.CreateGrant(dst.id(), v1::GRANT_ACCESS_WRITE);
  REQUIRE(grant.ok());
  return std::to_string(dst.id()) + ":" + grant->token();
}

TEST_CASE("a client that dies mid-transfer: its transfer completes, its regions are released") {
  TempDir dir;
  DaemonProcess daemon;
  REQUIRE(daemon.Start(dir.path(), {"--host-threads", "1", "--tile-bytes", "65536"}));
  auto c = Client::Connect(daemon.socket());
  REQUIRE(c.ok());
  Pool dst = MakePool(**c, ProcessTestLayout(), true, "survivor");
  // The source client submits a layer-wise transfer, releases every layer, and exits at once
  // without unregistering anything: its session closes with the process, likely before its
  // tiles have all run.
  const std::string out = dir.path() + "/id";
  const pid_t pid = SpawnSourceClient(
      {daemon.socket(), DstArg(**c, dst), "77", "die", std::to_string(kProcessTestLayers)}, out);
  REQUIRE(pid > 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const uint64_t id = ReadId(out);
  REQUIRE(id != 0);
  // The dead client's region leaves the table (session ended) ...
  bool released = false;
  for (int i = 0; i < 500 && !released; ++i) {
    auto regions = (*c)->ListRegions();
    REQUIRE(regions.ok());
    released = regions->regions_size() == 1;
    if (!released) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(released);
  // ... but the transfer holds its mapping: every byte still lands right. Only its (dead)
  // submitter could have marked layers ready: another session may not.
  CHECK((*c)->MarkReady(id, 0, 1).code() == absl::StatusCode::kPermissionDenied);
  auto final_status = (*c)->Wait(id, absl::Seconds(60));
  REQUIRE(final_status.ok());
  CHECK(final_status->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, ProcessExpectation(77)) == "");
  // The daemon keeps serving.
  auto stats = (*c)->GetStats();
  REQUIRE(stats.ok());
  CHECK(stats->transfers_succeeded() == 1);
  c->reset();
  CHECK(daemon.Stop(SIGTERM) == 0);
}

TEST_CASE("SIGTERM drains: in-flight transfers finish or fail cleanly, the daemon exits 0") {
  TempDir dir;
  DaemonProcess daemon;
  REQUIRE(daemon.Start(
      dir.path(), {"--host-threads", "1", "--tile-bytes", "65536", "--drain-timeout-ms", "3000"}));
  auto c = Client::Connect(daemon.socket());
  REQUIRE(c.ok());
  Pool dst = MakePool(**c, ProcessTestLayout(), true, "decode");
  Pool stuck_dst = MakePool(**c, ProcessTestLayout(), true, "never-written");
  // A bulk transfer (finishes within the drain timeout) and a layer-wise one that never gets a
  // ready layer (failed by the drain).
  const std::string out = dir.path() + "/id";
  const pid_t pid = SpawnSourceClient({daemon.socket(), DstArg(**c, dst), "5", "die"}, out);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  const uint64_t bulk = ReadId(out);
  REQUIRE(bulk != 0);
  auto src = MakePool(**c, ProcessTestLayout(), false, "src");
  auto spec = client::MakeBlockTransfer(src.id(), {0, 1, 2}, stuck_dst.id(), {3, 4, 5});
  spec.set_layerwise(true);
  auto stuck = (*c)->Submit(spec);
  REQUIRE(stuck.ok());
  // Watch both until their streams end, from another client connection each.
  v1::TransferStatus bulk_final, stuck_final;
  auto watch = [&](uint64_t id, v1::TransferStatus* last) {
    auto wc = Client::Connect(daemon.socket());
    REQUIRE(wc.ok());
    auto r = (*wc)->Watch(id, [&](const v1::TransferEvent& e) {
      *last = e.status();
      return true;
    });
    CHECK(r.ok());
  };
  std::thread w1(watch, bulk, &bulk_final);
  std::thread w2(watch, stuck->transfer_id(), &stuck_final);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(daemon.pid(), SIGTERM);
  // Once the daemon says it is draining (the stuck transfer holds the drain open for 3 s), new
  // work is refused.
  bool draining = false;
  for (int i = 0; i < 2000 && !draining; ++i) {
    auto stats = (*c)->GetStats();
    REQUIRE(stats.ok());
    draining = stats->draining();
    if (!draining) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(draining);
  auto refused = (*c)->Submit(client::MakeBlockTransfer(src.id(), {0}, dst.id(), {9}));
  CHECK(refused.status().code() == absl::StatusCode::kUnavailable);
  w1.join();
  w2.join();
  c->reset();
  CHECK(daemon.Stop(SIGTERM, 20000) == 0);
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  CHECK((elapsed < std::chrono::seconds(15)));
  CHECK(bulk_final.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, ProcessExpectation(5)) == "");
  CHECK(stuck_final.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(stuck_final.error_code() == static_cast<int>(absl::StatusCode::kUnavailable));
  CHECK(CountWritten(stuck_dst) == 0);
  CHECK(daemon.ReadLog().find("stopped") != std::string::npos);
}

TEST_CASE("restart on the same socket: the daemon serves again; old ids are unknown") {
  TempDir dir;
  uint64_t old_transfer = 0;
  {
    DaemonProcess daemon;
    REQUIRE(daemon.Start(dir.path()));
    auto c = Client::Connect(daemon.socket());
    REQUIRE(c.ok());
    const auto layout =
        MakeLayout(2, 2, 8, 16, 2, 64, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
    Pool src = MakePool(**c, layout, false);
    Pool dst = MakePool(**c, layout, true);
    auto submitted = (*c)->Submit(client::MakeBlockTransfer(src.id(), {1, 2}, dst.id(), {3, 4}));
    REQUIRE(submitted.ok());
    old_transfer = submitted->transfer_id();
    REQUIRE((*c)->Wait(old_transfer, absl::Seconds(10)).ok());
    c->reset();
    // SIGKILL: the socket files stay behind, as after a crash.
    CHECK(daemon.Stop(SIGKILL) == -1);
  }
  DaemonProcess daemon;
  REQUIRE(daemon.Start(dir.path()));
  auto c = Client::Connect(daemon.socket());
  REQUIRE(c.ok());
  CHECK((*c)->Get(old_transfer).status().code() == absl::StatusCode::kNotFound);
  auto regions = (*c)->ListRegions();
  REQUIRE(regions.ok());
  CHECK(regions->regions_size() == 0);
  const auto layout =
      MakeLayout(1, 1, 4, 16, 1, 64, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(**c, layout, false);
  Pool dst = MakePool(**c, layout, true);
  FillPool(src, 4, {0}, 16);
  auto submitted = (*c)->Submit(client::MakeBlockTransfer(src.id(), {0}, dst.id(), {2}));
  REQUIRE(submitted.ok());
  CHECK(submitted->transfer_id() > old_transfer);  // ids never repeat across restarts
  auto done = (*c)->Wait(submitted->transfer_id(), absl::Seconds(10));
  REQUIRE(done.ok());
  CHECK(done->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, Expectation{4, {2}, 16, 0, 0, 1, 0, 0, 1}) == "");
  c->reset();
  CHECK(daemon.Stop(SIGTERM) == 0);
}

TEST_CASE("the kvrail CLI against a live daemon: tables, --json, submit --wait, errors") {
  TempDir dir;
  DaemonProcess daemon;
  REQUIRE(daemon.Start(dir.path()));
  auto c = Client::Connect(daemon.socket());
  REQUIRE(c.ok());
  const auto layout =
      MakeLayout(2, 2, 16, 16, 2, 64, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(**c, layout, false, "cli-src");
  Pool dst = MakePool(**c, layout, true, "cli-dst");
  FillPool(src, 8, {0, 1, 2, 3}, 64);
  const std::string cli = RunfilePath("tools/kvrail/kvrail");
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {cli, "--socket", daemon.socket()});
    return RunCommand(args);
  };

  // The CLI is another session: the pools' owner hands it grants (without them: refused).
  auto denied = run({"submit", "--src-region", std::to_string(src.id()), "--src-blocks", "0-3",
                     "--dst-region", std::to_string(dst.id()), "--dst-blocks", "12,9,10,11"});
  CHECK(denied.exit_code == 1);
  CHECK(denied.err.find("PERMISSION_DENIED") != std::string::npos);
  CHECK(denied.err.find("spec.src.region_id") != std::string::npos);
  const std::string read_grant = (*c)->CreateGrant(src.id(), v1::GRANT_ACCESS_READ)->token();
  const std::string write_grant = (*c)->CreateGrant(dst.id(), v1::GRANT_ACCESS_WRITE)->token();
  auto submitted =
      run({"submit", "--src-region", std::to_string(src.id()), "--src-blocks", "0-3",
           "--dst-region", std::to_string(dst.id()), "--dst-blocks", "12,9,10,11", "--src-grant",
           read_grant, "--dst-grant", write_grant, "--label", "cli-test", "--wait"});
  INFO(submitted.out << submitted.err);
  REQUIRE(submitted.exit_code == 0);
  CHECK(VerifyPool(dst, Expectation{8, {12, 9, 10, 11}, 64, 0, 0, 2, 0, 0, 2}) == "");

  auto regions = run({"--json", "regions"});
  REQUIRE(regions.exit_code == 0);
  auto regions_json = nlohmann::json::parse(regions.out);
  REQUIRE(regions_json.is_array());
  CHECK(regions_json.size() == 2);
  CHECK(regions_json[1]["spec"]["name"].get<std::string>() == "cli-dst");

  auto transfers = run({"--json", "transfers"});
  REQUIRE(transfers.exit_code == 0);
  auto transfers_json = nlohmann::json::parse(transfers.out);
  REQUIRE(transfers_json.size() == 1);
  CHECK(transfers_json[0]["state"].get<std::string>() == "TRANSFER_STATE_SUCCEEDED");
  CHECK(transfers_json[0]["path"].get<std::string>() == "PATH_HOST_LOCAL");
  CHECK(transfers_json[0]["spec"]["label"].get<std::string>() == "cli-test");
  const std::string id = transfers_json[0]["transfer_id"].get<std::string>();

  auto show = run({"transfers", "show", id});
  REQUIRE(show.exit_code == 0);
  CHECK((show.out.find("host_local") != std::string::npos ||
         show.out.find("HOST_LOCAL") != std::string::npos ||
         show.out.find("host-local") != std::string::npos));
  auto table = run({"transfers"});
  REQUIRE(table.exit_code == 0);
  CHECK(table.out.find(id) != std::string::npos);
  auto watch = run({"transfers", "watch", id});
  CHECK(watch.exit_code == 0);

  auto status = run({"--json", "status"});
  REQUIRE(status.exit_code == 0);
  auto status_json = nlohmann::json::parse(status.out);
  CHECK(status_json["transfers_succeeded"].get<std::string>() == "1");

  auto health = run({"health"});
  CHECK(health.exit_code == 0);
  CHECK(health.out.find("SERVING") != std::string::npos);
  auto ready = run({"health", "--service", "kvrail.v1.Transfer"});
  CHECK(ready.exit_code == 0);
  auto unknown_service = run({"health", "--service", "no.such.Service"});
  CHECK(unknown_service.exit_code == 1);
  auto top = run({"--json", "top", "--iterations", "2", "--interval-ms", "50"});
  REQUIRE(top.exit_code == 0);
  {
    std::istringstream lines(top.out);
    std::string line;
    int frames = 0;
    while (std::getline(lines, line)) {
      auto frame = nlohmann::json::parse(line);
      CHECK(frame.contains("gbps_by_path"));
      CHECK(frame["queued_tiles"].contains("critical"));
      CHECK(frame["engines"].size() >= 1);
      ++frames;
    }
    CHECK(frames == 2);
  }
  auto top_text = run({"top", "--iterations", "1"});
  CHECK(top_text.exit_code == 0);
  CHECK(top_text.out.find("QUEUED TILES") != std::string::npos);

  // Errors: stderr names the field, exit code 1 (daemon said no) or 2 (usage).
  auto bad = run({"submit", "--src-region", std::to_string(src.id()), "--src-blocks", "0-3",
                  "--dst-region", std::to_string(dst.id()), "--dst-blocks", "0,1,2,99",
                  "--src-grant", read_grant, "--dst-grant", write_grant});
  CHECK(bad.exit_code == 1);
  CHECK(bad.err.find("spec.dst.block_ids[3]") != std::string::npos);
  auto unknown = run({"transfers", "show", "123"});
  CHECK(unknown.exit_code == 1);
  CHECK(unknown.err.find("NOT_FOUND") != std::string::npos);
  auto usage = run({"submit", "--src-region", "1"});
  CHECK(usage.exit_code == 2);
  auto no_daemon = RunCommand({cli, "--socket", dir.path() + "/nothing.sock", "status"});
  CHECK(no_daemon.exit_code == 1);
  CHECK(!no_daemon.err.empty());
  c->reset();
  CHECK(daemon.Stop(SIGTERM) == 0);
}

}  // namespace
}  // namespace kvrail::testing

namespace kvrail::testing {
namespace {

TEST_CASE("kvrail topo: a replayed fixture renders, --json parses, --dump replays identically") {
  TempDir dir;
  DaemonProcess daemon;
  REQUIRE(daemon.Start(dir.path(), {"--topology-file", "topology/fixtures/dgx_h100.textproto"}));
  const std::string cli = RunfilePath("tools/kvrail/kvrail");
  auto text = RunCommand({cli, "--socket", daemon.socket(), "topo"});
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("NV18") != std::string::npos);
  CHECK(text.out.find("PIX") != std::string::npos);
  auto json = RunCommand({cli, "--socket", daemon.socket(), "--json", "topo"});
  REQUIRE(json.exit_code == 0);
  auto parsed = nlohmann::json::parse(json.out);
  CHECK(parsed["desc"]["gpus"].size() == 8);
  CHECK(parsed["source"].get<std::string>() == "topology/fixtures/dgx_h100.textproto");
  auto dump = RunCommand({cli, "--socket", daemon.socket(), "topo", "--dump"});
  REQUIRE(dump.exit_code == 0);
  CHECK(daemon.Stop(SIGTERM) == 0);
  // The dump replays into a second daemon and renders the same matrix.
  const std::string file = dir.path() + "/node.textproto";
  std::ofstream(file) << dump.out;
  TempDir dir2;
  DaemonProcess replayed;
  REQUIRE(replayed.Start(dir2.path(), {"--topology-file", file}));
  auto again = RunCommand({cli, "--socket", replayed.socket(), "topo"});
  REQUIRE(again.exit_code == 0);
  CHECK(again.out.substr(again.out.find('\n')) == text.out.substr(text.out.find('\n')));
  CHECK(replayed.Stop(SIGTERM) == 0);
}

}  // namespace
}  // namespace kvrail::testing

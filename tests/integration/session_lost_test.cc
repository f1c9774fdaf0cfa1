// The client's session-lost contract (client/kvrail_client.h, "Session lost") call by call: once
// kvraild is gone, every unary call that fails says "session lost"; after the daemon is back,
// ResetSession succeeds at its first try and every call works again. And a ResetSession racing
// calls that use the session never frees the connection under them.
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

using client::Client;

v1::PagedKvLayout Small() {
  return MakeLayout(2, 2, 8, 4, 2, 8, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

// A daemon the test stops and starts again on the same socket, and a client of it.
struct Restartable {
  TempDir dir;
  DaemonProcess daemon;
  std::unique_ptr<Client> client;
  bool running = false;
  Restartable() {
    Start();
    auto c = Client::Connect(daemon.socket());
    REQUIRE(c.ok());
    client = *std::move(c);
  }
  // Without an in-process health probe: the client's channel alone reconnects (as when another
  // process restarts the daemon).
  void Start() {
    REQUIRE(daemon.Start(dir.path(), {}, /*probe=*/false));
    running = true;
  }
  void Stop() {
    REQUIRE(daemon.Stop(SIGTERM) == 0);
    running = false;
  }
  // Until the client's monitor sees the session socket close (up to 10 s).
  void AwaitLost() {
    for (int i = 0; i < 1000 && !client->session_lost(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(client->session_lost());
  }
  ~Restartable() {
    client.reset();
    if (running) CHECK(daemon.Stop(SIGTERM) == 0);
  }
};

// One unary call of the client, by name, as a Status.
struct Call {
  std::string name;
  std::function<absl::Status()> run;
};

// Every unary call of Client, with the ids of a region, a transfer and a grant of the session.
std::vector<Call> UnaryCalls(Client& c, uint64_t region, uint64_t transfer,
                             const std::string& grant) {
  auto status = [](const auto& result) { return result.status(); };
  return {
      {"RegisterRegion",
       [&c, status] {
         v1::RegionSpec spec;
         spec.set_size_bytes(4096);
         spec.mutable_share()->set_fd_token("stale-token");
         return status(c.RegisterRegion(spec));
       }},
      {"UnregisterRegion", [&c, region] { return c.UnregisterRegion(region); }},
      {"Submit",
       [&c, status, region] {
         return status(c.Submit(client::MakeBlockTransfer(region, {0}, region, {1})));
       }},
      {"Get", [&c, status, transfer] { return status(c.Get(transfer)); }},
      {"Wait", [&c, status, transfer] { return status(c.Wait(transfer, absl::Seconds(1))); }},
      {"Cancel", [&c, status, transfer] { return status(c.Cancel(transfer)); }},
      {"MarkReady", [&c, transfer] { return c.MarkReady(transfer, 0); }},
      {"CreateGrant",
       [&c, status, region] { return status(c.CreateGrant(region, v1::GRANT_ACCESS_READ)); }},
      {"RevokeGrant", [&c, grant] { return c.RevokeGrant(grant); }},
      {"ExportRegion", [&c, status, region] { return status(c.ExportRegion(region, "peer")); }},
      {"PollNotifications", [&c, status] { return status(c.PollNotifications()); }},
      {"ListRegions", [&c, status] { return status(c.ListRegions()); }},
      {"ListTransfers", [&c, status] { return status(c.ListTransfers()); }},
      {"ListPeers", [&c, status] { return status(c.ListPeers()); }},
      {"GetStats", [&c, status] { return status(c.GetStats()); }},
      {"GetTopology", [&c, status] { return status(c.GetTopology()); }},
  };
}

TEST_CASE("after kvraild stops, every unary call that fails reports the session lost") {
  Restartable live;
  Client& c = *live.client;
  Pool pool = MakePool(c, Small(), /*writable=*/true);
  const v1::TransferStatus done =
      RunToEnd(c, client::MakeBlockTransfer(pool.id(), {0}, pool.id(), {1}));
  REQUIRE(done.state() == v1::TRANSFER_STATE_SUCCEEDED);
  auto grant = c.CreateGrant(pool.id(), v1::GRANT_ACCESS_READ);
  REQUIRE(grant.ok());

  live.Stop();
  live.AwaitLost();
  for (const Call& call : UnaryCalls(c, pool.id(), done.transfer_id(), grant->token())) {
    INFO(call.name);
    const absl::Status s = call.run();
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StartsWith(s.message(), "session lost: "));
  }

  // Back again: the session is reset and the calls that need nothing of the old one work.
  live.Start();
  const absl::Status reset = c.ResetSession();
  INFO(reset.ToString());
  REQUIRE(reset.ok());
  CHECK_FALSE(c.session_lost());
  for (const Call& call : UnaryCalls(c, pool.id(), done.transfer_id(), grant->token())) {
    if (!absl::StartsWith(call.name, "List") && call.name != "GetStats" &&
        call.name != "GetTopology" && call.name != "PollNotifications") {
      continue;
    }
    INFO(call.name);
    const absl::Status s = call.run();
    INFO(s.ToString());
    CHECK(s.ok());
  }
  CHECK_FALSE(c.session_lost());
  Pool again = MakePool(c, Small(), /*writable=*/true);
  CHECK(RunToEnd(c, client::MakeBlockTransfer(again.id(), {0}, again.id(), {1})).state() ==
        v1::TRANSFER_STATE_SUCCEEDED);
}

TEST_CASE("ResetSession right after the daemon is back succeeds at its first try") {
  Restartable live;
  Client& c = *live.client;
  const std::string first = c.instance_id();
  live.Stop();
  live.AwaitLost();
  // Calls while the daemon is away (an application's health checks, say) keep the gRPC channel
  // in reconnect back-off, which outlasts the daemon's start.
  std::atomic<bool> started{false};
  std::thread calls([&] {
    while (!started.load()) {
      (void)c.GetStats();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  live.Start();
  started.store(true);
  calls.join();
  const absl::Status reset = c.ResetSession();
  INFO(reset.ToString());
  REQUIRE(reset.ok());
  CHECK(c.instance_id() != first);
  Pool pool = MakePool(c, Small(), /*writable=*/true);
  CHECK(pool.id() != 0);
}

TEST_CASE("ResetSession while other threads use the session frees nothing under them") {
  Restartable live;
  Client& c = *live.client;
  auto buffer = c.CreateHostBuffer(4096);
  REQUIRE(buffer.ok());
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> users;
  for (int t = 0; t < 2; ++t) {
    users.emplace_back([&] {
      while (!stop.load()) {
        if (!c.SessionId().ok()) failures.fetch_add(1);
        if (!c.ShareFd((*buffer)->fd()).ok()) failures.fetch_add(1);
      }
    });
  }
  int resets = 0;
  for (; resets < 300; ++resets) {
    const absl::Status reset = c.ResetSession();
    if (!reset.ok()) {
      INFO(reset.ToString());
      CHECK(reset.ok());
      break;
    }
  }
  stop.store(true);
  for (std::thread& t : users) t.join();
  CHECK(resets == 300);
  CHECK(failures.load() == 0);
  CHECK_FALSE(c.session_lost());
}

}  // namespace
}  // namespace kvrail::testing

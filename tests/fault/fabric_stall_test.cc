// A transient stall of a peer costs the transfers in flight at most, never the pair: two real
// kvraild daemons peered over tcp;ofi_rxm on two loopback addresses (--insecure-peers, two fabric
// lanes each; no namespaces, no root).
//
// One daemon is stopped (SIGSTOP) for 4 s - twice its peer's liveness timeout, as CPU starvation, a
// cgroup throttle or a paused VM would - while tiles of a layer-wise transfer are queued and in
// flight to it (or from it), then continued (SIGCONT). The transfer in flight may fail (it must
// END, well before its deadline); afterwards both sides see each other up again, and further rounds
// in both directions - more of them than the lanes have slots, so a slot lost to the stall would
// show - SUCCEED byte for byte with nothing written outside their blocks. Each round has its own
// short deadline so a lane that never came back fails the test at once, with both daemons' logs,
// instead of hanging.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/kv_fixture.h"
#include "tests/netns/netns.h"

namespace kvrail::testing {
namespace {

// NsDaemon's fabric config: liveness_timeout_ms 2000; the stall is twice that.
constexpr auto kStall = std::chrono::milliseconds(4000);
// The stalled transfer's deadline: it must end (either way) long before.
constexpr uint32_t kDeadlineMs = 60000;
// Each round after the stall: generous for a loaded 2-core machine, short beside a hang.
constexpr uint32_t kRoundDeadlineMs = 15000;
// Rounds after the stall, each direction: 2 lanes x 8 slots are 16 slots; each round moves more
// tiles than that, so every slot of every lane is used again.
constexpr int kRounds = 3;

constexpr uint32_t kLayers = 8, kBlocks = 64, kMoved = 48, kTpb = 16;

v1::PagedKvLayout Layout() {
  return MakeLayout(kLayers, 2, kBlocks, kTpb, 8, 128, v1::DTYPE_BF16,
                    v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

bool PeerIs(NsDaemon& node, const std::string& peer, v1::PeerState state, absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  do {
    auto peers = node.client->ListPeers();
    if (peers.ok()) {
      for (const auto& p : peers->peers()) {
        if (p.node_id() == peer && p.state() == state) return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (absl::Now() < until);
  return false;
}

struct PeerPair {
  NsDaemon a, b;
  const std::string ip_a = LoopbackIp(), ip_b = LoopbackIp();
  bool ok = false;
  PeerPair() {
    NsDaemonOptions options;
    options.nics = 2;
    ok = a.Start("", "stall-a", ip_a, "stall-b", ip_b, options) &&
         b.Start("", "stall-b", ip_b, "stall-a", ip_a, options) &&
         PeerIs(a, "stall-b", v1::PEER_STATE_UP, absl::Seconds(10)) &&
         PeerIs(b, "stall-a", v1::PEER_STATE_UP, absl::Seconds(10));
    if (!ok) UNSCOPED_INFO("a log:\n" << a.Log() << "\nb log:\n" << b.Log());
  }
  std::string Logs() const { return absl::StrCat("a log:\n", a.Log(), "\nb log:\n", b.Log()); }
};

// One transfer from `from` to `to` (node `to_id`) of kMoved scattered blocks, all layers, within
// kRoundDeadlineMs: REQUIREd to succeed byte for byte, nothing outside its blocks written.
void Round(PeerPair& p, NsDaemon& from, NsDaemon& to, const std::string& from_id,
           const std::string& to_id, uint32_t seed, const std::string& what) {
  INFO(what);
  Pool src = MakePool(*from.client, Layout(), false, "round-src");
  Pool dst = MakePool(*to.client, Layout(), true, "round-dst");
  REQUIRE(to.Export(dst.id(), from_id).ok());
  const auto src_blocks = ScatteredBlocks(kBlocks, kMoved, seed);
  const auto dst_blocks = ScatteredBlocks(kBlocks, kMoved, seed + 1);
  FillPool(src, seed + 2, src_blocks, kMoved * kTpb);
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  spec.mutable_dst()->set_node_id(to_id);
  spec.mutable_dst()->set_grant(to.WriteGrant(dst.id()));
  spec.set_timeout_ms(kRoundDeadlineMs);
  const auto t0 = std::chrono::steady_clock::now();
  auto submitted = from.client->Submit(spec);
  INFO(submitted.status().ToString() << "\n" << p.Logs());
  REQUIRE(submitted.ok());
  auto ended = from.client->Wait(submitted->transfer_id(), absl::Milliseconds(kRoundDeadlineMs));
  INFO(ended.status());
  REQUIRE(ended.ok());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(ended->DebugString() << "after " << seconds << " s");
  REQUIRE(ended->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, Expectation{seed + 2, dst_blocks, kMoved * kTpb, 0, 0, kLayers, 0, 0, 8}) ==
        "");
}

// A layer-wise transfer from -> to of kMoved blocks, its first layer released; the transfer id.
struct Pending {
  Pool src, dst;
  std::vector<uint32_t> dst_blocks;
  uint32_t seed = 0;
  uint64_t id = 0;
};
Pending SubmitLayerwise(PeerPair& p, NsDaemon& from, NsDaemon& to, const std::string& from_id,
                        const std::string& to_id, uint32_t seed) {
  Pending t;
  t.seed = seed;
  t.src = MakePool(*from.client, Layout(), false, "src");
  t.dst = MakePool(*to.client, Layout(), true, "dst");
  REQUIRE(to.Export(t.dst.id(), from_id).ok());
  const auto src_blocks = ScatteredBlocks(kBlocks, kMoved, seed);
  t.dst_blocks = ScatteredBlocks(kBlocks, kMoved, seed + 1);
  FillPool(t.src, seed + 2, src_blocks, kMoved * kTpb);
  auto spec = client::MakeBlockTransfer(t.src.id(), src_blocks, t.dst.id(), t.dst_blocks);
  spec.mutable_dst()->set_node_id(to_id);
  spec.mutable_dst()->set_grant(to.WriteGrant(t.dst.id()));
  spec.set_timeout_ms(kDeadlineMs);
  spec.set_layerwise(true);
  auto submitted = from.client->Submit(spec);
  INFO(submitted.status().ToString() << "\n" << p.Logs());
  REQUIRE(submitted.ok());
  t.id = submitted->transfer_id();
  REQUIRE(from.client->MarkReady(t.id, 0, 1).ok());
  return t;
}

// The stalled transfer `t` (sent by `from`) ends, either way, well before its deadline; when it
// succeeded its destination is byte for byte.
void AwaitStalled(PeerPair& p, NsDaemon& from, Pending& t, const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  auto ended = from.client->Wait(t.id, absl::Seconds(30));
  INFO(ended.status());
  REQUIRE(ended.ok());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(what << ": " << ended->DebugString() << "ended " << seconds << " s after SIGCONT\n"
            << p.Logs());
  REQUIRE((ended->state() == v1::TRANSFER_STATE_SUCCEEDED ||
           ended->state() == v1::TRANSFER_STATE_FAILED));
  if (ended->state() == v1::TRANSFER_STATE_SUCCEEDED) {
    CHECK(VerifyPool(t.dst, Expectation{t.seed + 2, t.dst_blocks, kMoved * kTpb, 0, 0, kLayers, 0,
                                        0, 8}) == "");
  }
  WARN(what << ": " << v1::TransferState_Name(ended->state()) << " " << seconds
            << " s after SIGCONT (" << ended->error_message() << ")");
}

// Stops b for kStall while layer-wise transfers both ways have tiles queued and in flight (a -> b
// released into the stalled link; b -> a released just before, so b stops with its tiles out and
// a's credits for them owed to a stopped process), continues it, and requires the pair to work
// again in both directions.
void StallMidTransfer() {
  PeerPair p;
  REQUIRE(p.ok);
  Pending to_b = SubmitLayerwise(p, p.a, p.b, "stall-a", "stall-b", 1);
  Pending to_a = SubmitLayerwise(p, p.b, p.a, "stall-b", "stall-a", 11);
  REQUIRE(p.b.client->MarkReady(to_a.id, 1, kLayers - 1).ok());
  REQUIRE(kill(p.b.pid, SIGSTOP) == 0);
  REQUIRE(p.a.client->MarkReady(to_b.id, 1, kLayers - 1).ok());
  std::this_thread::sleep_for(kStall);
  REQUIRE(kill(p.b.pid, SIGCONT) == 0);
  AwaitStalled(p, p.a, to_b, "a -> b (into the stalled daemon)");
  AwaitStalled(p, p.b, to_a, "b -> a (from the stalled daemon)");

  // Both see each other up again; every later round in both directions succeeds.
  REQUIRE(PeerIs(p.a, "stall-b", v1::PEER_STATE_UP, absl::Seconds(15)));
  REQUIRE(PeerIs(p.b, "stall-a", v1::PEER_STATE_UP, absl::Seconds(15)));
  for (int r = 0; r < kRounds; ++r) {
    Round(p, p.a, p.b, "stall-a", "stall-b", 100 + 10 * r, absl::StrCat("round ", r, " a -> b"));
    Round(p, p.b, p.a, "stall-b", "stall-a", 200 + 10 * r, absl::StrCat("round ", r, " b -> a"));
  }
  CHECK(waitpid(p.a.pid, nullptr, WNOHANG) == 0);
  CHECK(waitpid(p.b.pid, nullptr, WNOHANG) == 0);
}

TEST_CASE(
    "a daemon stalled 4 s with tiles in flight both ways: the pair works again "
    "afterwards, both directions, byte for byte") {
  StallMidTransfer();
}

}  // namespace
}  // namespace kvrail::testing

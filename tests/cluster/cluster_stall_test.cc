// A transient stall of one daemon costs the transfers in flight at most, never its peerings: two
// kvraild daemons in network namespaces finding each other through a real etcd (lease TTL 2 s,
// liveness timeout 2 s, mTLS), as the cluster test runs them.
//
// Daemon a is stopped (SIGSTOP) for 4 s - longer than its etcd lease and its peer's liveness
// timeout, as CPU starvation, a cgroup throttle or a paused VM would - while layer-wise transfers
// both ways have tiles queued and in flight, then continued (SIGCONT). Meanwhile b sees a's record
// gone and reclaims a's peer index; a, back, is re-added under a new index and generation. The
// stalled transfers must END (either way) well before their deadlines; then the two see each other
// up again and rounds both ways - more tiles each than the lanes have slots, so a slot lost to the
// stall would show - SUCCEED byte for byte with nothing written outside their blocks. Each round
// has a short deadline: a pair that never recovered fails the test at once with both daemons' logs,
// instead of hanging.
//
// Needs root (SKIPs with the reason otherwise) and etcd (FAILs without it), like cluster_test.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/cluster/cluster.h"
#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

constexpr auto kStall = std::chrono::milliseconds(4000);  // lease TTL 2 s, liveness 2 s
constexpr uint32_t kStalledDeadlineMs = 30000;
constexpr uint32_t kRoundDeadlineMs = 15000;
constexpr int kRounds = 3;
// 2 parts x 16 tokens x 4 heads x 64 x 2 bytes = 16 KiB per block and layer: a transfer moves 1.5
// MiB, a dozen 128 KiB tiles, more than the 4 slots the cluster gives each peer.
constexpr uint32_t kLayers = 4, kBlocks = 32, kMoved = 24, kTpb = 16;

v1::PagedKvLayout Layout() {
  return MakeLayout(kLayers, 2, kBlocks, kTpb, 4, 64, v1::DTYPE_BF16,
                    v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

struct Moved {
  Pool src, dst;
  std::vector<uint32_t> dst_blocks;
  uint32_t seed = 0;
  uint64_t id = 0;
};

// Submits from -> to (kMoved blocks, all layers; layer-wise with only its first layer released when
// `layerwise`); REQUIREs the submit.
Moved Submit(Cluster& c, ClusterNode& from, ClusterNode& to, uint32_t seed, bool layerwise,
             uint32_t deadline_ms) {
  Moved m;
  m.seed = seed;
  m.src = MakePool(*from.daemon->client, Layout(), false, "src");
  m.dst = MakePool(*to.daemon->client, Layout(), true, "dst-from-" + from.name);
  REQUIRE(to.daemon->Export(m.dst.id(), from.name).ok());
  const auto src_blocks = ScatteredBlocks(kBlocks, kMoved, seed);
  m.dst_blocks = ScatteredBlocks(kBlocks, kMoved, seed + 1);
  FillPool(m.src, seed + 2, src_blocks, kMoved * kTpb);
  auto spec = client::MakeBlockTransfer(m.src.id(), src_blocks, m.dst.id(), m.dst_blocks);
  spec.mutable_dst()->set_node_id(to.name);
  spec.mutable_dst()->set_grant(to.daemon->WriteGrant(m.dst.id()));
  spec.set_timeout_ms(deadline_ms);
  spec.set_layerwise(layerwise);
  auto submitted = from.daemon->client->Submit(spec);
  INFO(submitted.status().ToString() << "\n" << c.Logs());
  REQUIRE(submitted.ok());
  m.id = submitted->transfer_id();
  if (layerwise) REQUIRE(from.daemon->client->MarkReady(m.id, 0, 1).ok());
  return m;
}

bool Verified(const Moved& m) {
  return VerifyPool(m.dst, Expectation{m.seed + 2, m.dst_blocks, kMoved * kTpb, 0, 0, kLayers, 0, 0,
                                       4}) == "";
}

// The stalled transfer ends, either way, well before its deadline; byte for byte if it succeeded.
void AwaitStalled(Cluster& c, ClusterNode& from, const Moved& m, const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  auto ended = from.daemon->client->Wait(m.id, absl::Milliseconds(kStalledDeadlineMs));
  REQUIRE(ended.ok());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(what << ": " << ended->DebugString() << "ended " << seconds << " s after SIGCONT\n"
            << c.Logs());
  REQUIRE((ended->state() == v1::TRANSFER_STATE_SUCCEEDED ||
           ended->state() == v1::TRANSFER_STATE_FAILED));
  CHECK(seconds < 15.0);
  if (ended->state() == v1::TRANSFER_STATE_SUCCEEDED) CHECK(Verified(m));
  WARN(what << ": " << v1::TransferState_Name(ended->state()) << " " << seconds
            << " s after SIGCONT (" << ended->error_message() << ")");
}

// One transfer each way at once, each under kRoundDeadlineMs: both SUCCEED byte for byte.
void Round(Cluster& c, ClusterNode& a, ClusterNode& b, uint32_t seed, int round) {
  INFO("round " << round << " after the stall");
  Moved ab = Submit(c, a, b, seed, false, kRoundDeadlineMs);
  Moved ba = Submit(c, b, a, seed + 5, false, kRoundDeadlineMs);
  for (auto [m, from, what] :
       {std::make_tuple(&ab, &a, "a -> b"), std::make_tuple(&ba, &b, "b -> a")}) {
    auto ended = from->daemon->client->Wait(m->id, absl::Milliseconds(kRoundDeadlineMs + 5000));
    REQUIRE(ended.ok());
    INFO(what << ": " << ended->DebugString() << "\n" << c.Logs());
    REQUIRE(ended->state() == v1::TRANSFER_STATE_SUCCEEDED);
    CHECK(Verified(*m));
  }
}

TEST_CASE(
    "a daemon stalled 4 s with tiles in flight both ways: the pair works again "
    "afterwards, byte for byte") {
  const std::string why = CannotRunCluster();
  if (!why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  const std::string no_etcd = MissingEtcd();
  INFO(no_etcd);
  REQUIRE(no_etcd.empty());
  Cluster c;
  INFO(c.error());
  REQUIRE(c.error().empty());
  REQUIRE(c.StartEtcd());
  ClusterNode* a = c.AddNode("a");
  ClusterNode* b = c.AddNode("b");
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  const auto all_up = [&](absl::Duration timeout) {
    const std::vector<ClusterNode*> nodes = {a, b};
    const auto when = c.WaitAll(
        nodes,
        [&](const ClusterNode& me, const v1::ListPeersResponse& peers) {
          return Cluster::StateOf(peers, me.name == "a" ? "b" : "a") == v1::PEER_STATE_UP;
        },
        timeout);
    for (absl::Time t : when) {
      if (t == absl::InfinitePast()) return false;
    }
    return true;
  };
  {
    INFO(c.Logs());
    REQUIRE(all_up(absl::Seconds(10)));
  }
  Round(c, *a, *b, 100, -1);  // the pair works before the stall

  // b -> a released whole before the stop (a stops with b's tiles arriving and their credits owed
  // to b); a -> b released whole too (a stops with its own tiles out).
  Moved to_b = Submit(c, *a, *b, 1, true, kStalledDeadlineMs);
  Moved to_a = Submit(c, *b, *a, 11, true, kStalledDeadlineMs);
  REQUIRE(b->daemon->client->MarkReady(to_a.id, 1, kLayers - 1).ok());
  REQUIRE(a->daemon->client->MarkReady(to_b.id, 1, kLayers - 1).ok());
  const pid_t a_pid = a->daemon->pid;
  REQUIRE(kill(a_pid, SIGSTOP) == 0);
  std::this_thread::sleep_for(kStall);
  REQUIRE(kill(a_pid, SIGCONT) == 0);
  AwaitStalled(c, *a, to_b, "a -> b (from the stalled daemon)");
  AwaitStalled(c, *b, to_a, "b -> a (into the stalled daemon)");

  {
    INFO(c.Logs());
    REQUIRE(all_up(absl::Seconds(15)));
  }
  for (int r = 0; r < kRounds; ++r) Round(c, *a, *b, 200 + 20 * r, r);
  CHECK(waitpid(a_pid, nullptr, WNOHANG) == 0);
  CHECK(waitpid(b->daemon->pid, nullptr, WNOHANG) == 0);
}

}  // namespace
}  // namespace kvrail::testing

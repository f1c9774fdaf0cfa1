// Peer faults against two real kvraild daemons peered over tcp;ofi_rxm on two loopback addresses
// (peers killed mid-transfer; --insecure-peers, no namespaces, no root):
//
// - the RECEIVING daemon is SIGKILLed while a layer-wise transfer into it waits for its next
//   layer: the sender's transfer fails promptly (UNAVAILABLE naming the peer, well within
//   liveness_timeout + a margin, long before its deadline) although no tile of it is in flight,
//   and the sender keeps serving (ListPeers says down; a new local transfer is byte for byte).
// - the SENDING daemon is SIGKILLed after half the layers arrived: the receiver's own record of
//   the inbound transfer fails as promptly (UNAVAILABLE naming the sender), its destination holds
//   exactly the layers that arrived and poison everywhere else (other blocks, later layers, a
//   bystander pool), and the receiver keeps serving.
//
// The layer-wise transfer with readiness withheld makes "mid-transfer" deterministic: the kill
// happens after the first half is known to have moved and before anything else may move.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/kv_fixture.h"
#include "tests/netns/netns.h"

namespace kvrail::testing {
namespace {

// NsDaemon's fabric config: liveness_timeout_ms 2000, heartbeat_interval_ms 200.
constexpr double kLivenessSeconds = 2.0;
// What "promptly" allows beyond the liveness timeout (scheduling on a loaded CI machine).
constexpr double kMarginSeconds = 3.0;
// The transfers' deadline: the failures must come long before it.
constexpr uint32_t kDeadlineMs = 60000;

constexpr uint32_t kLayers = 8, kBlocks = 64, kMoved = 48, kTpb = 16;

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

// The daemon process is still running (not exited, not killed by a signal).
bool Alive(const NsDaemon& node) {
  return node.pid > 0 && waitpid(node.pid, nullptr, WNOHANG) == 0;
}

// Daemons "fault-a" and "fault-b" (names long enough that "names the peer" is a real check),
// peered with --insecure-peers on two loopback addresses, each with one fabric endpoint; both
// up before the test goes on.
struct PeerPair {
  NsDaemon a, b;
  const std::string ip_a = LoopbackIp(), ip_b = LoopbackIp();
  bool ok = false;
  PeerPair() {
    NsDaemonOptions options;
    options.nics = 1;
    ok = a.Start("", "fault-a", ip_a, "fault-b", ip_b, options) &&
         b.Start("", "fault-b", ip_b, "fault-a", ip_a, options) &&
         PeerIs(a, "fault-b", v1::PEER_STATE_UP, absl::Seconds(10)) &&
         PeerIs(b, "fault-a", v1::PEER_STATE_UP, absl::Seconds(10));
    if (!ok) UNSCOPED_INFO("a log:\n" << a.Log() << "\nb log:\n" << b.Log());
  }
};

v1::PagedKvLayout Layout() {
  return MakeLayout(kLayers, 2, kBlocks, kTpb, 8, 128, v1::DTYPE_BF16,
                    v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

// Polls `get` until its layers_done reaches `layers` (REQUIREd within 20 s).
template <typename Get>
void AwaitLayers(Get get, uint32_t layers) {
  const absl::Time until = absl::Now() + absl::Seconds(20);
  std::optional<v1::TransferStatus> last;
  while (absl::Now() < until) {
    last = get();
    if (last && last->layers_done() >= layers) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  INFO((last ? last->DebugString() : std::string("no record")));
  FAIL("the first layers did not arrive within 20 s");
}

// The receiving node's record of its (only) inbound transfer, nullopt when there is none yet.
std::optional<v1::TransferStatus> InboundRecord(NsDaemon& node) {
  auto list = node.client->ListTransfers();
  if (!list.ok()) return std::nullopt;
  for (const auto& t : list->transfers()) {
    if (t.engine() == "fabric-receiver") return t;
  }
  return std::nullopt;
}

// `node` still serves: answers, and a local transfer between two of its pools (fresh ones) is
// byte for byte with nothing outside the destination blocks written.
void StillServes(NsDaemon& node, const std::string& what) {
  INFO(what << " log:\n" << node.Log());
  REQUIRE(Alive(node));
  REQUIRE(node.client->GetStats().ok());
  Pool src = MakePool(*node.client, Layout(), false, "after-src");
  Pool dst = MakePool(*node.client, Layout(), true, "after-dst");
  const auto src_blocks = ScatteredBlocks(kBlocks, kMoved, 21);
  const auto dst_blocks = ScatteredBlocks(kBlocks, kMoved, 22);
  FillPool(src, 23, src_blocks, kMoved * kTpb);
  const v1::TransferStatus done =
      RunToEnd(*node.client, client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks));
  INFO(done.DebugString());
  REQUIRE(done.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, Expectation{23, dst_blocks, kMoved * kTpb, 0, 0, kLayers, 0, 0, 8}) == "");
}

// Submits the layer-wise transfer a -> b of `kMoved` scattered blocks and releases its first
// half of the layers; returns the sender's transfer id.
uint64_t SubmitHalfReleased(PeerPair& p, const Pool& src, const Pool& dst,
                            const std::vector<uint32_t>& src_blocks,
                            const std::vector<uint32_t>& dst_blocks) {
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  spec.mutable_dst()->set_node_id("fault-b");
  spec.mutable_dst()->set_grant(p.b.WriteGrant(dst.id()));  // the owner's, beside its export
  spec.set_timeout_ms(kDeadlineMs);
  spec.set_layerwise(true);
  auto submitted = p.a.client->Submit(spec);
  INFO(submitted.status().ToString() << "\na log:\n" << p.a.Log() << "\nb log:\n" << p.b.Log());
  REQUIRE(submitted.ok());
  REQUIRE(p.a.client->MarkReady(submitted->transfer_id(), 0, kLayers / 2).ok());
  return submitted->transfer_id();
}

// The transfer's end as Wait returns it. These tests are about the peer's death, not the
// waiting client's transport: a Wait that fails (seen once on CI, never here in 93 runs) is
// reported with its status and the end is read with Get instead, every 10 ms until the deadline.
absl::StatusOr<v1::TransferStatus> AwaitEnd(client::Client& c, uint64_t id) {
  const absl::Time until = absl::Now() + absl::Milliseconds(kDeadlineMs);
  absl::StatusOr<v1::TransferStatus> ended = c.Wait(id, absl::Milliseconds(kDeadlineMs));
  if (ended.ok()) return ended;
  WARN("Wait(" << id << ") failed: " << ended.status() << "; reading the end with Get");
  while (absl::Now() < until) {
    ended = c.Get(id);
    if (ended.ok() && ended->state() >= v1::TRANSFER_STATE_SUCCEEDED) return ended;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ended;
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The receiving daemon b is SIGKILLed after the first half of the layers arrived. `in_flight`:
// b is first stopped (SIGSTOP), the rest of the layers is released into the stalled link and
// the kill comes 300 ms later, so tiles are queued and in flight when b dies; otherwise the
// rest is withheld and nothing of the transfer is in flight, so only the peer's death can end
// it before its deadline.
void ReceiverKilled(bool in_flight) {
  PeerPair p;
  REQUIRE(p.ok);
  Pool src = MakePool(*p.a.client, Layout(), false, "src");
  Pool bystander = MakePool(*p.a.client, Layout(), true, "bystander");
  Pool dst = MakePool(*p.b.client, Layout(), true, "dst");
  REQUIRE(p.b.Export(dst.id(), "fault-a").ok());
  const auto src_blocks = ScatteredBlocks(kBlocks, kMoved, 1);
  const auto dst_blocks = ScatteredBlocks(kBlocks, kMoved, 2);
  FillPool(src, 3, src_blocks, kMoved * kTpb);
  const uint64_t id = SubmitHalfReleased(p, src, dst, src_blocks, dst_blocks);
  AwaitLayers([&] { return InboundRecord(p.b); }, kLayers / 2);
  const pid_t b_pid = p.b.pid;
  if (in_flight) {
    REQUIRE(kill(b_pid, SIGSTOP) == 0);
    REQUIRE(p.a.client->MarkReady(id, kLayers / 2, kLayers / 2).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto running = p.a.client->Get(id);
    REQUIRE(running.ok());
    INFO(running->DebugString());
    REQUIRE(running->state() != v1::TRANSFER_STATE_FAILED);
    REQUIRE(running->state() != v1::TRANSFER_STATE_SUCCEEDED);
    REQUIRE(running->bytes_done() < running->bytes_total());
  }

  const auto t0 = std::chrono::steady_clock::now();
  p.b.Kill(SIGKILL);
  auto ended = AwaitEnd(*p.a.client, id);
  const double seconds = SecondsSince(t0);
  INFO("b (pid " << b_pid << ") killed; a's transfer ended after " << seconds << " s:\n"
                 << (ended.ok() ? ended->DebugString() : ended.status().ToString()) << "\na log:\n"
                 << p.a.Log());
  REQUIRE(ended.ok());
  CHECK(ended->state() == v1::TRANSFER_STATE_FAILED);
  CHECK(ended->error_code() == static_cast<int>(absl::StatusCode::kUnavailable));
  CHECK(ended->error_message().find("'fault-b'") != std::string::npos);
  CHECK(seconds < kLivenessSeconds + kMarginSeconds);
  CHECK(ended->layers_done() <= kLayers / 2);
  CHECK(ended->bytes_done() < ended->bytes_total());
  WARN("sender's transfer failed " << seconds << " s after the receiving peer was SIGKILLed "
                                   << (in_flight ? "(tiles in flight)" : "(readiness withheld)"));
  // a knows b is down, wrote nothing into its own pools, and keeps serving.
  CHECK(PeerIs(p.a, "fault-b", v1::PEER_STATE_DOWN, absl::Seconds(5)));
  CHECK(CountWritten(bystander) == 0);
  StillServes(p.a, "a");
}

TEST_CASE(
    "the receiving peer SIGKILLed while the transfer waits for its next layer: the "
    "sender's transfer fails promptly, UNAVAILABLE naming it; the sender keeps serving") {
  ReceiverKilled(false);
}

TEST_CASE(
    "the receiving peer SIGKILLed with tiles in flight: the sender's transfer fails "
    "promptly, UNAVAILABLE naming it; the sender keeps serving") {
  ReceiverKilled(true);
}

TEST_CASE(
    "the sending peer SIGKILLed mid-transfer: the receiver's inbound record fails "
    "promptly, UNAVAILABLE naming it; only the layers that arrived are written; the "
    "receiver keeps serving") {
  PeerPair p;
  REQUIRE(p.ok);
  Pool src = MakePool(*p.a.client, Layout(), false, "src");
  Pool dst = MakePool(*p.b.client, Layout(), true, "dst");
  Pool bystander = MakePool(*p.b.client, Layout(), true, "bystander");
  REQUIRE(p.b.Export(dst.id(), "fault-a").ok());
  REQUIRE(p.b.Export(bystander.id(), "fault-a").ok());  // exported, but not this transfer's
  const auto src_blocks = ScatteredBlocks(kBlocks, kMoved, 4);
  const auto dst_blocks = ScatteredBlocks(kBlocks, kMoved, 5);
  FillPool(src, 6, src_blocks, kMoved * kTpb);
  SubmitHalfReleased(p, src, dst, src_blocks, dst_blocks);
  AwaitLayers([&] { return InboundRecord(p.b); }, kLayers / 2);
  const std::optional<v1::TransferStatus> inbound = InboundRecord(p.b);
  REQUIRE(inbound.has_value());
  REQUIRE(inbound->state() != v1::TRANSFER_STATE_FAILED);

  const pid_t a_pid = p.a.pid;
  const auto t0 = std::chrono::steady_clock::now();
  p.a.Kill(SIGKILL);
  auto ended = AwaitEnd(*p.b.client, inbound->transfer_id());
  const double seconds = SecondsSince(t0);
  INFO("a (pid " << a_pid << ") killed; b's inbound record ended after " << seconds << " s:\n"
                 << (ended.ok() ? ended->DebugString() : ended.status().ToString()) << "\nb log:\n"
                 << p.b.Log());
  REQUIRE(ended.ok());
  CHECK(ended->state() == v1::TRANSFER_STATE_FAILED);
  CHECK(ended->error_code() == static_cast<int>(absl::StatusCode::kUnavailable));
  CHECK(ended->error_message().find("'fault-a'") != std::string::npos);
  CHECK(seconds < kLivenessSeconds + kMarginSeconds);
  CHECK(ended->layers_done() == kLayers / 2);
  CHECK(ended->bytes_done() < ended->bytes_total());
  WARN("receiver's inbound record failed " << seconds << " s after the sending peer was SIGKILLed");
  // Exactly the released layers of the destination blocks hold the source's bytes; every other
  // byte (other blocks; layers 4..7 of these blocks) is still poison, and so is the bystander.
  CHECK(VerifyPool(dst, Expectation{6, dst_blocks, kMoved * kTpb, 0, 0, kLayers / 2, 0, 0, 8}) ==
        "");
  CHECK(CountWritten(bystander) == 0);
  CHECK(PeerIs(p.b, "fault-a", v1::PEER_STATE_DOWN, absl::Seconds(5)));
  StillServes(p.b, "b");
}

}  // namespace
}  // namespace kvrail::testing

// Lane failover between two kvraild daemons in two network namespaces joined
// by FOUR veth pairs, one fabric lane each (fabric.nics = the four addresses of each side, lane i
// over link i; the Peer service and heartbeats over link 0), peered over mTLS (test CA):
//
// - one link (link 2) is cut with `ip link set down` in the middle of a layer-wise transfer
//   (after its first layers moved, before the rest is released): the tiles written on lane 2 get
//   no credit, lane 2 is failed once the other lanes return credits meanwhile
//   (fabric.lane_timeout_ms), its unacknowledged tiles are re-sent on lanes 0, 1 and 3 and the
//   transfer SUCCEEDS byte for byte with nothing written outside its blocks. The link comes back
//   before the last layers (the late originals may land after their re-sends: the receiver keeps
//   one copy and counts it once). The sender's record names the failover and the time from
//   detection to the first re-sent tile on its new lane (printed; target < 50 ms, asserted under a
//   generous bound); the receiver's record SUCCEEDS too; the fabric gauges count the failover.
// - all four links are cut mid-transfer: the transfer fails UNAVAILABLE naming the peer, well
//   within its deadline.
//
// Needs root (CI runs as root): without the rights to create namespaces every case SKIPs with a
// message. Names are unique per run (pid) and the namespaces are deleted even when a case fails.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/kv_fixture.h"
#include "tests/netns/netns.h"

namespace kvrail::testing {
namespace {

constexpr int kLinks = 4;
constexpr uint32_t kLaneTimeoutMs = 200, kCooldownMs = 600;
// NsDaemon's fabric config: liveness_timeout_ms 2000.
constexpr double kLivenessSeconds = 2.0;
constexpr double kMarginSeconds = 3.0;
constexpr uint32_t kDeadlineMs = 60000;
// Detection to the first re-sent tile: the target is 50 ms; the assertion allows a loaded CI
// machine (2 cores shared with the build) ten times that.
constexpr double kResendBoundMs = 500;

constexpr uint32_t kLayers = 8, kBlocks = 64, kMoved = 48, kTpb = 16;

#define SKIP_WITHOUT_NETNS()                               \
  do {                                                     \
    static const std::string why = CannotMakeNamespaces(); \
    if (!why.empty()) {                                    \
      WARN("SKIPPED (fabric_failover_test): " << why);     \
      return;                                              \
    }                                                      \
  } while (0)

v1::PagedKvLayout Layout() {
  return MakeLayout(kLayers, 2, kBlocks, kTpb, 8, 128, v1::DTYPE_BF16,
                    v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

// Daemons "fo-a" and "fo-b" in the namespaces of a NetnsPair (link 0) plus three more veth pairs
// (links 1-3, subnets 10.S.k.0/24 beside the pair's 10.S.0.0/24): four lanes, lane i over link i.
struct FourLinks {
  NetnsPair net;
  TestCa ca;
  NsDaemon a, b;
  std::vector<std::string> veth_a, ips_a, ips_b;
  bool ok = false;
  FourLinks() {
    if (!net.ok) return;
    if (!ca.status().ok()) {
      UNSCOPED_INFO("test CA: " << ca.status());
      return;
    }
    veth_a.push_back(net.veth_a);
    ips_a.push_back(net.ip_a);
    ips_b.push_back(net.ip_b);
    const std::string prefix = net.ip_a.substr(0, net.ip_a.find('.', 3) + 1);  // "10.S."
    for (int k = 1; k < kLinks; ++k) {
      const std::string va = absl::StrCat(net.veth_a, "l", k),
                        vb = absl::StrCat(net.veth_b, "l", k);
      const std::string ia = absl::StrCat(prefix, k, ".1"), ib = absl::StrCat(prefix, k, ".2");
      const bool made = Sh("ip link add " + va + " type veth peer name " + vb) == 0 &&
                        Sh("ip link set " + va + " netns " + net.ns_a) == 0 &&
                        Sh("ip link set " + vb + " netns " + net.ns_b) == 0 &&
                        Sh(NetnsPair::In(net.ns_a, "ip addr add " + ia + "/24 dev " + va)) == 0 &&
                        Sh(NetnsPair::In(net.ns_b, "ip addr add " + ib + "/24 dev " + vb)) == 0 &&
                        Sh(NetnsPair::In(net.ns_a, "ip link set " + va + " up")) == 0 &&
                        Sh(NetnsPair::In(net.ns_b, "ip link set " + vb + " up")) == 0;
      if (!made) {
        UNSCOPED_INFO("could not make veth pair " << va << "/" << vb);
        Sh("ip link del " + va);
        return;
      }
      veth_a.push_back(va);
      ips_a.push_back(ia);
      ips_b.push_back(ib);
    }
    NsDaemonOptions options;
    options.ca = &ca;
    options.fabric_extra =
        absl::StrCat("lane_timeout_ms: ", kLaneTimeoutMs, "\n  lane_cooldown_ms: ", kCooldownMs);
    options.nic_ips = ips_a;
    NsDaemonOptions options_b = options;
    options_b.nic_ips = ips_b;
    ok = a.Start(net.ns_a, "fo-a", net.ip_a, "fo-b", net.ip_b, options) &&
         b.Start(net.ns_b, "fo-b", net.ip_b, "fo-a", net.ip_a, options_b);
    if (!ok) UNSCOPED_INFO("a log:\n" << a.Log() << "\nb log:\n" << b.Log());
  }
  // `ip link set VETH down|up` on a's end of link k (a veth's peer loses its carrier with it).
  bool SetLink(int k, bool up) {
    return Sh(NetnsPair::In(net.ns_a, "ip link set " + veth_a[k] + (up ? " up" : " down"))) == 0;
  }
};

std::optional<v1::TransferStatus> InboundRecord(NsDaemon& node) {
  auto list = node.client->ListTransfers();
  if (!list.ok()) return std::nullopt;
  for (const auto& t : list->transfers()) {
    if (t.engine() == "fabric-receiver") return t;
  }
  return std::nullopt;
}

// Waits until the sender's record has `layers` layers done (REQUIREd within 20 s).
void AwaitLayers(NsDaemon& node, NsDaemon& peer, uint64_t id, uint32_t layers) {
  const absl::Time until = absl::Now() + absl::Seconds(20);
  std::optional<v1::TransferStatus> last;
  while (absl::Now() < until) {
    auto s = node.client->Get(id);
    if (s.ok()) {
      last = *s;
      if (s->layers_done() >= layers) return;
      REQUIRE(s->state() != v1::TRANSFER_STATE_FAILED);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  INFO((last ? last->DebugString() : std::string("no record")) << "\nsender log:\n"
                                                               << node.Log() << "\nreceiver log:\n"
                                                               << peer.Log());
  FAIL("layers did not move within 20 s");
}

// Submits the layer-wise transfer fo-a -> fo-b and releases its first `released` layers.
uint64_t Submit(FourLinks& f, const Pool& src, const Pool& dst,
                const std::vector<uint32_t>& src_blocks, const std::vector<uint32_t>& dst_blocks,
                uint32_t released) {
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  spec.mutable_dst()->set_node_id("fo-b");
  spec.mutable_dst()->set_grant(f.b.WriteGrant(dst.id()));  // the owner's, beside its export
  spec.set_timeout_ms(kDeadlineMs);
  spec.set_layerwise(true);
  auto submitted = f.a.client->Submit(spec);
  INFO(submitted.status().ToString() << "\na log:\n" << f.a.Log() << "\nb log:\n" << f.b.Log());
  REQUIRE(submitted.ok());
  REQUIRE(f.a.client->MarkReady(submitted->transfer_id(), 0, released).ok());
  return submitted->transfer_id();
}

TEST_CASE(
    "one of four links cut mid-transfer: its tiles are re-sent on the other lanes and the "
    "transfer succeeds byte for byte") {
  SKIP_WITHOUT_NETNS();
  FourLinks f;
  REQUIRE(f.ok);
  Pool src = MakePool(*f.a.client, Layout(), false, "src");
  Pool dst = MakePool(*f.b.client, Layout(), true, "dst");
  Pool bystander = MakePool(*f.b.client, Layout(), true, "bystander");
  REQUIRE(f.b.Export(dst.id(), "fo-a").ok());
  REQUIRE(f.b.Export(bystander.id(), "fo-a").ok());
  const auto src_blocks = ScatteredBlocks(kBlocks, kMoved, 31);
  const auto dst_blocks = ScatteredBlocks(kBlocks, kMoved, 32);
  FillPool(src, 33, src_blocks, kMoved * kTpb);

  const uint64_t id = Submit(f, src, dst, src_blocks, dst_blocks, 3);
  AwaitLayers(f.a, f.b, id, 1);  // under way on all four lanes
  {
    // The lane choice says it goes by load (a host source: all four lanes, each
    // tile to the least loaded); a later failover note replaces it.
    auto running = f.a.client->Get(id);
    REQUIRE(running.ok());
    INFO(running->path_reason());
    CHECK(running->path_reason().find("lanes: host source: all 4 lanes; by load, tiles out per "
                                      "lane now ") != std::string::npos);
    CHECK(running->path_reason().find(": each tile to the least loaded") != std::string::npos);
  }
  REQUIRE(f.SetLink(2, false));  // cut link 2 mid-transfer
  const auto cut = std::chrono::steady_clock::now();
  REQUIRE(f.a.client->MarkReady(id, 3, 3).ok());  // layers 3-5 go out with lane 2 cut
  AwaitLayers(f.a, f.b, id, 6);
  const double recovered_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  // The link comes back: tiles queued on its connection may now land after their re-sends.
  REQUIRE(f.SetLink(2, true));
  std::this_thread::sleep_for(std::chrono::milliseconds(kCooldownMs + 200));
  REQUIRE(f.a.client->MarkReady(id, 6, kLayers - 6).ok());
  auto ended = f.a.client->Wait(id, absl::Milliseconds(kDeadlineMs));
  INFO(ended.status());
  REQUIRE(ended.ok());
  INFO(ended->DebugString() << "\na log:\n" << f.a.Log() << "\nb log:\n" << f.b.Log());
  REQUIRE(ended->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(ended->nics_size() == kLinks);
  CHECK(VerifyPool(dst, Expectation{33, dst_blocks, kMoved * kTpb, 0, 0, kLayers, 0, 0, 8}) == "");
  CHECK(CountWritten(bystander) == 0);

  // The sender's record: "lane failover: nic2@... to 'fo-b' failed (...); first re-sent tile on
  // nicK@... X ms after detection".
  const std::string& reason = ended->path_reason();
  CHECK(reason.find("lane failover: nic2@") != std::string::npos);
  CHECK(reason.find("'fo-b'") != std::string::npos);
  std::smatch m;
  REQUIRE(std::regex_search(reason, m,
                            std::regex("first re-sent tile on (nic[013])@\\S+ "
                                       "([0-9.]+) ms after detection")));
  const double resend_ms = std::stod(m[2].str());
  WARN("fabric_failover_test: link 2 of 4 cut mid-transfer; lane_timeout_ms "
       << kLaneTimeoutMs << "; detection -> first re-sent tile on " << m[1].str() << ": "
       << resend_ms << " ms (target < 50 ms); the cut -> layers 3-5 all landed: " << recovered_s
       << " s");
  CHECK(resend_ms < kResendBoundMs);
  CHECK(FabricGauge(f.a, "fabric_lane_failovers_total") >= 1);
  CHECK(FabricGauge(f.a, "fabric_tiles_resent_total") >= 1);

  // The receiver's record of the same transfer succeeded too (each tile counted once).
  const std::optional<v1::TransferStatus> inbound = InboundRecord(f.b);
  REQUIRE(inbound.has_value());
  INFO(inbound->DebugString());
  CHECK(inbound->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(inbound->tiles_done() == inbound->tiles_total());
  CHECK(inbound->bytes_done() == inbound->bytes_total());
  // Whether the late originals landed after their re-sends (then the receiver's record says so)
  // depends on tcp's retransmission once the link is back: shown, not asserted.
  WARN("fabric_failover_test: receiver's record: " << inbound->path_reason());
}

TEST_CASE(
    "all four links cut mid-transfer: the transfer fails UNAVAILABLE naming the peer within "
    "the deadline") {
  SKIP_WITHOUT_NETNS();
  FourLinks f;
  REQUIRE(f.ok);
  Pool src = MakePool(*f.a.client, Layout(), false, "src");
  Pool dst = MakePool(*f.b.client, Layout(), true, "dst");
  REQUIRE(f.b.Export(dst.id(), "fo-a").ok());
  const auto src_blocks = ScatteredBlocks(kBlocks, kMoved, 41);
  const auto dst_blocks = ScatteredBlocks(kBlocks, kMoved, 42);
  FillPool(src, 43, src_blocks, kMoved * kTpb);
  const uint64_t id = Submit(f, src, dst, src_blocks, dst_blocks, 3);
  AwaitLayers(f.a, f.b, id, 1);
  for (int k = 0; k < kLinks; ++k) REQUIRE(f.SetLink(k, false));
  const auto cut = std::chrono::steady_clock::now();
  REQUIRE(f.a.client->MarkReady(id, 3, kLayers - 3).ok());
  auto ended = f.a.client->Wait(id, absl::Milliseconds(kDeadlineMs));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  INFO(ended.status());
  REQUIRE(ended.ok());
  INFO("ended " << seconds << " s after the cut:\n"
                << ended->DebugString() << "\na log:\n"
                << f.a.Log());
  CHECK(ended->state() == v1::TRANSFER_STATE_FAILED);
  CHECK(ended->error_code() == static_cast<int>(absl::StatusCode::kUnavailable));
  CHECK(ended->error_message().find("'fo-b'") != std::string::npos);
  CHECK(seconds < kLivenessSeconds + kMarginSeconds);
  WARN("fabric_failover_test: all 4 links cut: UNAVAILABLE after "
       << seconds << " s: " << ended->error_message());
}

}  // namespace
}  // namespace kvrail::testing

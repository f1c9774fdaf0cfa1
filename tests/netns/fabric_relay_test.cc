// The hierarchical path's relay hop (daemon/fabric/relay.h) between two real
// kvraild daemons peered over tcp;ofi_rxm on two loopback addresses (--insecure-peers, no
// namespaces, no root), with the host twin selected (KVRAIL_FABRIC_RELAY=host in both daemons'
// environment): every tile is packed by the sender into a host relay slot and copied from there
// into the lane's send slot, and on the receiver copied from the receive slot into a relay slot
// and scattered from it.
//
// - a paged transfer A -> B with a layout conversion (NHD, 16-token blocks, 8 heads -> HND,
//   32-token blocks, 4 heads of 8 with a head offset) SUCCEEDS byte for byte, nothing written
//   outside its elements (poison elsewhere, a bystander pool untouched); both records name the
//   relay in their path reasons; the relay gauges count exactly the transfer's tiles on each side.
// - KVRAIL_FABRIC_RELAY=gpu:0 with host regions (any machine): no relay ("host region" in the
//   path reason), the direct path moves the bytes, the gauges stay 0.
// The GPU relay (S -> R over NVLink -> NIC) is //tests/gpu:relay_gpu_test and the two-GPU run in
// docs/benchmarks.md.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "client/kvrail_client.h"
#include "tests/integration/kv_fixture.h"
#include "tests/netns/netns.h"
#include "tests/tls/peer_calls.h"

namespace kvrail::testing {
namespace {

constexpr uint32_t kLayers = 4, kBlocks = 32, kMoved = 24;

// "relay-a" and "relay-b" on two loopback addresses, one fabric endpoint each, started with
// KVRAIL_FABRIC_RELAY=`relay` in their environment; both up before the test goes on.
struct RelayPair {
  NsDaemon a, b;
  const std::string ip_a = LoopbackIp(), ip_b = LoopbackIp();
  bool ok = false;
  explicit RelayPair(const char* relay) {
    REQUIRE(setenv("KVRAIL_FABRIC_RELAY", relay, 1) == 0);
    NsDaemonOptions options;
    options.nics = 1;
    options.tile_bytes = 65536;  // several tiles per layer
    ok = a.Start("", "relay-a", ip_a, "relay-b", ip_b, options) &&
         b.Start("", "relay-b", ip_b, "relay-a", ip_a, options) &&
         PeerUp(a, "relay-b", absl::Seconds(10)) && PeerUp(b, "relay-a", absl::Seconds(10));
    unsetenv("KVRAIL_FABRIC_RELAY");
    if (!ok) UNSCOPED_INFO("a log:\n" << a.Log() << "\nb log:\n" << b.Log());
  }
};

std::optional<v1::TransferStatus> InboundRecord(NsDaemon& node) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  do {
    auto list = node.client->ListTransfers();
    if (list.ok()) {
      for (const auto& t : list->transfers()) {
        if (t.engine() == "fabric-receiver" && t.state() == v1::TRANSFER_STATE_SUCCEEDED) return t;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (absl::Now() < until);
  return std::nullopt;
}

struct Moved {
  v1::TransferStatus sender;
  v1::TransferStatus receiver;
};

// A -> B: NHD/16-token/8 heads -> HND/32-token/4 heads (heads 2-5 of the source into 0-3),
// verified byte for byte with poison elsewhere and a bystander pool untouched.
Moved MoveConverted(RelayPair& p) {
  const v1::PagedKvLayout src_layout = MakeLayout(kLayers, 2, kBlocks, 16, 8, 128, v1::DTYPE_BF16,
                                                  v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const v1::PagedKvLayout dst_layout = MakeLayout(
      kLayers, 2, kBlocks / 2, 32, 4, 128, v1::DTYPE_BF16, v1::LAYOUT_ORDER_BLOCK_LAYER_PART_HND);
  Pool src = MakePool(*p.a.client, src_layout, false, "src");
  Pool dst = MakePool(*p.b.client, dst_layout, true, "dst");
  Pool bystander = MakePool(*p.b.client, dst_layout, true, "bystander");
  REQUIRE(p.b.Export(dst.id(), "relay-a").ok());
  REQUIRE(p.b.Export(bystander.id(), "relay-a").ok());
  const auto src_blocks = ScatteredBlocks(kBlocks, kMoved, 181);
  const auto dst_blocks = ScatteredBlocks(kBlocks / 2, kMoved / 2, 182);
  const uint64_t tokens = uint64_t{kMoved} * 16;
  FillPool(src, 183, src_blocks, tokens);
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  spec.mutable_dst()->set_node_id("relay-b");
  spec.mutable_dst()->set_grant(p.b.WriteGrant(dst.id()));
  spec.set_timeout_ms(30000);
  spec.set_num_tokens(tokens);
  spec.mutable_src()->set_head_begin(2);
  spec.set_num_heads(4);
  Moved m;
  m.sender = RunToEnd(*p.a.client, spec);
  INFO(m.sender.DebugString() << "\na log:\n" << p.a.Log() << "\nb log:\n" << p.b.Log());
  REQUIRE(m.sender.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(m.sender.path() == v1::PATH_FABRIC);
  CHECK(VerifyPool(dst, Expectation{183, dst_blocks, tokens, 0, 0, kLayers, 2, 0, 4}) == "");
  CHECK(CountWritten(bystander) == 0);
  std::optional<v1::TransferStatus> inbound = InboundRecord(p.b);
  REQUIRE(inbound.has_value());
  m.receiver = *inbound;
  CHECK(m.receiver.tiles_done() == m.sender.tiles_total());
  return m;
}

TEST_CASE(
    "host twin: a two-daemon transfer goes through the relay stage on both sides, byte for "
    "byte") {
  RelayPair p("host");
  REQUIRE(p.ok);
  const Moved m = MoveConverted(p);
  INFO("sender: " << m.sender.path_reason() << "\nreceiver: " << m.receiver.path_reason());
  CHECK(m.sender.path_reason().find("relay: host twin (fabric.relay host, test): packed "
                                    "into a host relay slot") != std::string::npos);
  CHECK(m.receiver.path_reason().find("relay: host twin (fabric.relay host, test): the "
                                      "receive slot copied to a host relay slot") !=
        std::string::npos);
  REQUIRE(m.sender.tiles_total() > 1);
  CHECK(FabricGauge(p.a, "fabric_relay_tiles_sent_total") == m.sender.tiles_total());
  CHECK(FabricGauge(p.b, "fabric_relay_tiles_received_total") == m.sender.tiles_total());
  CHECK(FabricGauge(p.a, "fabric_relay_tiles_received_total") == 0);
  CHECK(FabricGauge(p.b, "fabric_relay_tiles_sent_total") == 0);
}

TEST_CASE("a forced GPU relay leaves host regions on the direct path and says so") {
  RelayPair p("gpu:0");
  REQUIRE(p.ok);
  const Moved m = MoveConverted(p);
  INFO("sender: " << m.sender.path_reason() << "\nreceiver: " << m.receiver.path_reason());
  CHECK(m.sender.path_reason().find("relay: none (host region)") != std::string::npos);
  CHECK(m.receiver.path_reason().find("relay: none (host region)") != std::string::npos);
  CHECK(FabricGauge(p.a, "fabric_relay_tiles_sent_total") == 0);
  CHECK(FabricGauge(p.b, "fabric_relay_tiles_received_total") == 0);
}

}  // namespace
}  // namespace kvrail::testing

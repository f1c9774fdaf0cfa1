// Two kvraild "nodes" in two network namespaces joined by a veth pair, talking over libfabric's
// tcp provider (tcp;ofi_rxm): a paged KV cache moves between host regions on the two nodes,
// verified byte for byte; layout conversion across nodes; a region not exported is refused; a
// netem-delayed and lossy link still completes; a peer killed mid-transfer and a link cut with
// `ip link set down` fail the transfer with UNAVAILABLE within its deadline while the sender keeps
// serving and no destination block outside the transfer is touched.
//
// Needs root (CI runs as root). Without the rights to create namespaces every case SKIPs with a
// message. Names are unique per run (pid) and namespaces are deleted even when a case fails.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/integration/kv_fixture.h"
#include "tests/netns/netns.h"

namespace kvrail::testing {
namespace {

using client::Client;

// Two nodes "a" (sender) and "b" (receiver), each with `nics` endpoints on its veth address,
// peered over mTLS with certificates from one test CA (CN "a" and "b").
struct TwoNodes {
  NetnsPair net;
  TestCa ca;
  NsDaemon a, b;
  bool ok = false;
  explicit TwoNodes(int nics = 2) {
    if (!net.ok) return;
    if (!ca.status().ok()) {
      UNSCOPED_INFO("test CA: " << ca.status());
      return;
    }
    NsDaemonOptions options;
    options.nics = nics;
    options.ca = &ca;
    ok = a.Start(net.ns_a, "a", net.ip_a, "b", net.ip_b, options) &&
         b.Start(net.ns_b, "b", net.ip_b, "a", net.ip_a, options);
    if (!ok) UNSCOPED_INFO("a log:\n" << a.Log() << "\nb log:\n" << b.Log());
  }
};

#define SKIP_WITHOUT_NETNS()                               \
  do {                                                     \
    static const std::string why = CannotMakeNamespaces(); \
    if (!why.empty()) {                                    \
      WARN("SKIPPED: " << why);                            \
      return;                                              \
    }                                                      \
  } while (0)

// Waits for the final status through WatchTransfer on the submitting daemon.
v1::TransferStatus WatchToEnd(Client& c, uint64_t id) {
  auto status = c.Watch(id, [](const v1::TransferEvent&) { return true; });
  INFO(status.status().ToString());
  REQUIRE(status.ok());
  return *status;
}

// Bytes of `pool` outside the blocks in `touched` that are not poison (must stay 0).
uint64_t WrittenOutside(const Pool& pool, const std::vector<uint32_t>& touched) {
  const std::set<uint32_t> in(touched.begin(), touched.end());
  const auto& l = pool.layout;
  const uint32_t vec = l.head_dim() * 2;
  uint64_t written = 0;
  for (uint32_t block = 0; block < l.num_blocks(); ++block) {
    if (in.count(block)) continue;
    for (uint32_t layer = 0; layer < l.num_layers(); ++layer)
      for (uint32_t part = 0; part < l.num_parts(); ++part)
        for (uint32_t slot = 0; slot < l.tokens_per_block(); ++slot)
          for (uint32_t h = 0; h < l.num_heads(); ++h) {
            const uint8_t* p = pool.buffer->data() + ElementOffset(l, layer, part, block, slot, h);
            for (uint32_t i = 0; i < vec; ++i) written += p[i] != kPoison;
          }
  }
  return written;
}

// The receiving node's own record of an inbound transfer (engine "fabric-receiver"), waiting up
// to `wait` for it to appear; nullopt when there is none.
std::optional<v1::TransferStatus> InboundRecord(NsDaemon& node,
                                                absl::Duration wait = absl::Seconds(2)) {
  const absl::Time until = absl::Now() + wait;
  do {
    auto list = node.client->ListTransfers();
    if (list.ok()) {
      for (const auto& t : list->transfers()) {
        if (t.engine() == "fabric-receiver") return t;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (absl::Now() < until);
  return std::nullopt;
}

TEST_CASE("a paged KV cache moves between two nodes over tcp, striped over 2 NICs, byte for byte") {
  SKIP_WITHOUT_NETNS();
  TwoNodes nodes(2);
  REQUIRE(nodes.ok);
  const auto layout =
      MakeLayout(4, 2, 64, 16, 8, 128, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(*nodes.a.client, layout, false, "prefill");
  Pool dst = MakePool(*nodes.b.client, layout, true, "decode");
  {
    // Exporting lets node a write the pool: another client of node b may not do it.
    auto intruder = client::Client::Connect(nodes.b.socket);
    REQUIRE(intruder.ok());
    auto refused = (*intruder)->ExportRegion(dst.id(), "a");
    CHECK(refused.status().code() == absl::StatusCode::kPermissionDenied);
    CHECK(refused.status().message().find("region_id") != std::string::npos);
  }
  REQUIRE(nodes.b.Export(dst.id(), "a").ok());
  const auto src_blocks = ScatteredBlocks(64, 40, 1);
  const auto dst_blocks = ScatteredBlocks(64, 40, 2);
  FillPool(src, 7, src_blocks, 40 * 16);
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  spec.mutable_dst()->set_node_id("b");
  spec.mutable_dst()->set_grant(nodes.b.WriteGrant(dst.id()));
  spec.set_timeout_ms(60000);
  auto submitted = nodes.a.client->Submit(spec);
  INFO(submitted.status().ToString() << "\n" << nodes.a.Log() << "\n" << nodes.b.Log());
  REQUIRE(submitted.ok());
  const v1::TransferStatus status = WatchToEnd(*nodes.a.client, submitted->transfer_id());
  INFO(status.DebugString() << nodes.a.Log() << nodes.b.Log());
  REQUIRE(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(status.path() == v1::PATH_FABRIC);
  CHECK(status.engine() == "fabric");
  CHECK(status.nics_size() == 2);
  CHECK(status.bytes_done() == uint64_t{4} * 2 * 40 * 16 * 8 * 128 * 2);
  CHECK(status.layers_done() == 4);
  Expectation e{7, dst_blocks, 40 * 16, 0, 0, 4, 0, 0, 8};
  CHECK(VerifyPool(dst, e) == "");
  // Both peers are up in ListPeers.
  auto peers = nodes.a.client->ListPeers();
  REQUIRE(peers.ok());
  REQUIRE(peers->peers_size() == 1);
  CHECK(peers->peers(0).state() == v1::PEER_STATE_UP);
  CHECK(peers->peers(0).last_seen_unix_us() > 0);
  // The receiver logged its side's completion.
  for (int i = 0; i < 40 && nodes.b.Log().find("complete") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(nodes.b.Log().find("complete") != std::string::npos);
  // The receiver has its own record: listed, watched to the end, counted, not cancellable there.
  const std::optional<v1::TransferStatus> inbound = InboundRecord(nodes.b);
  REQUIRE(inbound.has_value());
  const v1::TransferStatus seen_by_b = WatchToEnd(*nodes.b.client, inbound->transfer_id());
  INFO(seen_by_b.DebugString());
  CHECK(seen_by_b.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(seen_by_b.path() == v1::PATH_FABRIC);
  CHECK(seen_by_b.bytes_done() == status.bytes_total());
  CHECK(seen_by_b.layers_done() == 4);
  CHECK(seen_by_b.spec().dst().region_id() == dst.id());
  CHECK(seen_by_b.path_reason().find(absl::StrCat("its transfer ", submitted->transfer_id())) !=
        std::string::npos);
  CHECK(seen_by_b.link() == "fabric:a->b");

  SECTION("a region not exported to the sender is refused and not written") {
    Pool other = MakePool(*nodes.b.client, layout, true, "private");
    auto bad = client::MakeBlockTransfer(src.id(), src_blocks, other.id(), dst_blocks);
    bad.mutable_dst()->set_node_id("b");
    // Even with its owner's write grant: the export is what opens a region to a node.
    bad.mutable_dst()->set_grant(nodes.b.WriteGrant(other.id()));
    auto refused = nodes.a.client->Submit(bad);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == absl::StatusCode::kPermissionDenied);
    CHECK(CountWritten(other) == 0);
  }
}

TEST_CASE(
    "layout conversion across nodes: NHD 16-token blocks to HND 32-token blocks, a head range") {
  SKIP_WITHOUT_NETNS();
  TwoNodes nodes(1);
  REQUIRE(nodes.ok);
  const auto src_layout =
      MakeLayout(6, 2, 40, 16, 8, 64, v1::DTYPE_FP16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const auto dst_layout =
      MakeLayout(8, 2, 30, 32, 4, 64, v1::DTYPE_FP16, v1::LAYOUT_ORDER_BLOCK_LAYER_PART_HND);
  Pool src = MakePool(*nodes.a.client, src_layout, false);
  Pool dst = MakePool(*nodes.b.client, dst_layout, true);
  REQUIRE(nodes.b.Export(dst.id(), "a").ok());
  const uint64_t tokens = 16 * 10 - 5;
  const auto src_blocks = ScatteredBlocks(40, 10, 3);
  const auto dst_blocks = ScatteredBlocks(30, 5, 4);
  FillPool(src, 9, src_blocks, 16 * 10);
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  spec.mutable_dst()->set_node_id("b");
  spec.mutable_dst()->set_grant(nodes.b.WriteGrant(dst.id()));
  spec.set_num_tokens(tokens);
  spec.mutable_src()->set_head_begin(4);
  spec.set_num_heads(4);
  spec.mutable_src()->set_layer_begin(1);
  spec.mutable_dst()->set_layer_begin(2);
  spec.set_num_layers(5);
  auto submitted = nodes.a.client->Submit(spec);
  INFO(submitted.status().ToString());
  REQUIRE(submitted.ok());
  const v1::TransferStatus status = WatchToEnd(*nodes.a.client, submitted->transfer_id());
  INFO(status.DebugString() << nodes.a.Log() << nodes.b.Log());
  REQUIRE(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
  Expectation e{9, dst_blocks, tokens, 1, 2, 5, 4, 0, 4};
  CHECK(VerifyPool(dst, e) == "");
}

TEST_CASE("a netem-delayed, lossy link still completes, verified") {
  SKIP_WITHOUT_NETNS();
  TwoNodes nodes(2);
  REQUIRE(nodes.ok);
  if (Sh(NetnsPair::In(nodes.net.ns_a, "tc qdisc add dev " + nodes.net.veth_a +
                                           " root netem delay 5ms 2ms loss 1%")) != 0) {
    WARN("SKIPPED: `tc qdisc add ... netem` failed (this kernel has no sch_netem)");
    return;
  }
  const auto layout =
      MakeLayout(4, 2, 32, 16, 8, 128, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(*nodes.a.client, layout, false);
  Pool dst = MakePool(*nodes.b.client, layout, true);
  REQUIRE(nodes.b.Export(dst.id(), "a").ok());
  const auto src_blocks = ScatteredBlocks(32, 24, 5);
  const auto dst_blocks = ScatteredBlocks(32, 24, 6);
  FillPool(src, 11, src_blocks, 24 * 16);
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  spec.mutable_dst()->set_node_id("b");
  spec.mutable_dst()->set_grant(nodes.b.WriteGrant(dst.id()));
  spec.set_timeout_ms(60000);
  auto submitted = nodes.a.client->Submit(spec);
  INFO(submitted.status().ToString());
  REQUIRE(submitted.ok());
  const v1::TransferStatus status = WatchToEnd(*nodes.a.client, submitted->transfer_id());
  INFO(status.DebugString() << nodes.a.Log() << nodes.b.Log());
  REQUIRE(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, Expectation{11, dst_blocks, 24 * 16, 0, 0, 4, 0, 0, 8}) == "");
}

// A layer-wise transfer broken by `breaker` after its first half moved.
void BreakMidTransfer(const std::function<void(TwoNodes&)>& breaker) {
  TwoNodes nodes(2);
  REQUIRE(nodes.ok);
  const auto layout =
      MakeLayout(8, 2, 64, 16, 8, 128, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  Pool src = MakePool(*nodes.a.client, layout, false);
  Pool dst = MakePool(*nodes.b.client, layout, true);
  Pool local = MakePool(*nodes.a.client, layout, true, "local");
  REQUIRE(nodes.b.Export(dst.id(), "a").ok());
  const auto src_blocks = ScatteredBlocks(64, 48, 7);
  const auto dst_blocks = ScatteredBlocks(64, 48, 8);
  FillPool(src, 13, src_blocks, 48 * 16);
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  spec.mutable_dst()->set_node_id("b");
  spec.mutable_dst()->set_grant(nodes.b.WriteGrant(dst.id()));
  spec.set_timeout_ms(15000);
  // Layer-wise: half the layers move, then the break, then the rest is released into it.
  spec.set_layerwise(true);
  const auto t0 = std::chrono::steady_clock::now();
  auto submitted = nodes.a.client->Submit(spec);
  REQUIRE(submitted.ok());
  REQUIRE(nodes.a.client->MarkReady(submitted->transfer_id(), 0, 4).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  breaker(nodes);
  REQUIRE(nodes.a.client->MarkReady(submitted->transfer_id(), 4, 4).ok());
  const v1::TransferStatus status = WatchToEnd(*nodes.a.client, submitted->transfer_id());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(status.DebugString() << nodes.a.Log());
  CHECK(status.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(status.error_code() == static_cast<int>(absl::StatusCode::kUnavailable));
  CHECK(seconds < 15.0);  // within the deadline
  CHECK(status.bytes_done() < status.bytes_total());
  if (nodes.b.pid > 0) CHECK(WrittenOutside(dst, dst_blocks) == 0);
  if (nodes.b.pid > 0) {
    // The receiver's record of it ends too (the sender is gone for it): FAILED, UNAVAILABLE.
    std::optional<v1::TransferStatus> inbound = InboundRecord(nodes.b);
    REQUIRE(inbound.has_value());
    auto ended = nodes.b.client->Wait(inbound->transfer_id(), absl::Seconds(15));
    REQUIRE(ended.ok());
    INFO(ended->DebugString() << nodes.b.Log());
    CHECK(ended->state() == v1::TRANSFER_STATE_FAILED);
    CHECK(ended->error_code() == static_cast<int>(absl::StatusCode::kUnavailable));
    CHECK(ended->bytes_done() < ended->bytes_total());
  }
  // The sender keeps serving: a local transfer still succeeds.
  auto again = client::MakeBlockTransfer(src.id(), src_blocks, local.id(), dst_blocks);
  auto ok = nodes.a.client->Submit(again);
  REQUIRE(ok.ok());
  auto done = nodes.a.client->Wait(ok->transfer_id(), absl::Seconds(30));
  REQUIRE(done.ok());
  CHECK(done->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(local, Expectation{13, dst_blocks, 48 * 16, 0, 0, 8, 0, 0, 8}) == "");
}

TEST_CASE("a peer killed mid-transfer: UNAVAILABLE within the deadline, the sender keeps serving") {
  SKIP_WITHOUT_NETNS();
  BreakMidTransfer([](TwoNodes& nodes) { nodes.b.Kill(SIGKILL); });
}

TEST_CASE("a link cut mid-transfer (ip link set down): UNAVAILABLE, nothing outside written") {
  SKIP_WITHOUT_NETNS();
  BreakMidTransfer([](TwoNodes& nodes) {
    REQUIRE(Sh(NetnsPair::In(nodes.net.ns_a, "ip link set " + nodes.net.veth_a + " down")) == 0);
  });
}

}  // namespace
}  // namespace kvrail::testing

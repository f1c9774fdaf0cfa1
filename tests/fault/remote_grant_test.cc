// A push from another node needs the destination owner's write grant, checked on the node that
// owns the region: two real kvraild daemons (a, b) peered over tcp;ofi_rxm with mTLS (test CA)
// on loopback addresses (no root). b's owner exports its pool to a - which lets node a's daemon
// reach it, not any tenant of a - and every push without the owner's grant is refused by b
// with PERMISSION_DENIED naming spec.dst, writing nothing: no grant, a bogus token, a read
// grant, a write grant of another (also exported) region. With the owner's write grant the push
// is byte for byte; once the owner revokes it mid-transfer (layer-wise, half the layers landed),
// b lands nothing more, the push fails, and the layers after the revocation stay poison.
#include <catch2/catch.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/kv_fixture.h"
#include "tests/netns/netns.h"
#include "tests/tls/peer_calls.h"
#include "tests/tls/test_ca.h"

namespace kvrail::testing {
namespace {

constexpr uint32_t kLayers = 8, kBlocks = 32, kMoved = 24, kTpb = 16;

v1::PagedKvLayout Layout() {
  return MakeLayout(kLayers, 2, kBlocks, kTpb, 8, 128, v1::DTYPE_BF16,
                    v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

struct TlsPair {
  TestCa ca;
  NsDaemon a, b;
  const std::string ip_a = LoopbackIp(), ip_b = LoopbackIp();
  bool ok = false;
  TlsPair() {
    if (!ca.status().ok()) {
      UNSCOPED_INFO("test CA: " << ca.status());
      return;
    }
    const NsDaemonOptions options = TlsDaemonOptions(&ca);
    ok = a.Start("", "a", ip_a, "b", ip_b, options) && b.Start("", "b", ip_b, "a", ip_a, options) &&
         PeerUp(a, "b", absl::Seconds(15)) && PeerUp(b, "a", absl::Seconds(15));
    if (!ok) UNSCOPED_INFO("a log:\n" << a.Log() << "\nb log:\n" << b.Log());
  }
  std::string Logs() const { return absl::StrCat("a log:\n", a.Log(), "\nb log:\n", b.Log()); }
};

// The receiving node's newest inbound record, if any.
std::optional<v1::TransferStatus> NewestInbound(NsDaemon& node) {
  auto list = node.client->ListTransfers();
  if (!list.ok()) return std::nullopt;
  std::optional<v1::TransferStatus> newest;
  for (const auto& t : list->transfers()) {
    if (t.engine() == "fabric-receiver" && (!newest || t.transfer_id() > newest->transfer_id())) {
      newest = t;
    }
  }
  return newest;
}

TEST_CASE("a push into another node's exported region needs its owner's write grant") {
  TlsPair p;
  REQUIRE(p.ok);
  Pool src = MakePool(*p.a.client, Layout(), false, "src");
  Pool dst = MakePool(*p.b.client, Layout(), true, "dst");
  Pool other = MakePool(*p.b.client, Layout(), true, "other");
  REQUIRE(p.b.Export(dst.id(), "a").ok());
  REQUIRE(p.b.Export(other.id(), "a").ok());  // exported too, but not this push's grant
  const auto src_blocks = ScatteredBlocks(kBlocks, kMoved, 1);
  const auto dst_blocks = ScatteredBlocks(kBlocks, kMoved, 2);
  FillPool(src, 3, src_blocks, kMoved * kTpb);
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  spec.mutable_dst()->set_node_id("b");
  spec.set_timeout_ms(30000);

  auto read_grant = p.b.client->CreateGrant(dst.id(), v1::GRANT_ACCESS_READ);
  REQUIRE(read_grant.ok());
  const std::string other_grant = p.b.WriteGrant(other.id());
  REQUIRE(!other_grant.empty());
  const struct {
    const char* what;
    std::string grant;
    const char* says;
  } refused[] = {
      {"no grant", "", "spec.dst.region_id"},
      {"a bogus token", "kvg1.00000000000000000000000000000000", "spec.dst.grant"},
      {"a read grant", read_grant->token(), "spec.dst.grant: the grant lets the holder read"},
      {"another region's write grant", other_grant, "spec.dst.grant: the grant is for region"},
  };
  for (const auto& r : refused) {
    INFO(r.what);
    spec.mutable_dst()->set_grant(r.grant);
    auto submitted = p.a.client->Submit(spec);
    std::optional<v1::TransferStatus> ended;
    if (submitted.ok()) {
      auto waited = p.a.client->Wait(submitted->transfer_id(), absl::Seconds(30));
      if (waited.ok()) ended = *waited;
    }
    INFO(submitted.status().ToString() << "\n"
                                       << (ended ? ended->DebugString() : std::string()) << "\n"
                                       << p.Logs());
    // Refused at the submit (b's Begin answered PERMISSION_DENIED), never moved.
    REQUIRE(!submitted.ok());
    CHECK(submitted.status().code() == absl::StatusCode::kPermissionDenied);
    CHECK(std::string(submitted.status().message()).find(r.says) != std::string::npos);
    CHECK(CountWritten(dst) == 0);
    CHECK(CountWritten(other) == 0);
  }

  // The owner's write grant: byte for byte, nothing else written.
  spec.mutable_dst()->set_grant(p.b.WriteGrant(dst.id()));
  const v1::TransferStatus done = RunToEnd(*p.a.client, spec);
  INFO(done.DebugString() << "\n" << p.Logs());
  REQUIRE(done.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, Expectation{3, dst_blocks, kMoved * kTpb, 0, 0, kLayers, 0, 0, 8}) == "");
  CHECK(CountWritten(other) == 0);
}

TEST_CASE("the owner revoking its write grant mid-transfer stops the push on the owner's node") {
  TlsPair p;
  REQUIRE(p.ok);
  Pool src = MakePool(*p.a.client, Layout(), false, "src");
  Pool dst = MakePool(*p.b.client, Layout(), true, "dst");
  REQUIRE(p.b.Export(dst.id(), "a").ok());
  const auto src_blocks = ScatteredBlocks(kBlocks, kMoved, 4);
  const auto dst_blocks = ScatteredBlocks(kBlocks, kMoved, 5);
  FillPool(src, 6, src_blocks, kMoved * kTpb);
  const std::string grant = p.b.WriteGrant(dst.id());
  REQUIRE(!grant.empty());
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  spec.mutable_dst()->set_node_id("b");
  spec.mutable_dst()->set_grant(grant);
  spec.set_timeout_ms(60000);
  spec.set_layerwise(true);
  auto submitted = p.a.client->Submit(spec);
  INFO(submitted.status().ToString() << "\n" << p.Logs());
  REQUIRE(submitted.ok());
  const uint64_t id = submitted->transfer_id();
  REQUIRE(p.a.client->MarkReady(id, 0, kLayers / 2).ok());
  const absl::Time until = absl::Now() + absl::Seconds(20);
  std::optional<v1::TransferStatus> inbound;
  while (absl::Now() < until) {
    inbound = NewestInbound(p.b);
    if (inbound && inbound->layers_done() >= kLayers / 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(inbound.has_value());
  REQUIRE(inbound->layers_done() >= kLayers / 2);

  REQUIRE(p.b.client->RevokeGrant(grant).ok());
  // b's record of it ended with the revocation, before any further tile.
  auto b_ended = p.b.client->Wait(inbound->transfer_id(), absl::Seconds(10));
  REQUIRE(b_ended.ok());
  INFO(b_ended->DebugString());
  CHECK(b_ended->state() == v1::TRANSFER_STATE_FAILED);
  CHECK(b_ended->error_code() == static_cast<int>(absl::StatusCode::kPermissionDenied));
  CHECK(b_ended->error_message().find("spec.dst.grant") != std::string::npos);

  REQUIRE(p.a.client->MarkReady(id, kLayers / 2, kLayers / 2).ok());
  auto ended = p.a.client->Wait(id, absl::Seconds(30));
  INFO(ended.status());
  REQUIRE(ended.ok());
  INFO(ended->DebugString() << "\n" << p.Logs());
  CHECK(ended->state() == v1::TRANSFER_STATE_FAILED);
  // Exactly the layers before the revocation landed; the rest stayed poison.
  CHECK(VerifyPool(dst, Expectation{6, dst_blocks, kMoved * kTpb, 0, 0, kLayers / 2, 0, 0, 8}) ==
        "");
}

}  // namespace
}  // namespace kvrail::testing

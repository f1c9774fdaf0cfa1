// A peer attacking another peer's transfer (peers are authenticated): three kvraild
// daemons "a", "b" and "c" on loopback addresses, peered over mTLS with certificates from one
// test CA (tests/tls, openssl; no namespaces, no root). b's peers are a and c; a and c each have
// b. While a layer-wise transfer a -> b is half done, a caller holding c's certificate (c is
// authenticated as itself: a real peer of b, whose own transfers into b work) tries against b:
//   (a) to speak as a: Hello, Heartbeat, GetLease, Begin/End/AbortRemoteTransfer naming a;
//   (b) to get a handle into b's region exported to a only (BeginRemoteTransfer as itself), so
//       as to write tiles meant for a's transfer with its own registration key;
//   (c) to end or abort ("credit" to its end) a's transfer: End/Abort of every low handle as a
//       (refused) and as itself (not its transfers: NOT_FOUND).
// Each is refused, naming why; afterwards a's transfer completes and b's destination is byte for
// byte the source (nothing else written), b's record of it succeeded, and b never saw a restart.
// The data path's own checks (another peer's key refused by the provider, forged immediate data
// naming a's index refused without touching a's slots) are tried below the daemons in
// daemon/fabric:fi_test and daemon/fabric:receiver_test.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/kvrail/peer/v1/peer.grpc.pb.h"
#include "tests/integration/kv_fixture.h"
#include "tests/netns/netns.h"
#include "tests/tls/peer_calls.h"
#include "tests/tls/test_ca.h"

namespace kvrail::testing {

namespace peer_v1 = ::kvrail::peer::v1;

namespace {

constexpr uint32_t kLayers = 8, kBlocks = 64, kMoved = 48, kTpb = 16;

v1::PagedKvLayout Layout() {
  return MakeLayout(kLayers, 2, kBlocks, kTpb, 8, 128, v1::DTYPE_BF16,
                    v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

// The receiving node's newest inbound record (the highest id), if any.
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

// Daemons a, b, c over mTLS; b has both others as peers.
struct Trio {
  TestCa ca;
  NsDaemon a, b, c;
  const std::string ip_a = LoopbackIp(), ip_b = LoopbackIp(), ip_c = LoopbackIp();
  bool ok = false;
  Trio() {
    if (!ca.status().ok()) {
      UNSCOPED_INFO("test CA: " << ca.status());
      return;
    }
    const NsDaemonOptions options = TlsDaemonOptions(&ca);
    NsDaemonOptions b_options = options;
    b_options.extra_config = absl::StrCat("peers { key: \"c\" value: \"", ip_c, ":7070\" }\n");
    ok = b.Start("", "b", ip_b, "a", ip_a, b_options) &&
         a.Start("", "a", ip_a, "b", ip_b, options) && c.Start("", "c", ip_c, "b", ip_b, options) &&
         PeerUp(b, "a", absl::Seconds(15)) && PeerUp(b, "c", absl::Seconds(15)) &&
         PeerUp(a, "b", absl::Seconds(15)) && PeerUp(c, "b", absl::Seconds(15));
    if (!ok) {
      UNSCOPED_INFO("a log:\n" << a.Log() << "\nb log:\n" << b.Log() << "\nc log:\n" << c.Log());
    }
  }
  // A caller of b's Peer service presenting c's certificate (what a compromised c can do).
  std::unique_ptr<peer_v1::Peer::Stub> AsC() {
    return peer_v1::Peer::NewStub(
        TlsChannel(absl::StrCat(ip_b, ":", b.tcp_port), ca, "b", &ca, "c"));
  }
};

TEST_CASE("a peer authenticated as itself cannot act as another peer or touch its transfers") {
  Trio t;
  REQUIRE(t.ok);
  // b's destination for a (exported to a only) and one for c; a's source.
  Pool src = MakePool(*t.a.client, Layout(), false, "src");
  Pool dst = MakePool(*t.b.client, Layout(), true, "dst-for-a");
  Pool c_dst = MakePool(*t.b.client, Layout(), true, "dst-for-c");
  Pool bystander = MakePool(*t.b.client, Layout(), true, "bystander");
  REQUIRE(t.b.Export(dst.id(), "a").ok());
  REQUIRE(t.b.Export(c_dst.id(), "c").ok());
  {
    // The client library's own region (RegionSpec.library_region) is no endpoint for a peer
    // either: its owner cannot export it.
    auto all = t.b.client->ListRegions(/*include_library_regions=*/true);
    REQUIRE(all.ok());
    uint64_t library = 0;
    for (const auto& r : all->regions()) {
      if (r.spec().library_region()) library = r.region_id();
    }
    REQUIRE(library != 0);
    const absl::Status exported = t.b.Export(library, "a");
    INFO(exported.ToString());
    CHECK(exported.code() == absl::StatusCode::kPermissionDenied);
    CHECK(std::string(exported.message()).find("RegionSpec.library_region") != std::string::npos);
  }
  const auto src_blocks = ScatteredBlocks(kBlocks, kMoved, 31);
  const auto dst_blocks = ScatteredBlocks(kBlocks, kMoved, 32);
  FillPool(src, 33, src_blocks, kMoved * kTpb);

  // c is a real peer of b: its own transfer into the pool exported to it works.
  {
    Pool c_src = MakePool(*t.c.client, Layout(), false, "c-src");
    FillPool(c_src, 34, src_blocks, kMoved * kTpb);
    auto spec = client::MakeBlockTransfer(c_src.id(), src_blocks, c_dst.id(), dst_blocks);
    spec.mutable_dst()->set_node_id("b");
    spec.mutable_dst()->set_grant(t.b.WriteGrant(c_dst.id()));
    const v1::TransferStatus done = RunToEnd(*t.c.client, spec);
    INFO(done.DebugString() << "\nc log:\n" << t.c.Log());
    REQUIRE(done.state() == v1::TRANSFER_STATE_SUCCEEDED);
    CHECK(VerifyPool(c_dst, Expectation{34, dst_blocks, kMoved * kTpb, 0, 0, kLayers, 0, 0, 8}) ==
          "");
  }

  // a -> b, layer-wise: the first half released and landed, the rest withheld during the attack.
  auto spec = client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  spec.mutable_dst()->set_node_id("b");
  spec.mutable_dst()->set_grant(t.b.WriteGrant(dst.id()));
  spec.set_timeout_ms(120000);
  spec.set_layerwise(true);
  auto submitted = t.a.client->Submit(spec);
  INFO(submitted.status().ToString() << "\na log:\n" << t.a.Log() << "\nb log:\n" << t.b.Log());
  REQUIRE(submitted.ok());
  const uint64_t id = submitted->transfer_id();
  REQUIRE(t.a.client->MarkReady(id, 0, kLayers / 2).ok());
  std::optional<v1::TransferStatus> inbound;
  for (int i = 0; i < 2000; ++i) {
    inbound = NewestInbound(t.b);  // a's: c's ended before it began
    if (inbound && inbound->layers_done() >= kLayers / 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(inbound.has_value());
  REQUIRE(inbound->layers_done() >= kLayers / 2);

  auto c = t.AsC();
  {
    INFO("(a) c speaking as a");
    peer_v1::HelloResponse hello;
    CHECK(Says(c->Hello(Context().get(), HelloAs("a"), &hello), grpc::StatusCode::PERMISSION_DENIED,
               "hello.node_id: 'a'"));
    peer_v1::HeartbeatRequest beat;
    beat.set_node_id("a");
    peer_v1::HeartbeatResponse beat_answer;
    CHECK(Says(c->Heartbeat(Context().get(), beat, &beat_answer),
               grpc::StatusCode::PERMISSION_DENIED, "node_id: 'a'"));
    peer_v1::GetLeaseRequest lease;
    lease.set_region_id(dst.id());
    lease.set_requester_node_id("a");
    v1::RegionLease lease_answer;
    CHECK(Says(c->GetLease(Context().get(), lease, &lease_answer),
               grpc::StatusCode::PERMISSION_DENIED, "requester_node_id: 'a'"));
    // As itself, c gets no lease of the region exported to a.
    lease.set_requester_node_id("c");
    CHECK(c->GetLease(Context().get(), lease, &lease_answer).error_code() ==
          grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    INFO("(b) c beginning a transfer into a's destination, to write tiles there with its key");
    peer_v1::BeginRemoteTransferRequest begin;
    begin.set_sender_boot_id(12345);
    begin.set_sender_transfer_id(777);
    *begin.mutable_spec() = spec;
    begin.mutable_spec()->set_layerwise(false);
    begin.mutable_source()->set_size_bytes(src.info.spec().size_bytes());
    *begin.mutable_source()->mutable_paged_kv() = Layout();
    begin.set_tile_bytes(65536);
    begin.set_tiles_total(96);
    begin.set_bytes_total(96 * 65536);
    peer_v1::BeginRemoteTransferResponse begun;
    begin.set_sender_node_id("a");
    CHECK(Says(c->BeginRemoteTransfer(Context().get(), begin, &begun),
               grpc::StatusCode::PERMISSION_DENIED, "sender_node_id: 'a'"));
    begin.set_sender_node_id("c");
    const grpc::Status as_c = c->BeginRemoteTransfer(Context().get(), begin, &begun);
    INFO(as_c.error_message());
    CHECK(as_c.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    INFO("(c) c ending or aborting a's transfer");
    for (uint32_t handle = 1; handle <= 64; ++handle) {
      peer_v1::EndRemoteTransferResponse answer;
      peer_v1::AbortRemoteTransferRequest abort;
      abort.set_sender_node_id("a");
      abort.set_handle(handle);
      abort.set_error_message("c says so");
      CHECK(Says(c->AbortRemoteTransfer(Context().get(), abort, &answer),
                 grpc::StatusCode::PERMISSION_DENIED, "sender_node_id: 'a'"));
      abort.set_sender_node_id("c");
      CHECK(c->AbortRemoteTransfer(Context().get(), abort, &answer).error_code() ==
            grpc::StatusCode::NOT_FOUND);
      peer_v1::EndRemoteTransferRequest end;
      end.set_sender_node_id("a");
      end.set_handle(handle);
      CHECK(Says(c->EndRemoteTransfer(Context().get(), end, &answer),
                 grpc::StatusCode::PERMISSION_DENIED, "sender_node_id: 'a'"));
      end.set_sender_node_id("c");
      CHECK(c->EndRemoteTransfer(Context().get(), end, &answer).error_code() ==
            grpc::StatusCode::NOT_FOUND);
    }
  }

  // a's transfer goes on untouched: the rest released, all of it lands byte for byte.
  auto mid = t.b.client->Get(inbound->transfer_id());
  REQUIRE(mid.ok());
  CHECK(mid->state() != v1::TRANSFER_STATE_FAILED);
  REQUIRE(t.a.client->MarkReady(id, kLayers / 2, kLayers / 2).ok());
  auto ended = t.a.client->Wait(id, absl::Seconds(60));
  INFO(ended.status());
  REQUIRE(ended.ok());
  INFO(ended->DebugString() << "\na log:\n" << t.a.Log() << "\nb log:\n" << t.b.Log());
  CHECK(ended->state() == v1::TRANSFER_STATE_SUCCEEDED);
  auto received = t.b.client->Wait(inbound->transfer_id(), absl::Seconds(30));
  REQUIRE(received.ok());
  CHECK(received->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, Expectation{33, dst_blocks, kMoved * kTpb, 0, 0, kLayers, 0, 0, 8}) == "");
  CHECK(CountWritten(bystander) == 0);
  // b never took c's claims for a: no restart of a, a and c both still up.
  CHECK(t.b.Log().find("peer 'a' restarted") == std::string::npos);
  CHECK(PeerUp(t.b, "a", absl::Seconds(5)));
  CHECK(PeerUp(t.b, "c", absl::Seconds(5)));
}

}  // namespace
}  // namespace kvrail::testing

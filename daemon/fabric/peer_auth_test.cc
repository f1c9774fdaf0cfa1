// The pure parts of peer authentication: the node id a certificate's CN gives, claims checked
// against it, and the bounds on a peer's Hello and BeginRemoteTransfer. Each check is tried with
// a value just past it.
#include "daemon/fabric/peer_auth.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

namespace {

bool Says(const absl::Status& status, absl::StatusCode code, const std::string& text) {
  INFO(status.ToString());
  return status.code() == code && status.message().find(text) != absl::string_view::npos;
}

peer_v1::PeerHello GoodHello() {
  peer_v1::PeerHello hello;
  hello.set_version(1);
  hello.set_node_id("node-a");
  hello.set_provider("tcp;ofi_rxm");
  hello.set_your_index(3);
  peer_v1::PeerNic* nic = hello.add_nics();
  nic->set_name("nic0@10.0.0.1");
  nic->set_fabric_address(std::string(16, '\x02'));
  return hello;
}

peer_v1::BeginRemoteTransferRequest GoodBegin() {
  peer_v1::BeginRemoteTransferRequest request;
  request.set_sender_node_id("node-a");
  request.set_tile_bytes(1 << 20);
  request.set_tiles_total(8);
  request.set_bytes_total(8 << 20);
  return request;
}

TEST_CASE("the node id is the certificate's one CN") {
  auto id = NodeIdFromCommonNames({"node-a"});
  REQUIRE(id.ok());
  CHECK(*id == "node-a");
  CHECK(Says(NodeIdFromCommonNames({}).status(), absl::StatusCode::kUnauthenticated,
             "certificate CN"));
  CHECK(Says(NodeIdFromCommonNames({"a", "b"}).status(), absl::StatusCode::kUnauthenticated,
             "exactly one"));
  CHECK(Says(NodeIdFromCommonNames({""}).status(), absl::StatusCode::kUnauthenticated,
             "not a node id"));
  CHECK(NodeIdFromCommonNames({std::string(kMaxNodeIdBytes, 'n')}).ok());
  CHECK(Says(NodeIdFromCommonNames({std::string(kMaxNodeIdBytes + 1, 'n')}).status(),
             absl::StatusCode::kUnauthenticated, "not a node id"));
  CHECK(Says(NodeIdFromCommonNames({std::string("node-a\nnode-b")}).status(),
             absl::StatusCode::kUnauthenticated, "not a node id"));
}

TEST_CASE("a certificate whose subject has two CNs is refused, not read as its first") {
  // gRPC's x509_common_name reports the subject's first CN only: "CN=c,CN=a" (RFC 2253, last
  // RDN first) would have been node "a".
  using V = std::vector<std::string>;
  CHECK(CommonNamesOfSubject("CN=node-a") == V{"node-a"});
  CHECK(CommonNamesOfSubject("CN=node-a,O=kvrail,C=DE") == V{"node-a"});
  CHECK(CommonNamesOfSubject("CN=c,CN=a") == V{"c", "a"});
  CHECK(CommonNamesOfSubject("CN=a+CN=c,O=x") == V{"a", "c"});  // one multi-valued RDN
  CHECK(CommonNamesOfSubject("cn=a,commonName=c") == V{"a", "c"});
  CHECK(CommonNamesOfSubject("2.5.4.3=a,CN=c") == V{"a", "c"});
  // Escaped separators are part of the value, not a second attribute.
  CHECK(CommonNamesOfSubject("CN=a\\,CN=c") == V{"a,CN=c"});
  CHECK(CommonNamesOfSubject("CN=a\\+CN\\3Dc") == V{"a+CN=c"});
  CHECK(CommonNamesOfSubject("O=no common name").empty());
  CHECK(CommonNamesOfSubject("").empty());

  CHECK(*NodeIdFromCertificate({"node-a"}, {"node-a"}) == "node-a");
  CHECK(Says(NodeIdFromCertificate({"a"}, {"a", "c"}).status(), absl::StatusCode::kUnauthenticated,
             "its subject has 2"));
  CHECK(Says(NodeIdFromCertificate({"c"}, {"a", "c"}).status(), absl::StatusCode::kUnauthenticated,
             "exactly one node id"));
  CHECK(Says(NodeIdFromCertificate({"a"}, {}).status(), absl::StatusCode::kUnauthenticated,
             "its subject has 0"));
  CHECK(Says(NodeIdFromCertificate({"a"}, {"b"}).status(), absl::StatusCode::kUnauthenticated,
             "not the one the TLS library reported"));
  CHECK(Says(NodeIdFromCertificate({}, {"a"}).status(), absl::StatusCode::kUnauthenticated,
             "certificate CN"));
}

TEST_CASE("a claim of another node is refused naming the field") {
  CHECK(CheckClaimedNode("node-b", "node-b", "hello.node_id").ok());
  const absl::Status refused = CheckClaimedNode("node-a", "node-b", "hello.node_id");
  CHECK(Says(refused, absl::StatusCode::kPermissionDenied, "hello.node_id: 'node-a'"));
  CHECK(Says(refused, absl::StatusCode::kPermissionDenied, "('node-b')"));
  // A prefix of the real id, or the id with a suffix, is another node.
  CHECK(!CheckClaimedNode("node-b", "node-bb", "f").ok());
  CHECK(!CheckClaimedNode("node-bb", "node-b", "f").ok());
  CHECK(!CheckClaimedNode("", "node-b", "f").ok());
  // A huge claim is cut in the message.
  const absl::Status huge = CheckClaimedNode(std::string(100000, 'x'), "node-b", "f");
  CHECK(huge.message().size() < 1000);
}

TEST_CASE("a Hello's sizes are bounded") {
  CHECK(CheckHelloBounds(GoodHello(), "hello.").ok());
  peer_v1::PeerHello h = GoodHello();
  h.set_node_id("");
  CHECK(Says(CheckHelloBounds(h, "hello."), absl::StatusCode::kInvalidArgument, "hello.node_id"));
  h = GoodHello();
  h.set_node_id(std::string(kMaxNodeIdBytes + 1, 'a'));
  CHECK(Says(CheckHelloBounds(h, "hello."), absl::StatusCode::kInvalidArgument, "hello.node_id"));
  h = GoodHello();
  h.set_provider(std::string(kMaxPeerTextBytes + 1, 'p'));
  CHECK(Says(CheckHelloBounds(h, "hello."), absl::StatusCode::kInvalidArgument, "hello.provider"));
  h = GoodHello();
  h.set_topology_summary(std::string(kMaxPeerTextBytes + 1, 't'));
  CHECK(Says(CheckHelloBounds(h, "hello."), absl::StatusCode::kInvalidArgument,
             "hello.topology_summary"));
  h = GoodHello();
  h.set_software_version(std::string(kMaxPeerTextBytes + 1, 'v'));
  CHECK(Says(CheckHelloBounds(h, "hello."), absl::StatusCode::kInvalidArgument,
             "hello.software_version"));
  h = GoodHello();
  for (int i = 1; i < kMaxPeerNics; ++i) *h.add_nics() = h.nics(0);
  CHECK(CheckHelloBounds(h, "hello.").ok());
  *h.add_nics() = h.nics(0);
  CHECK(Says(CheckHelloBounds(h, "hello."), absl::StatusCode::kInvalidArgument, "hello.nics: 65"));
  h = GoodHello();
  h.mutable_nics(0)->set_fabric_address("");
  CHECK(Says(CheckHelloBounds(h, "hello."), absl::StatusCode::kInvalidArgument,
             "hello.nics[0].fabric_address"));
  h = GoodHello();
  h.mutable_nics(0)->set_fabric_address(std::string(kMaxFabricAddressBytes + 1, 'x'));
  CHECK(Says(CheckHelloBounds(h, "hello."), absl::StatusCode::kInvalidArgument,
             "hello.nics[0].fabric_address"));
  h = GoodHello();
  h.mutable_nics(0)->set_name(std::string(kMaxPeerTextBytes + 1, 'n'));
  CHECK(Says(CheckHelloBounds(h, "hello."), absl::StatusCode::kInvalidArgument,
             "hello.nics[0].name"));
  h = GoodHello();
  h.set_your_index(kMaxPeerIndex);
  CHECK(CheckHelloBounds(h, "hello.").ok());
  h.set_your_index(kMaxPeerIndex + 1);
  CHECK(Says(CheckHelloBounds(h, "response.hello."), absl::StatusCode::kInvalidArgument,
             "response.hello.your_index"));
}

TEST_CASE("a BeginRemoteTransfer's sizes are bounded before planning") {
  const uint64_t slot = 4 << 20;
  CHECK(CheckBeginBounds(GoodBegin(), slot).ok());
  auto r = GoodBegin();
  r.set_tile_bytes(1);  // the probe that cost 5 s of CPU
  CHECK(Says(CheckBeginBounds(r, slot), absl::StatusCode::kInvalidArgument, "tile_bytes: 1 "));
  r.set_tile_bytes(kMinPeerTileBytes - 1);
  CHECK(!CheckBeginBounds(r, slot).ok());
  r.set_tile_bytes(kMinPeerTileBytes);
  r.set_bytes_total(8 * kMinPeerTileBytes);
  CHECK(CheckBeginBounds(r, slot).ok());
  r = GoodBegin();
  r.set_tile_bytes(slot + 1);
  CHECK(Says(CheckBeginBounds(r, slot), absl::StatusCode::kInvalidArgument, "fabric.slot_bytes"));
  r = GoodBegin();
  r.set_tiles_total(0);
  CHECK(Says(CheckBeginBounds(r, slot), absl::StatusCode::kInvalidArgument, "tiles_total"));
  r.set_tiles_total(kMaxPeerTiles + 1);
  r.set_bytes_total(1);
  CHECK(Says(CheckBeginBounds(r, slot), absl::StatusCode::kInvalidArgument, "tiles_total"));
  r.set_tiles_total(kMaxPeerTiles);
  CHECK(CheckBeginBounds(r, slot).ok());
  r = GoodBegin();
  r.set_bytes_total(8 * (1 << 20) + 1);
  CHECK(Says(CheckBeginBounds(r, slot), absl::StatusCode::kInvalidArgument, "bytes_total"));
  r = GoodBegin();
  r.set_sender_node_id(std::string(kMaxNodeIdBytes + 1, 's'));
  CHECK(Says(CheckBeginBounds(r, slot), absl::StatusCode::kInvalidArgument, "sender_node_id"));
}

TEST_CASE("peer texts are cut for logs") {
  CHECK(BoundedPeerText("short") == "short");
  const std::string cut = BoundedPeerText(std::string(1 << 20, 'e'));
  CHECK(cut.size() < kMaxPeerTextBytes + 64);
  CHECK(cut.find("(1048576 bytes)") != std::string::npos);
}

}  // namespace
}  // namespace kvrail::fabric

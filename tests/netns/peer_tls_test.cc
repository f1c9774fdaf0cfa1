// Peers are authenticated: kvraild daemons on loopback addresses with
// certificates from a test CA (tests/tls, made by openssl). Two daemons introduce each other over
// mTLS; a caller without a certificate, with another CA's certificate or over plaintext never
// reaches the Peer service; a caller with a valid certificate for one node claiming another in
// any peer message is PERMISSION_DENIED naming the field; a daemon whose peer answers with the
// certificate of another node does not introduce it; Transfer and Admin over TCP are refused even
// to a valid certificate; peer RPCs over the unix socket are refused; a peer's sizes are bounded;
// kvraild refuses tcp_listen without peer_tls or --insecure-peers and warns with the latter.
//
// No namespaces: every daemon listens on its own random 127.x.y.z address (netns.h LoopbackIp), so
// it runs without root.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "absl/time/clock.h"
#include "proto/kvrail/peer/v1/peer.grpc.pb.h"
#include "proto/kvrail/v1/admin.grpc.pb.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "tests/netns/netns.h"
#include "tests/tls/peer_calls.h"
#include "tests/tls/test_ca.h"

namespace kvrail::testing {

namespace peer_v1 = ::kvrail::peer::v1;

namespace {

// Daemons "a" and "b" peered over mTLS on two loopback addresses, certificates from `ca`.
struct TlsPair {
  TestCa ca;
  NsDaemon a, b;
  std::string ip_a = LoopbackIp(), ip_b = LoopbackIp();
  bool ok = false;
  TlsPair() {
    if (!ca.status().ok()) {
      UNSCOPED_INFO("test CA: " << ca.status());
      return;
    }
    const NsDaemonOptions options = TlsDaemonOptions(&ca);
    ok = a.Start("", "a", ip_a, "b", ip_b, options) && b.Start("", "b", ip_b, "a", ip_a, options);
    if (!ok) UNSCOPED_INFO("a log:\n" << a.Log() << "\nb log:\n" << b.Log());
  }
  std::string b_address() const { return ip_b + ":" + std::to_string(b.tcp_port); }
};

TEST_CASE("two daemons with certificates from one CA introduce each other over mTLS") {
  TlsPair pair;
  REQUIRE(pair.ok);
  CHECK(PeerUp(pair.a, "b", absl::Seconds(10)));
  CHECK(PeerUp(pair.b, "a", absl::Seconds(10)));
  CHECK(pair.a.Log().find("peers: mTLS") != std::string::npos);
  CHECK(pair.b.Log().find("peer 'a' introduced") != std::string::npos);
}

TEST_CASE("no certificate, another CA's certificate and plaintext never reach the Peer service") {
  TlsPair pair;
  REQUIRE(pair.ok);
  TestCa other("other");
  REQUIRE(other.status().ok());
  peer_v1::HelloResponse response;
  {
    INFO("a TLS client without a certificate");
    auto peer = peer_v1::Peer::NewStub(TlsChannel(pair.b_address(), pair.ca, "b", nullptr, ""));
    CHECK(peer->Hello(Context().get(), HelloAs("a"), &response).error_code() ==
          grpc::StatusCode::UNAVAILABLE);
  }
  {
    INFO("a certificate for 'a' from another CA");
    auto peer = peer_v1::Peer::NewStub(TlsChannel(pair.b_address(), pair.ca, "b", &other, "a"));
    CHECK(peer->Hello(Context().get(), HelloAs("a"), &response).error_code() ==
          grpc::StatusCode::UNAVAILABLE);
    peer_v1::HeartbeatRequest beat;
    beat.set_node_id("a");
    peer_v1::HeartbeatResponse answer;
    CHECK(peer->Heartbeat(Context().get(), beat, &answer).error_code() ==
          grpc::StatusCode::UNAVAILABLE);
  }
  {
    INFO("plaintext");
    auto peer = peer_v1::Peer::NewStub(
        grpc::CreateChannel(pair.b_address(), grpc::InsecureChannelCredentials()));
    CHECK(peer->Hello(Context().get(), HelloAs("a"), &response).error_code() ==
          grpc::StatusCode::UNAVAILABLE);
  }
  // The real peering is untouched.
  CHECK(PeerUp(pair.b, "a", absl::Seconds(5)));
}

TEST_CASE(
    "a valid certificate for one node claiming another is PERMISSION_DENIED naming the field") {
  TlsPair pair;
  REQUIRE(pair.ok);
  REQUIRE(PeerUp(pair.b, "a", absl::Seconds(10)));
  // "c" has a good certificate from the cluster's CA but is not "a".
  auto peer = peer_v1::Peer::NewStub(TlsChannel(pair.b_address(), pair.ca, "b", &pair.ca, "c"));
  peer_v1::HelloResponse hello;
  CHECK(Says(peer->Hello(Context().get(), HelloAs("a"), &hello),
             grpc::StatusCode::PERMISSION_DENIED, "hello.node_id: 'a'"));
  peer_v1::HeartbeatRequest beat;
  beat.set_node_id("a");
  peer_v1::HeartbeatResponse beat_answer;
  CHECK(Says(peer->Heartbeat(Context().get(), beat, &beat_answer),
             grpc::StatusCode::PERMISSION_DENIED, "node_id: 'a'"));
  peer_v1::GetLeaseRequest lease;
  lease.set_region_id(1);
  lease.set_requester_node_id("a");
  v1::RegionLease lease_answer;
  CHECK(Says(peer->GetLease(Context().get(), lease, &lease_answer),
             grpc::StatusCode::PERMISSION_DENIED, "requester_node_id: 'a'"));
  peer_v1::BeginRemoteTransferRequest begin;
  begin.set_sender_node_id("a");
  begin.set_tile_bytes(1 << 20);
  begin.set_tiles_total(1);
  peer_v1::BeginRemoteTransferResponse begin_answer;
  CHECK(Says(peer->BeginRemoteTransfer(Context().get(), begin, &begin_answer),
             grpc::StatusCode::PERMISSION_DENIED, "sender_node_id: 'a'"));
  peer_v1::EndRemoteTransferRequest end;
  end.set_sender_node_id("a");
  end.set_handle(1);
  peer_v1::EndRemoteTransferResponse end_answer;
  CHECK(Says(peer->EndRemoteTransfer(Context().get(), end, &end_answer),
             grpc::StatusCode::PERMISSION_DENIED, "sender_node_id: 'a'"));
  peer_v1::AbortRemoteTransferRequest abort;
  abort.set_sender_node_id("a");
  abort.set_handle(1);
  CHECK(Says(peer->AbortRemoteTransfer(Context().get(), abort, &end_answer),
             grpc::StatusCode::PERMISSION_DENIED, "sender_node_id: 'a'"));
  // Speaking as itself, "c" is simply not a peer of b.
  CHECK(Says(peer->Hello(Context().get(), HelloAs("c"), &hello),
             grpc::StatusCode::PERMISSION_DENIED, "not in this daemon's peer directory"));
  // b still knows a as before (the spoofed Hello installed nothing).
  CHECK(PeerUp(pair.b, "a", absl::Seconds(5)));
  CHECK(pair.b.Log().find("peer 'a' restarted") == std::string::npos);
}

TEST_CASE("a certificate with two CNs is refused, not read as its first") {
  // The CA signed a certificate whose subject is CN=a, CN=c. gRPC reports its first CN only, so
  // it spoke as "a" while its holder may be "c".
  TlsPair pair;
  REQUIRE(pair.ok);
  REQUIRE(PeerUp(pair.b, "a", absl::Seconds(10)));
  REQUIRE(pair.ca.IssueSubject("two-cns", "/CN=a/CN=c").ok());
  auto peer =
      peer_v1::Peer::NewStub(TlsChannel(pair.b_address(), pair.ca, "b", &pair.ca, "two-cns"));
  peer_v1::HelloResponse hello;
  CHECK(Says(peer->Hello(Context().get(), HelloAs("a"), &hello), grpc::StatusCode::UNAUTHENTICATED,
             "certificate CN"));
  peer_v1::HeartbeatRequest beat;
  beat.set_node_id("a");
  peer_v1::HeartbeatResponse beat_answer;
  CHECK(Says(peer->Heartbeat(Context().get(), beat, &beat_answer),
             grpc::StatusCode::UNAUTHENTICATED, "its subject has 2"));
  // The real "a" is untouched.
  CHECK(PeerUp(pair.b, "a", absl::Seconds(5)));
  CHECK(pair.b.Log().find("peer 'a' restarted") == std::string::npos);
}

TEST_CASE("a peer answering with another node's certificate is not introduced") {
  TestCa ca;
  REQUIRE(ca.status().ok());
  NsDaemonOptions options;
  options.nics = 1;
  options.ca = &ca;
  // a expects node "b" at c's address; c has a valid certificate, for "c".
  NsDaemon a, c;
  const std::string ip_a = LoopbackIp(), ip_c = LoopbackIp();
  REQUIRE(a.Start("", "a", ip_a, "b", ip_c, options));
  REQUIRE(c.Start("", "c", ip_c, "a", ip_a, options));
  CHECK(!PeerUp(a, "b", absl::Seconds(3)));
  // c's Hello to a claims "c", which a's directory does not hold.
  CHECK(!PeerUp(c, "a", absl::Milliseconds(100)));
  INFO("a log:\n" << a.Log() << "\nc log:\n" << c.Log());
  CHECK(a.Log().find("introduced") == std::string::npos);
  CHECK(c.Log().find("introduced") == std::string::npos);
}

TEST_CASE("Transfer and Admin over TCP are refused even to a valid certificate") {
  TlsPair pair;
  REQUIRE(pair.ok);
  auto channel = TlsChannel(pair.b_address(), pair.ca, "b", &pair.ca, "a");
  auto admin = v1::Admin::NewStub(channel);
  v1::Stats stats;
  CHECK(Says(admin->GetStats(Context().get(), v1::GetStatsRequest(), &stats),
             grpc::StatusCode::PERMISSION_DENIED, "tcp_serves_api"));
  auto transfer = v1::Transfer::NewStub(channel);
  v1::GetTransferRequest get;
  get.set_transfer_id(1);
  v1::TransferStatus status;
  CHECK(Says(transfer->GetTransfer(Context().get(), get, &status),
             grpc::StatusCode::PERMISSION_DENIED, "tcp_serves_api"));
  // And without a certificate they are not even reached.
  auto anonymous = v1::Admin::NewStub(TlsChannel(pair.b_address(), pair.ca, "b", nullptr, ""));
  CHECK(anonymous->GetStats(Context().get(), v1::GetStatsRequest(), &stats).error_code() ==
        grpc::StatusCode::UNAVAILABLE);
}

TEST_CASE("peer RPCs over the unix socket are refused when peers use mTLS") {
  TlsPair pair;
  REQUIRE(pair.ok);
  auto peer = peer_v1::Peer::NewStub(
      grpc::CreateChannel("unix:" + pair.b.socket, grpc::InsecureChannelCredentials()));
  peer_v1::HelloResponse hello;
  CHECK(Says(peer->Hello(Context().get(), HelloAs("a"), &hello), grpc::StatusCode::UNAUTHENTICATED,
             "certificate"));
  peer_v1::BeginRemoteTransferRequest begin;
  begin.set_sender_node_id("a");
  peer_v1::BeginRemoteTransferResponse begin_answer;
  CHECK(Says(peer->BeginRemoteTransfer(Context().get(), begin, &begin_answer),
             grpc::StatusCode::UNAUTHENTICATED, "certificate"));
}

TEST_CASE("a peer's sizes are bounded, even from its own certificate") {
  TlsPair pair;
  REQUIRE(pair.ok);
  REQUIRE(PeerUp(pair.b, "a", absl::Seconds(10)));
  auto peer = peer_v1::Peer::NewStub(TlsChannel(pair.b_address(), pair.ca, "b", &pair.ca, "a"));
  // tile_bytes 1 cost 5 s of CPU before; now it is refused before planning.
  peer_v1::BeginRemoteTransferRequest begin;
  begin.set_sender_node_id("a");
  begin.set_tile_bytes(1);
  begin.set_tiles_total(1 << 20);
  begin.set_bytes_total(1 << 20);
  peer_v1::BeginRemoteTransferResponse begin_answer;
  const absl::Time start = absl::Now();
  CHECK(Says(peer->BeginRemoteTransfer(Context().get(), begin, &begin_answer),
             grpc::StatusCode::INVALID_ARGUMENT, "tile_bytes: 1 "));
  CHECK(absl::Now() - start < absl::Seconds(1));
  begin.set_tile_bytes(1 << 20);
  begin.set_tiles_total((1 << 20) + 1);
  CHECK(Says(peer->BeginRemoteTransfer(Context().get(), begin, &begin_answer),
             grpc::StatusCode::INVALID_ARGUMENT, "tiles_total"));
  // A fabric address shorter than the provider's (fi_av_insert would read past it).
  peer_v1::HelloRequest short_address = HelloAs("a");
  short_address.mutable_hello()->mutable_nics(0)->set_fabric_address("x");
  peer_v1::HelloResponse hello;
  CHECK(Says(peer->Hello(Context().get(), short_address, &hello),
             grpc::StatusCode::INVALID_ARGUMENT, "hello.nics[0].fabric_address: 1 bytes"));
  peer_v1::HelloRequest many = HelloAs("a");
  for (int i = 0; i < 100; ++i) *many.mutable_hello()->add_nics() = many.hello().nics(0);
  CHECK(Says(peer->Hello(Context().get(), many, &hello), grpc::StatusCode::INVALID_ARGUMENT,
             "hello.nics: 101"));
  // None of it disturbed the real a.
  CHECK(PeerUp(pair.b, "a", absl::Seconds(5)));
  CHECK(pair.b.Log().find("peer 'a' restarted") == std::string::npos);
}

TEST_CASE("kvraild refuses tcp_listen without peer_tls, and warns with --insecure-peers") {
  TempDir dir;
  const std::string bin = RunfilePath("daemon/kvraild");
  const std::string socket = dir.path() + "/k.sock";
  const std::string address = LoopbackIp() + ":0";
  CommandResult refused = RunCommand({bin, "--socket", socket, "--tcp-listen", address});
  CHECK(refused.exit_code != 0);
  CHECK(refused.err.find("tcp_listen: set, but peer_tls (ca_file, cert_file, key_file)") !=
        std::string::npos);
  CommandResult half = RunCommand(
      {bin, "--socket", socket, "--tcp-listen", address, "--peer-ca", "/nonexistent/ca.pem"});
  CHECK(half.exit_code != 0);
  CHECK(half.err.find("peer_tls.cert_file: not set") != std::string::npos);
  TestCa ca;
  REQUIRE(ca.status().ok());
  auto issued = ca.Issue("solo");
  REQUIRE(issued.ok());
  CommandResult unreadable = RunCommand({bin, "--socket", socket, "--tcp-listen", address,
                                         "--peer-ca", dir.path() + "/missing.pem", "--peer-cert",
                                         issued->cert_file, "--peer-key", issued->key_file});
  CHECK(unreadable.exit_code != 0);
  CHECK(unreadable.err.find("peer_tls.ca_file: cannot read") != std::string::npos);
  DaemonProcess insecure;
  REQUIRE(insecure.Start(dir.path(), {"--tcp-listen", address, "--insecure-peers"}));
  CHECK(insecure.ReadLog().find("insecure_peers: tcp_listen and the channels to peers are "
                                "plaintext") != std::string::npos);
}

}  // namespace
}  // namespace kvrail::testing

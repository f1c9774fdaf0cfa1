// Who may touch what, against a live kvraild (docs/security.md), each check tried from the
// wrong side: forged and missing credentials, another client's regions (read, write,
// unregister), its transfers (cancel, mark ready) and its notifications, a spoofed submitter in
// the spec, the Transfer/Admin services over TCP, and exports of a region to another node
// (another session, anonymous, over TCP; a daemon with a fabric on a loopback address). Every
// refusal names the field and nothing moves.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/numbers.h"
#include "proto/kvrail/peer/v1/peer.grpc.pb.h"
#include "proto/kvrail/v1/admin.grpc.pb.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "tests/integration/kv_fixture.h"
#include "tests/netns/netns.h"
#include "tests/tls/peer_calls.h"
#include "tests/tls/test_ca.h"
#include "wire/session_wire.h"

namespace kvrail::testing {

namespace peer_v1 = ::kvrail::peer::v1;

namespace {

v1::PagedKvLayout Small() {
  return MakeLayout(2, 2, 16, 16, 2, 8, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

std::unique_ptr<v1::Transfer::Stub> RawStub(const std::string& target) {
  return v1::Transfer::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
}

bool Has(const grpc::Status& s, grpc::StatusCode code, const std::string& text) {
  INFO(s.error_message());
  return s.error_code() == code && s.error_message().find(text) != std::string::npos;
}

TEST_CASE("forged credentials are UNAUTHENTICATED; anonymous calls own nothing") {
  LiveDaemon live;
  Pool src = MakePool(*live.client, Small(), false, "a-src");
  Pool dst = MakePool(*live.client, Small(), true, "a-dst");
  auto stub = RawStub("unix:" + live.daemon.socket());

  // The right session id with a wrong secret.
  grpc::ClientContext forged;
  forged.AddMetadata(wire::kSessionMetadataKey,
                     wire::SessionMetadataValue(src.info.session_id(), "0123456789abcdef"));
  v1::SubmitTransferRequest request;
  *request.mutable_spec() = client::MakeBlockTransfer(src.id(), {1}, dst.id(), {2});
  v1::SubmitTransferResponse response;
  CHECK(Has(stub->SubmitTransfer(&forged, request, &response), grpc::StatusCode::UNAUTHENTICATED,
            "kvrail-session"));
  grpc::ClientContext garbled;
  garbled.AddMetadata(wire::kSessionMetadataKey, "not-a-credential");
  CHECK(Has(stub->SubmitTransfer(&garbled, request, &response), grpc::StatusCode::UNAUTHENTICATED,
            "kvrail-session"));

  // No credentials: the spec's claim to be the owner's session changes nothing.
  request.mutable_spec()->set_session_id(src.info.session_id());
  grpc::ClientContext anonymous;
  CHECK(Has(stub->SubmitTransfer(&anonymous, request, &response),
            grpc::StatusCode::PERMISSION_DENIED, "spec.src.region_id"));
  v1::RegisterRegionRequest reg;
  reg.set_session_id(src.info.session_id());
  *reg.mutable_spec() = src.info.spec();
  v1::RegisterRegionResponse reg_response;
  grpc::ClientContext anonymous_register;
  CHECK(Has(stub->RegisterRegion(&anonymous_register, reg, &reg_response),
            grpc::StatusCode::PERMISSION_DENIED, "session_id"));
  v1::UnregisterRegionRequest unreg;
  unreg.set_region_id(src.id());
  v1::UnregisterRegionResponse unreg_response;
  grpc::ClientContext anonymous_unregister;
  CHECK(Has(stub->UnregisterRegion(&anonymous_unregister, unreg, &unreg_response),
            grpc::StatusCode::PERMISSION_DENIED, "region_id"));
  CHECK(CountWritten(dst) == 0);
}

TEST_CASE("another client can neither use nor control a client's regions and transfers") {
  LiveDaemon live;
  auto other = client::Client::Connect(live.daemon.socket());
  REQUIRE(other.ok());
  Pool src = MakePool(*live.client, Small(), false, "a-src");
  Pool dst = MakePool(*live.client, Small(), true, "a-dst");
  Pool mine = MakePool(**other, Small(), true, "b-dst");
  Pool mine_src = MakePool(**other, Small(), false, "b-src");
  FillPool(src, 3, {1, 2}, 32);

  // Read another's source, write another's destination: refused, naming the side.
  auto read = (*other)->Submit(client::MakeBlockTransfer(src.id(), {1, 2}, mine.id(), {0, 1}));
  CHECK(read.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(read.status().message().find("spec.src.region_id") != std::string::npos);
  auto write = (*other)->Submit(client::MakeBlockTransfer(mine_src.id(), {1}, dst.id(), {0}));
  CHECK(write.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(write.status().message().find("spec.dst.region_id") != std::string::npos);
  // A spec claiming the owner's session is submitted as the caller's anyway.
  v1::TransferSpec spoofed = client::MakeBlockTransfer(src.id(), {1}, mine.id(), {0});
  spoofed.set_session_id(src.info.session_id());
  CHECK((*other)->Submit(spoofed).status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(CountWritten(mine) == 0);
  CHECK(CountWritten(dst) == 0);

  // Unregister, cancel, mark ready, grants and notifications of another session: refused.
  CHECK((*other)->UnregisterRegion(src.id()).code() == absl::StatusCode::kPermissionDenied);
  CHECK((*other)->CreateGrant(src.id(), v1::GRANT_ACCESS_READ).status().code() ==
        absl::StatusCode::kPermissionDenied);
  v1::TransferSpec layerwise = client::MakeBlockTransfer(src.id(), {1}, dst.id(), {3});
  layerwise.set_layerwise(true);
  auto submitted = live.client->Submit(layerwise);
  REQUIRE(submitted.ok());
  const uint64_t id = submitted->transfer_id();
  CHECK((*other)->Cancel(id).status().code() == absl::StatusCode::kPermissionDenied);
  CHECK((*other)->MarkReady(id, 0, 2).code() == absl::StatusCode::kPermissionDenied);
  auto still = live.client->Get(id);
  REQUIRE(still.ok());
  CHECK(still->state() == v1::TRANSFER_STATE_QUEUED);
  auto stub = RawStub("unix:" + live.daemon.socket());
  {
    auto session = wire::SessionConnection::Open(wire::SessionSocketPath(live.daemon.socket()));
    REQUIRE(session.ok());
    grpc::ClientContext context;
    context.AddMetadata(wire::kSessionMetadataKey,
                        wire::SessionMetadataValue((*session)->session_id(), (*session)->secret()));
    v1::NotificationPollRequest poll;
    poll.set_session_id(src.info.session_id());  // the owner's queue
    v1::NotificationPollResponse polled;
    CHECK(Has(stub->PollNotifications(&context, poll, &polled), grpc::StatusCode::PERMISSION_DENIED,
              "session_id"));
  }
  // The owner still can; with its grant the other client reads and nothing else.
  CHECK(live.client->MarkReady(id, 0, 2).ok());
  CHECK(live.client->Wait(id)->state() == v1::TRANSFER_STATE_SUCCEEDED);
  auto grant = live.client->CreateGrant(src.id(), v1::GRANT_ACCESS_READ);
  REQUIRE(grant.ok());
  v1::TransferSpec granted = client::MakeBlockTransfer(src.id(), {1, 2}, mine.id(), {0, 1});
  granted.mutable_src()->set_grant(grant->token());
  CHECK(RunToEnd(**other, granted).state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(mine, Expectation{3, {0, 1}, 32, 0, 0, 2, 0, 0, 2}) == "");
  CHECK((*other)->UnregisterRegion(src.id()).code() == absl::StatusCode::kPermissionDenied);
  CHECK(live.client->UnregisterRegion(src.id()).ok());
}

TEST_CASE("over TCP only the Peer service answers unless the API is opted in") {
  LiveDaemon live({"--tcp-listen", "127.0.0.1:0", "--insecure-peers"});
  const std::string log = live.daemon.ReadLog();
  const std::string marker = "listening on TCP port ";
  const size_t at = log.find(marker);
  REQUIRE(at != std::string::npos);
  int port = 0;
  REQUIRE(absl::SimpleAtoi(log.substr(at + marker.size(), log.find('\n', at) - at - marker.size()),
                           &port));
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto admin = v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  v1::Stats stats;
  CHECK(Has(admin->GetStats(&context, v1::GetStatsRequest(), &stats),
            grpc::StatusCode::PERMISSION_DENIED, "unix socket only"));
  auto transfer = v1::Transfer::NewStub(channel);
  grpc::ClientContext list;
  v1::GetTransferRequest get;
  get.set_transfer_id(1);
  v1::TransferStatus status;
  CHECK(Has(transfer->GetTransfer(&list, get, &status), grpc::StatusCode::PERMISSION_DENIED,
            "tcp_serves_api"));
}

// ExportRegion of `region` to `peer` on `stub`, as `credential` ("" : anonymous).
grpc::Status Export(v1::Transfer::Stub& stub, const std::string& credential, uint64_t region,
                    const std::string& peer, v1::RegionLease* lease) {
  grpc::ClientContext context;
  if (!credential.empty()) context.AddMetadata(wire::kSessionMetadataKey, credential);
  v1::ExportRegionRequest request;
  request.set_region_id(region);
  request.set_peer_node_id(peer);
  return stub.ExportRegion(&context, request, lease);
}

// The lease of `region` as peer `requester` reads it (Peer.GetLease over TCP, with the
// requester's certificate).
grpc::Status LeaseFor(peer_v1::Peer::Stub& peer, uint64_t region, const std::string& requester) {
  grpc::ClientContext context;
  peer_v1::GetLeaseRequest request;
  request.set_region_id(region);
  request.set_requester_node_id(requester);
  v1::RegionLease lease;
  return peer.GetLease(&context, request, &lease);
}

TEST_CASE("only the owner's session exports a region to another node, and only on the socket") {
  // Node "x" with a fabric on a loopback address and peer "y" in its directory (y never runs:
  // the export and the lease are x's alone), peers on mTLS; the API is opted in on TCP, which
  // must not open exports. The TCP caller holds y's certificate.
  TestCa ca;
  REQUIRE(ca.status().ok());
  NsDaemon x;
  NsDaemonOptions options = TlsDaemonOptions(&ca);
  options.extra_config = "tcp_serves_api: true\n";
  const std::string ip = LoopbackIp();
  const bool started = x.Start("", "x", ip, "y", LoopbackIp(), options);
  INFO(x.Log());
  REQUIRE(started);
  auto socket = RawStub("unix:" + x.socket);
  auto tcp = TlsChannel(ip + ":" + std::to_string(x.tcp_port), ca, "x", &ca, "y");
  auto over_tcp = v1::Transfer::NewStub(tcp);
  auto peer = peer_v1::Peer::NewStub(tcp);

  // The owner: a session of its own, its credential sent by hand (a raw stub, any transport).
  auto owner = wire::SessionConnection::Open(wire::SessionSocketPath(x.socket));
  REQUIRE(owner.ok());
  const std::string owner_credential =
      wire::SessionMetadataValue((*owner)->session_id(), (*owner)->secret());
  auto buffer = client::HostBuffer::Create(4096, "export-access");
  REQUIRE(buffer.ok());
  auto token = (*owner)->SendFd((*buffer)->fd());
  REQUIRE(token.ok());
  v1::RegisterRegionRequest reg;
  reg.mutable_spec()->set_memory_kind(v1::MEMORY_KIND_HOST);
  reg.mutable_spec()->set_size_bytes(4096);
  reg.mutable_spec()->set_writable(true);
  reg.mutable_spec()->mutable_bytes();
  reg.mutable_spec()->mutable_share()->set_fd_token(*token);
  v1::RegisterRegionResponse registered;
  {
    grpc::ClientContext context;
    context.AddMetadata(wire::kSessionMetadataKey, owner_credential);
    grpc::Status s = socket->RegisterRegion(&context, reg, &registered);
    INFO(s.error_message());
    REQUIRE(s.ok());
  }
  const uint64_t region = registered.region().region_id();
  v1::RegionLease lease;

  // Another tenant's session (the client library's own credentials): refused, naming region_id.
  auto other = x.client->ExportRegion(region, "y");
  CHECK(other.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(other.status().message().find("region_id") != std::string::npos);
  CHECK(other.status().message().find("another session") != std::string::npos);
  // Anonymous (no credentials) on the socket: refused before the region is looked up, so an
  // unknown id reads the same.
  CHECK(Has(Export(*socket, "", region, "y", &lease), grpc::StatusCode::PERMISSION_DENIED,
            "region_id"));
  CHECK(Has(Export(*socket, "", region + 1000, "y", &lease), grpc::StatusCode::PERMISSION_DENIED,
            "region_id"));
  // Over TCP (tcp_serves_api on): refused, anonymous and with the owner's own credential alike.
  CHECK(Has(Export(*over_tcp, "", region, "y", &lease), grpc::StatusCode::PERMISSION_DENIED,
            "unix socket only"));
  CHECK(Has(Export(*over_tcp, owner_credential, region, "y", &lease),
            grpc::StatusCode::PERMISSION_DENIED, "unix socket only"));
  // A forged credential (the owner's session id, a wrong secret).
  CHECK(Has(Export(*socket, wire::SessionMetadataValue((*owner)->session_id(), "0123456789abcdef"),
                   region, "y", &lease),
            grpc::StatusCode::UNAUTHENTICATED, "kvrail-session"));
  // None of them exported anything: y may not read the lease.
  CHECK(Has(LeaseFor(*peer, region, "y"), grpc::StatusCode::PERMISSION_DENIED,
            "is not exported to 'y'"));

  // The owner on the socket: exported; y reads the lease now.
  grpc::Status exported = Export(*socket, owner_credential, region, "y", &lease);
  INFO(exported.error_message());
  REQUIRE(exported.ok());
  CHECK(lease.region_id() == region);
  CHECK(lease.owner_node_id() == "x");
  CHECK(lease.holder_node_id() == "y");
  CHECK(lease.size_bytes() == 4096);
  CHECK(lease.writable());
  CHECK(LeaseFor(*peer, region, "y").ok());
  // To a node not in the directory, even by the owner: NOT_FOUND naming peer_node_id.
  CHECK(Has(Export(*socket, owner_credential, region, "z", &lease), grpc::StatusCode::NOT_FOUND,
            "peer_node_id"));
}

TEST_CASE(
    "a daemon without a fabric refuses exports: strangers as everywhere, the owner by cause") {
  LiveDaemon live;
  Pool pool = MakePool(*live.client, Small(), true, "no-fabric");
  auto stub = RawStub("unix:" + live.daemon.socket());
  v1::RegionLease lease;
  CHECK(Has(Export(*stub, "", pool.id(), "y", &lease), grpc::StatusCode::PERMISSION_DENIED,
            "region_id"));
  auto other = client::Client::Connect(live.daemon.socket());
  REQUIRE(other.ok());
  CHECK((*other)->ExportRegion(pool.id(), "y").status().code() ==
        absl::StatusCode::kPermissionDenied);
  auto owner = live.client->ExportRegion(pool.id(), "y");
  CHECK(owner.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(owner.status().message().find("peer_node_id") != std::string::npos);
  CHECK(owner.status().message().find("no fabric") != std::string::npos);
}

}  // namespace
}  // namespace kvrail::testing

// Submitting over the session socket ("SUBMIT", wire/session_wire.h): the client's
// default for transfers within the node. The same transfer moves the same bytes; the same bad
// spec gets the same code and message as over gRPC; malformed packets and transfers to other
// nodes are refused there, naming the reason; KVRAIL_SUBMIT_VIA=grpc keeps the client on gRPC.
// WAIT answers like WaitTransfer (pending, bounded, closed early, ended, unknown, malformed);
// CANCEL like CancelTransfer (the submitter's, another tenant's, repeated, unknown, malformed).
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "tests/integration/kv_fixture.h"
#include "wire/session_wire.h"

namespace kvrail::testing {
namespace {

v1::PagedKvLayout Small() {
  return MakeLayout(2, 2, 64, 16, 2, 8, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

// One raw SUBMIT exchange on a fresh session connection; returns the answer packet.
std::string RawSubmit(const LiveDaemon& live, const std::string& payload) {
  auto session = wire::SessionConnection::Open(wire::SessionSocketPath(live.daemon.socket()));
  REQUIRE(session.ok());
  bool sent = false;
  auto answer = (*session)->Exchange(payload, &sent);
  REQUIRE(sent);
  REQUIRE(answer.ok());
  return *answer;
}

// A client of `live` that uses gRPC only (KVRAIL_SUBMIT_VIA=grpc while it connects).
std::unique_ptr<client::Client> GrpcOnlyClient(const LiveDaemon& live) {
  ::setenv("KVRAIL_SUBMIT_VIA", "grpc", 1);
  auto c = client::Client::Connect(live.daemon.socket());
  ::unsetenv("KVRAIL_SUBMIT_VIA");
  REQUIRE(c.ok());
  return *std::move(c);
}

// `spec` with grants of the pools' owner (live.client), for submitters of other sessions (a
// raw session connection, a second client).
v1::TransferSpec Granted(const LiveDaemon& live, v1::TransferSpec spec) {
  auto read = live.client->CreateGrant(spec.src().region_id(), v1::GRANT_ACCESS_READ);
  auto write = live.client->CreateGrant(spec.dst().region_id(), v1::GRANT_ACCESS_WRITE);
  REQUIRE(read.ok());
  REQUIRE(write.ok());
  spec.mutable_src()->set_grant(read->token());
  spec.mutable_dst()->set_grant(write->token());
  return spec;
}

std::string Serialized(const v1::TransferSpec& spec) {
  v1::SubmitTransferRequest request;
  *request.mutable_spec() = spec;
  return request.SerializeAsString();
}

}  // namespace

TEST_CASE("SUBMIT on the session socket moves the transfer like SubmitTransfer") {
  LiveDaemon live;
  Pool src = MakePool(*live.client, Small(), false, "prefill");
  Pool dst = MakePool(*live.client, Small(), true, "decode");
  const std::vector<uint32_t> src_blocks = {3, 9, 1}, dst_blocks = {40, 2, 17};
  FillPool(src, 5, src_blocks, 48);
  // A raw session connection is another session: without grants it may not touch the pools.
  const v1::TransferSpec plain =
      client::MakeBlockTransfer(src.id(), src_blocks, dst.id(), dst_blocks);
  CHECK(RawSubmit(live, "SUBMIT " + Serialized(plain)).rfind("REJECTED 7 spec.src.region_id", 0) ==
        0);
  const std::string answer = RawSubmit(live, "SUBMIT " + Serialized(Granted(live, plain)));
  REQUIRE(answer.rfind("SUBMITTED ", 0) == 0);
  v1::SubmitTransferResponse response;
  REQUIRE(response.ParseFromString(answer.substr(10)));
  REQUIRE(response.transfer_id() != 0);
  auto status = live.client->Wait(response.transfer_id());
  REQUIRE(status.ok());
  REQUIRE(status->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, Expectation{5, dst_blocks, 48, 0, 0, 2, 0, 0, 2}) == "");
}

TEST_CASE("a bad spec gets the same error over the session socket and over gRPC") {
  LiveDaemon live;
  Pool src = MakePool(*live.client, Small(), false, "prefill");
  Pool dst = MakePool(*live.client, Small(), true, "decode");
  v1::TransferSpec bad =
      Granted(live, client::MakeBlockTransfer(src.id(), {1, 99}, dst.id(), {4, 5}));
  const auto via_session = live.client->Submit(bad);  // the client's default: the session
  REQUIRE(!via_session.ok());
  CHECK(via_session.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(via_session.status().message().rfind("spec.src.block_ids[1]: block 99 out of range", 0) ==
        0);
  const std::string raw = RawSubmit(live, "SUBMIT " + Serialized(bad));
  CHECK(raw == "REJECTED 3 " + std::string(via_session.status().message()));

  auto grpc_client = GrpcOnlyClient(live);
  const auto via_grpc = grpc_client->Submit(bad);
  REQUIRE(!via_grpc.ok());
  CHECK(via_grpc.status() == via_session.status());
  // gRPC alone still moves transfers.
  const std::vector<uint32_t> blocks = {7, 8};
  FillPool(src, 2, blocks, 32);
  v1::TransferStatus done = RunToEnd(
      *grpc_client, Granted(live, client::MakeBlockTransfer(src.id(), blocks, dst.id(), blocks)));
  CHECK(done.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, Expectation{2, blocks, 32, 0, 0, 2, 0, 0, 2}) == "");
}

TEST_CASE("malformed SUBMIT packets and transfers to other nodes are refused on the session") {
  LiveDaemon live;
  CHECK(RawSubmit(live, "SUBMIT \xff\xff\xff garbage") ==
        "REJECTED 3 SUBMIT: not a serialized SubmitTransferRequest");
  v1::TransferSpec remote = client::MakeBlockTransfer(1, {1}, 2, {1});
  remote.mutable_dst()->set_node_id("node-b");
  const std::string answer = RawSubmit(live, "SUBMIT " + Serialized(remote));
  CHECK(answer.rfind("REJECTED 9 spec.dst.node_id: 'node-b' is another node", 0) == 0);
  // The session still serves fds after refusals, and the daemon keeps serving.
  auto buffer = live.client->CreateHostBuffer(4096);
  REQUIRE(buffer.ok());
  v1::RegionSpec spec;
  spec.set_name("after");
  CHECK(live.client->RegisterHostBuffer(**buffer, spec).ok());
}

TEST_CASE("WAIT on the session socket answers like WaitTransfer") {
  LiveDaemon live;
  Pool src = MakePool(*live.client, Small(), false, "prefill");
  Pool dst = MakePool(*live.client, Small(), true, "decode");
  const std::vector<uint32_t> blocks = {2, 6};
  FillPool(src, 4, blocks, 32);
  v1::TransferSpec spec = client::MakeBlockTransfer(src.id(), blocks, dst.id(), blocks);
  spec.set_layerwise(true);  // nothing moves until MarkReady: the wait is really pending
  auto submitted = live.client->Submit(spec);
  REQUIRE(submitted.ok());
  const uint64_t id = submitted->transfer_id();

  // A bounded wait on a transfer that cannot end yet returns its current status, as over gRPC.
  auto early = live.client->Wait(id, absl::Milliseconds(50));
  REQUIRE(early.ok());
  CHECK(early->state() < v1::TRANSFER_STATE_SUCCEEDED);

  // A raw WAIT whose connection closes before the transfer ends: nothing is sent, nothing breaks.
  {
    auto session = wire::SessionConnection::Open(wire::SessionSocketPath(live.daemon.socket()));
    REQUIRE(session.ok());
    (*session)->SetAnswerTimeout(absl::Milliseconds(100));
    bool sent = false;
    auto answer = (*session)->Exchange(absl::StrCat("WAIT ", id), &sent);
    CHECK(sent);
    CHECK(answer.status().code() == absl::StatusCode::kDeadlineExceeded);
  }
  REQUIRE(live.client->MarkReady(id, 0, 2).ok());
  auto via_session = live.client->Wait(id);  // the client's default: a session WAIT
  REQUIRE(via_session.ok());
  CHECK(via_session->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(VerifyPool(dst, Expectation{4, blocks, 32, 0, 0, 2, 0, 0, 2}) == "");

  auto grpc_client = GrpcOnlyClient(live);
  auto via_grpc = grpc_client->Wait(id);
  REQUIRE(via_grpc.ok());
  CHECK(via_grpc->SerializeAsString() == via_session->SerializeAsString());

  // A raw WAIT on an ended transfer is answered at once with the same status.
  const std::string done = RawSubmit(live, absl::StrCat("WAIT ", id));
  REQUIRE(done.rfind("DONE ", 0) == 0);
  v1::TransferStatus parsed;
  REQUIRE(parsed.ParseFromString(done.substr(5)));
  CHECK(parsed.SerializeAsString() == via_grpc->SerializeAsString());

  // Unknown ids and malformed waits: the same NOT_FOUND as gRPC, and a named INVALID_ARGUMENT.
  auto missing_grpc = grpc_client->Wait(id + 1000000);
  REQUIRE(!missing_grpc.ok());
  CHECK(RawSubmit(live, absl::StrCat("WAIT ", id + 1000000)) ==
        absl::StrCat("REJECTED 5 ", missing_grpc.status().message()));
  auto missing = live.client->Wait(id + 1000000);
  CHECK(missing.status() == missing_grpc.status());
  CHECK(RawSubmit(live, "WAIT soon").rfind("REJECTED 3 WAIT: want", 0) == 0);
}

TEST_CASE("CANCEL on the session socket answers like CancelTransfer") {
  LiveDaemon live;
  Pool src = MakePool(*live.client, Small(), false, "prefill");
  Pool dst = MakePool(*live.client, Small(), true, "decode");
  const std::vector<uint32_t> blocks = {1, 5};
  FillPool(src, 6, blocks, 32);
  v1::TransferSpec spec = client::MakeBlockTransfer(src.id(), blocks, dst.id(), blocks);
  spec.set_layerwise(true);  // nothing moves until MarkReady: there is something to cancel
  auto submitted = live.client->Submit(spec);
  REQUIRE(submitted.ok());
  const uint64_t id = submitted->transfer_id();

  // Another tenant (a session that owns a region, not a part of this transfer) cancels nothing,
  // refused over the session as over gRPC (the unknown id's NOT_FOUND; as root, which may read
  // every transfer, PERMISSION_DENIED: root cancels only from a session that owns no regions);
  // the transfer goes on.
  auto tenant = client::Client::Connect(live.daemon.socket());
  REQUIRE(tenant.ok());
  Pool own = MakePool(**tenant, Small(), true, "tenant");
  auto grpc_tenant = GrpcOnlyClient(live);
  Pool grpc_own = MakePool(*grpc_tenant, Small(), true, "grpc tenant");
  auto refused = (*tenant)->Cancel(id);
  auto refused_grpc = grpc_tenant->Cancel(id);
  CHECK(refused.status().code() ==
        (::geteuid() == 0 ? absl::StatusCode::kPermissionDenied : absl::StatusCode::kNotFound));
  CHECK(refused.status() == refused_grpc.status());
  auto running = live.client->Get(id);
  REQUIRE(running.ok());
  CHECK(running->state() < v1::TRANSFER_STATE_SUCCEEDED);

  // The submitter's cancel (the client's default: a CANCEL on its session's connection) ends it
  // CANCELLED with nothing written; a second cancel over gRPC answers the same final status.
  auto cancelled = live.client->Cancel(id);
  REQUIRE(cancelled.ok());
  CHECK(cancelled->state() == v1::TRANSFER_STATE_CANCELLED);
  CHECK(cancelled->error_code() == static_cast<int>(absl::StatusCode::kCancelled));
  CHECK(cancelled->spec().src().region_id() == src.id());  // the whole status, spec included
  CHECK(CountWritten(dst) == 0);
  auto again = GrpcOnlyClient(live)->Get(id);
  REQUIRE(again.ok());
  CHECK(again->state() == v1::TRANSFER_STATE_CANCELLED);
  auto repeated = live.client->Cancel(id);
  REQUIRE(repeated.ok());
  CHECK(repeated->SerializeAsString() == cancelled->SerializeAsString());

  // Unknown ids and malformed cancels: the same NOT_FOUND as gRPC, and a named INVALID_ARGUMENT.
  auto missing_grpc = GrpcOnlyClient(live)->Cancel(id + 1000000);
  REQUIRE_FALSE(missing_grpc.ok());
  CHECK(missing_grpc.status().code() == absl::StatusCode::kNotFound);
  CHECK(RawSubmit(live, absl::StrCat("CANCEL ", id + 1000000)) ==
        absl::StrCat("REJECTED 5 ", missing_grpc.status().message()));
  CHECK(live.client->Cancel(id + 1000000).status() == missing_grpc.status());
  CHECK(RawSubmit(live, "CANCEL soon").rfind("REJECTED 3 CANCEL: want", 0) == 0);
  CHECK(RawSubmit(live, absl::StrCat("CANCEL ", id, " 1.secret")).rfind("REJECTED 3", 0) == 0);
  CHECK(live.client->GetStats().ok());  // the daemon serves on
}

// A daemon started with `config` (DaemonConfig text).
std::vector<std::string> ConfigArgs(const TempDir& dir, const std::string& config) {
  const std::string path = dir.path() + "/kvraild.textproto";
  std::ofstream(path) << config;
  return {"--config", path};
}

// A raw session connection to `live` whose greeting was read; receives time out after `wait`.
UniqueFd RawSession(const LiveDaemon& live, int wait_seconds) {
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  REQUIRE(sock.valid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = wire::SessionSocketPath(live.daemon.socket());
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  REQUIRE(::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  timeval tv{wait_seconds, 0};
  ::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  REQUIRE(wire::ReceivePacket(sock.get()).ok());  // the SESSION greeting
  return sock;
}

// Returns once kvraild has read every packet sent on `fd` so far: a malformed WAIT is answered at
// once, and a connection's packets are read in order. kvraild serves its connections in turns,
// one packet each, so WAITs sent on two connections are registered interleaved unless the first
// connection's are known to be in.
void AwaitRead(int fd) {
  REQUIRE(wire::SendPacket(fd, "WAIT soon").ok());
  auto answer = wire::ReceivePacket(fd);
  REQUIRE(answer.ok());
  REQUIRE(answer->rfind("REJECTED 3 WAIT: want", 0) == 0);
}

TEST_CASE("WAIT: pending WAITs are capped per connection and per uid, closed connections too",
          "[wait_caps]") {
  // One connection used to hold any number of WAITs (4,096 per transfer, for every transfer it
  // could read: millions pending, hundreds of MB). Now: max_watchers_per_session per connection,
  // max_watchers_per_uid for all of one uid's, counted until the transfer ends.
  TempDir config_dir;
  LiveDaemon live(
      ConfigArgs(config_dir, "max_watchers_per_session: 8\nmax_watchers_per_uid: 20\n"));
  Pool src = MakePool(*live.client, Small(), false, "prefill");
  Pool dst = MakePool(*live.client, Small(), true, "decode");
  v1::TransferSpec spec = client::MakeBlockTransfer(src.id(), {1}, dst.id(), {1});
  spec.set_layerwise(true);
  auto submitted = live.client->Submit(spec);
  REQUIRE(submitted.ok());
  const uint64_t id = submitted->transfer_id();
  // Raw connections are other sessions of the test's uid, kvraild's own: the operator reads
  // every transfer, so each may wait for it.
  const std::string wait = absl::StrCat("WAIT ", id);

  UniqueFd a = RawSession(live, 2);
  for (int i = 0; i < 9; ++i) REQUIRE(wire::SendPacket(a.get(), wait).ok());
  auto refused = wire::ReceivePacket(a.get());
  REQUIRE(refused.ok());  // before the caps: nothing came (all nine were pending)
  CHECK(refused->rfind("REJECTED 8 max_watchers_per_session: this connection has 8", 0) == 0);

  UniqueFd b = RawSession(live, 2);
  for (int i = 0; i < 8; ++i) REQUIRE(wire::SendPacket(b.get(), wait).ok());
  AwaitRead(b.get());  // b holds 8: the uid's places 17 to 20 are c's
  UniqueFd c = RawSession(live, 2);
  for (int i = 0; i < 5; ++i) REQUIRE(wire::SendPacket(c.get(), wait).ok());
  refused = wire::ReceivePacket(c.get());
  REQUIRE(refused.ok());
  CHECK(refused->rfind("REJECTED 8 max_watchers_per_uid: uid ", 0) == 0);
  CHECK(refused->find(" has 20 WAITs pending") != std::string::npos);

  // Closing connections frees no place while their transfer runs (their WAITs stay with it).
  b = UniqueFd();
  c = UniqueFd();
  UniqueFd d = RawSession(live, 2);
  REQUIRE(wire::SendPacket(d.get(), wait).ok());
  refused = wire::ReceivePacket(d.get());
  REQUIRE(refused.ok());
  CHECK(refused->rfind("REJECTED 8 max_watchers_per_uid: uid ", 0) == 0);

  // The transfer ends: a's eight WAITs are answered, every place comes back.
  REQUIRE(live.client->MarkReady(id, 0, 2).ok());
  for (int i = 0; i < 8; ++i) {
    auto done = wire::ReceivePacket(a.get());
    REQUIRE(done.ok());
    CHECK(done->rfind("DONE ", 0) == 0);
  }
  for (UniqueFd* conn : {&a, &d}) {
    for (int i = 0; i < 8; ++i) REQUIRE(wire::SendPacket(conn->get(), wait).ok());
    for (int i = 0; i < 8; ++i) {
      auto done = wire::ReceivePacket(conn->get());
      REQUIRE(done.ok());
      CHECK(done->rfind("DONE ", 0) == 0);
    }
  }
  auto status = live.client->Wait(id);
  REQUIRE(status.ok());
  CHECK(status->state() == v1::TRANSFER_STATE_SUCCEEDED);
}

TEST_CASE("WAIT: a transfer keeps at most kMaxWhenEnded waiters; the rest are refused at once") {
  // The per-connection and per-uid caps raised above the transfer's own.
  TempDir config_dir;
  LiveDaemon live(
      ConfigArgs(config_dir, "max_watchers_per_session: 8192\nmax_watchers_per_uid: 8192\n"));
  Pool src = MakePool(*live.client, Small(), false, "prefill");
  Pool dst = MakePool(*live.client, Small(), true, "decode");
  v1::TransferSpec spec = client::MakeBlockTransfer(src.id(), {1}, dst.id(), {1});
  spec.set_layerwise(true);
  auto submitted = live.client->Submit(spec);
  REQUIRE(submitted.ok());
  const uint64_t id = submitted->transfer_id();

  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  REQUIRE(sock.valid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = wire::SessionSocketPath(live.daemon.socket());
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  REQUIRE(::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  timeval tv{10, 0};
  ::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  REQUIRE(wire::ReceivePacket(sock.get()).ok());  // the SESSION greeting
  const std::string wait = absl::StrCat("WAIT ", id);
  constexpr int kMax = 4096;  // transfers::Record::kMaxWhenEnded
  for (int i = 0; i <= kMax; ++i) REQUIRE(wire::SendPacket(sock.get(), wait).ok());
  auto refused = wire::ReceivePacket(sock.get());
  REQUIRE(refused.ok());
  CHECK(refused->rfind("REJECTED 8 transfer ", 0) == 0);
  CHECK(refused->find("already has 4096 waiters") != std::string::npos);

  // The transfer still ends normally; the pending waiters are answered (as far as the socket
  // buffer takes them) and the daemon keeps serving after the connection goes away.
  REQUIRE(live.client->MarkReady(id, 0, 2).ok());
  auto done = wire::ReceivePacket(sock.get());
  REQUIRE(done.ok());
  CHECK(done->rfind("DONE ", 0) == 0);
  sock = UniqueFd();
  auto status = live.client->Wait(id);
  REQUIRE(status.ok());
  CHECK(status->state() == v1::TRANSFER_STATE_SUCCEEDED);
}

}  // namespace kvrail::testing

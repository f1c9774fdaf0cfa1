// libFuzzer target: the messages a peer daemon sends (the Peer gRPC service, daemon/fabric).
// One in-process fabric (tcp;ofi_rxm on 127.0.0.1, one NIC) whose directory names one peer,
// "peer-a", serves its Peer service on a unix socket in this process; a host region of a local
// session is exported to peer-a. Each input is a sequence of calls as peer-a (or as anyone):
//   op byte (low 3 bits: Hello, Heartbeat, GetLease, BeginRemoteTransfer, EndRemoteTransfer,
//   AbortRemoteTransfer, ExportRegion; bit 3: the message alone instead of merged over a valid
//   template), a 2-byte little-endian length, then that many bytes of serialized protobuf.
// The valid templates (a hello that introduces peer-a, a Begin that plans against the exported
// region, End/Abort naming the last handle) let the fuzzer reach deep states; the merge lets it
// change any field. Whatever the calls, the daemon must answer each (no crash, no hang, ASan and
// UBSan quiet), and every inbound transfer begun in an input is aborted at its end.
#include <fcntl.h>
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/unique_fd.h"
#include "daemon/access/access.h"
#include "daemon/directory/directory.h"
#include "daemon/fabric/fabric.h"
#include "daemon/planner/planner.h"
#include "daemon/regions/regions.h"
#include "daemon/sessions/sessions.h"
#include "proto/kvrail/v1/peer.grpc.pb.h"
#include "spdlog/spdlog.h"
#include "wire/session_wire.h"

namespace {

namespace v1 = kvrail::v1;

void Check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "peer_fuzzer: %s\n", what);
    __builtin_trap();
  }
}

constexpr uint32_t kSlots = 4;
constexpr uint64_t kSlotBytes = 64 << 10;

v1::PagedKvLayout Layout() {
  v1::PagedKvLayout p;
  p.set_num_layers(2);
  p.set_num_parts(2);
  p.set_num_blocks(16);
  p.set_tokens_per_block(4);
  p.set_num_heads(2);
  p.set_head_dim(16);
  p.set_dtype(v1::DTYPE_BF16);
  p.set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  return p;
}

struct Daemon {
  std::string dir;
  std::unique_ptr<kvrail::sessions::SessionTable> sessions;
  std::unique_ptr<kvrail::regions::RegionTable> regions;
  std::unique_ptr<kvrail::access::Grants> grants;
  std::unique_ptr<kvrail::directory::Directory> directory;
  std::unique_ptr<kvrail::fabric::Fabric> fabric;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::Peer::Stub> stub;
  uint64_t session = 0;
  std::string metadata;  // the owner's kvrail-session credential
  uint64_t region_id = 0;
  uint64_t region_size = 0;
  v1::HelloRequest hello;
  v1::BeginRemoteTransferRequest begin;

  Daemon() {
    spdlog::set_level(spdlog::level::off);
    google::protobuf::SetLogHandler(nullptr);  // fuzzed strings that are not UTF-8: no log spam
    char tmpl[] = "/tmp/kvrail-fuzz-peer.XXXXXX";
    Check(::mkdtemp(tmpl) != nullptr, "mkdtemp");
    dir = tmpl;
    sessions = kvrail::sessions::SessionTable::Create();
    regions = kvrail::regions::RegionTable::Create(kvrail::Clock::Real(), sessions.get());
    grants = kvrail::access::Grants::Create(kvrail::Clock::Real(), sessions.get(), regions.get());
    directory = kvrail::directory::CreateStaticDirectory({{"peer-a", "127.0.0.1:9"}}, "node-fuzz");
    kvrail::fabric::FabricOptions options;
    options.node_id = "node-fuzz";
    options.nic_addresses = {"127.0.0.1"};
    options.slots = kSlots;
    options.slot_bytes = kSlotBytes;
    options.pack_threads = 1;
    options.unpack_threads = 1;
    auto created = kvrail::fabric::Fabric::Create(options, sessions.get(), regions.get(),
                                                  grants.get(), directory.get());
    if (!created.ok()) fprintf(stderr, "%s\n", created.status().ToString().c_str());
    Check(created.ok(), "fabric");
    fabric = *std::move(created);

    // The destination: a host region of a local session.
    session = sessions->BeginSession();
    metadata = kvrail::wire::SessionMetadataValue(session, sessions->SessionSecret(session));
    v1::RegionSpec spec;
    *spec.mutable_paged_kv() = Layout();
    absl::StatusOr<kvrail::planner::KvLayout> k =
        kvrail::planner::ResolveLayout(spec.paged_kv(), UINT64_MAX, "");
    if (!k.ok()) fprintf(stderr, "%s\n", k.status().ToString().c_str());
    Check(k.ok(), "layout");
    region_size = k->offset + k->layer_stride * k->num_layers;
    kvrail::UniqueFd fd(::memfd_create("peer_fuzzer", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    Check(fd.valid() && ::ftruncate(fd.get(), region_size) == 0, "memfd");
    auto token = sessions->AddFd(session, std::move(fd));
    Check(token.ok(), "token");
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
    spec.set_size_bytes(region_size);
    spec.set_writable(true);
    spec.mutable_share()->set_fd_token(*token);
    auto region = regions->Register(spec, session);
    if (!region.ok()) fprintf(stderr, "%s\n", region.status().ToString().c_str());
    Check(region.ok(), "register");
    region_id = (*region)->id();
    // The owner's write grant, which a Begin needs beside the export (spec.dst.grant).
    v1::CreateGrantRequest grant_request;
    grant_request.set_region_id(region_id);
    grant_request.set_access(v1::GRANT_ACCESS_WRITE);
    kvrail::sessions::Caller owner;
    owner.session_id = session;
    auto granted = grants->CreateGrant(grant_request, owner);
    Check(granted.ok(), "grant");

    grpc::ServerBuilder builder;
    const std::string address = "unix:" + dir + "/peer.sock";
    builder.AddListeningPort(address, grpc::InsecureServerCredentials());
    builder.RegisterService(fabric->peer_service());
    server = builder.BuildAndStart();
    Check(server != nullptr, "server");
    stub = v1::Peer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));

    // Exported to peer-a by its owner.
    v1::ExportRegionRequest exp;
    exp.set_region_id(region_id);
    exp.set_peer_node_id("peer-a");
    v1::RegionLease lease;
    auto ctx = Context(true);
    grpc::Status s = stub->ExportRegion(ctx.get(), exp, &lease);
    if (!s.ok()) fprintf(stderr, "%s\n", s.error_message().c_str());
    Check(s.ok(), "export");

    // peer-a's hello: its NIC at some loopback port (nothing is ever sent there).
    v1::PeerHello* h = hello.mutable_hello();
    h->set_version(1);
    h->set_node_id("peer-a");
    h->set_boot_id(7);
    h->set_provider("tcp;ofi_rxm");
    v1::PeerNic* nic = h->add_nics();
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(9);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    nic->set_name("nic0");
    nic->set_fabric_address(std::string(reinterpret_cast<const char*>(&sin), sizeof(sin)));
    nic->set_mr_key(1);
    nic->set_recv_base(4096);
    nic->set_credit_base(8192);
    h->set_slots(kSlots);
    h->set_slot_bytes(kSlotBytes);
    h->set_your_index(0);

    // A Begin that plans: layer 0..1, 8 tokens from remote blocks {3,1} into local {5,6}.
    begin.set_sender_node_id("peer-a");
    begin.set_sender_boot_id(7);
    begin.set_sender_transfer_id(1);
    v1::TransferSpec* t = begin.mutable_spec();
    t->mutable_src()->set_region_id(99);
    t->mutable_src()->add_block_ids(3);
    t->mutable_src()->add_block_ids(1);
    t->mutable_dst()->set_region_id(region_id);
    t->mutable_dst()->set_grant(granted->token());
    t->mutable_dst()->add_block_ids(5);
    t->mutable_dst()->add_block_ids(6);
    begin.mutable_source()->set_size_bytes(region_size);
    *begin.mutable_source()->mutable_paged_kv() = Layout();
    begin.set_tile_bytes(4096);
    kvrail::planner::RegionView src_view{region_size, false, true, *k};
    kvrail::planner::RegionView dst_view{region_size, true, true, *k};
    kvrail::planner::PlanOptions po;
    po.tile_bytes = 4096;
    auto plan = kvrail::planner::MakePlan(*t, src_view, dst_view, po);
    Check(plan.ok(), "template plan");
    begin.set_bytes_total(plan->bytes_total());
    begin.set_tiles_total(plan->num_tiles());

    // The templates work: peer-a is introduced and a transfer begins and aborts.
    v1::HelloResponse hr;
    auto c1 = Context(false);
    s = stub->Hello(c1.get(), hello, &hr);
    if (!s.ok()) fprintf(stderr, "%s\n", s.error_message().c_str());
    Check(s.ok(), "template hello");
    v1::BeginRemoteTransferResponse br;
    auto c2 = Context(false);
    s = stub->BeginRemoteTransfer(c2.get(), begin, &br);
    if (!s.ok()) fprintf(stderr, "%s\n", s.error_message().c_str());
    Check(s.ok(), "template begin");
    v1::AbortRemoteTransferRequest abort;
    abort.set_sender_node_id("peer-a");
    abort.set_handle(br.handle());
    v1::EndRemoteTransferResponse er;
    auto c3 = Context(false);
    Check(stub->AbortRemoteTransfer(c3.get(), abort, &er).ok(), "template abort");
  }

  // Stops in kvraild's order (server, then the fabric's threads, then the regions), so no
  // fabric thread outlives what it uses when the process exits.
  ~Daemon() {
    server->Shutdown();
    server.reset();
    stub.reset();
    fabric.reset();
    directory.reset();
    grants.reset();
    regions.reset();
    sessions.reset();
  }

  std::unique_ptr<grpc::ClientContext> Context(bool as_owner) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (as_owner) ctx->AddMetadata(kvrail::wire::kSessionMetadataKey, metadata);
    return ctx;
  }
};

// A call that does not answer within its deadline is a hang: a finding.
void CheckAnswered(const grpc::Status& s) {
  Check(s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
            s.error_code() != grpc::StatusCode::UNAVAILABLE,
        "a call was not answered");
  if (!s.ok()) Check(!s.error_message().empty(), "an error without a message");
}

template <typename M>
bool Build(const M& tmpl, bool raw, const uint8_t* p, size_t n, M* out) {
  M fuzz;
  if (!fuzz.ParseFromArray(p, static_cast<int>(n))) return false;
  if (raw) {
    *out = fuzz;
  } else {
    *out = tmpl;
    out->MergeFrom(fuzz);
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Daemon* d = [] {
    Daemon* daemon = new Daemon();
    // libFuzzer ends with exit(): stop the daemon first (handlers run before the destructors of
    // statics constructed earlier), not under its running threads.
    std::atexit([] { delete d; });
    return daemon;
  }();
  std::vector<uint32_t> handles;
  uint32_t last_handle = 0;
  int calls = 0;
  while (size >= 3 && calls < 16) {
    const uint8_t op = data[0];
    const size_t len = std::min<size_t>(data[1] | (data[2] << 8), size - 3);
    const uint8_t* body = data + 3;
    data += 3 + len;
    size -= 3 + len;
    ++calls;
    const bool raw = (op & 8) != 0;
    auto ctx = d->Context(op % 7 == 6);
    grpc::Status s;
    switch (op % 7) {
      case 0: {
        v1::HelloRequest req;
        v1::HelloResponse resp;
        if (!Build(d->hello, raw, body, len, &req)) continue;
        s = d->stub->Hello(ctx.get(), req, &resp);
        break;
      }
      case 1: {
        v1::HeartbeatRequest tmpl, req;
        tmpl.set_node_id("peer-a");
        tmpl.set_boot_id(7);
        v1::HeartbeatResponse resp;
        if (!Build(tmpl, raw, body, len, &req)) continue;
        s = d->stub->Heartbeat(ctx.get(), req, &resp);
        break;
      }
      case 2: {
        v1::GetLeaseRequest tmpl, req;
        tmpl.set_region_id(d->region_id);
        tmpl.set_requester_node_id("peer-a");
        v1::RegionLease resp;
        if (!Build(tmpl, raw, body, len, &req)) continue;
        s = d->stub->GetLease(ctx.get(), req, &resp);
        break;
      }
      case 3: {
        v1::BeginRemoteTransferRequest req;
        v1::BeginRemoteTransferResponse resp;
        if (!Build(d->begin, raw, body, len, &req)) continue;
        s = d->stub->BeginRemoteTransfer(ctx.get(), req, &resp);
        if (s.ok()) {
          handles.push_back(resp.handle());
          last_handle = resp.handle();
        }
        break;
      }
      case 4: {
        v1::EndRemoteTransferRequest tmpl, req;
        tmpl.set_sender_node_id("peer-a");
        tmpl.set_handle(last_handle);
        v1::EndRemoteTransferResponse resp;
        if (!Build(tmpl, raw, body, len, &req)) continue;
        s = d->stub->EndRemoteTransfer(ctx.get(), req, &resp);
        break;
      }
      case 5: {
        v1::AbortRemoteTransferRequest tmpl, req;
        tmpl.set_sender_node_id("peer-a");
        tmpl.set_handle(last_handle);
        tmpl.set_error_message("fuzz");
        v1::EndRemoteTransferResponse resp;
        if (!Build(tmpl, raw, body, len, &req)) continue;
        s = d->stub->AbortRemoteTransfer(ctx.get(), req, &resp);
        break;
      }
      default: {
        v1::ExportRegionRequest tmpl, req;
        tmpl.set_region_id(d->region_id);
        tmpl.set_peer_node_id("peer-a");
        v1::RegionLease resp;
        if (!Build(tmpl, raw, body, len, &req)) continue;
        s = d->stub->ExportRegion(ctx.get(), req, &resp);
        break;
      }
    }
    CheckAnswered(s);
  }
  // Abort whatever this input began (an already ended handle answers NOT_FOUND).
  for (uint32_t h : handles) {
    v1::AbortRemoteTransferRequest req;
    req.set_sender_node_id("peer-a");
    req.set_handle(h);
    v1::EndRemoteTransferResponse resp;
    auto ctx = d->Context(false);
    CheckAnswered(d->stub->AbortRemoteTransfer(ctx.get(), req, &resp));
  }
  return 0;
}

// libFuzzer target: the messages a peer daemon sends (the Peer gRPC service, daemon/fabric).
// One in-process fabric (tcp;ofi_rxm on 127.0.0.1, one NIC) whose directory names one peer,
// "peer-a", serves its Peer service through the daemon's server on a unix socket in this process
// (fuzz_daemon.h); a host region of a local session is exported to peer-a by its owner
// (Transfer.ExportRegion, fuzzed in transfer_service_fuzzer). Each input is a sequence of calls
// as peer-a (or as anyone):
//   op byte (op % 6: Hello, Heartbeat, GetLease, BeginRemoteTransfer, EndRemoteTransfer,
//   AbortRemoteTransfer; bit 3: the message alone instead of merged over a valid template), a
//   2-byte little-endian length, then that many bytes of serialized protobuf.
// The valid templates (a hello that introduces peer-a, a Begin that plans against the exported
// region, End/Abort naming the last handle) let the fuzzer reach deep states; the merge lets it
// change any field. Whatever the calls, the daemon must answer each (no crash, no hang, ASan and
// UBSan quiet), and every inbound transfer begun in an input is aborted at its end.
#include <netinet/in.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "daemon/planner/planner.h"
#include "proto/kvrail/peer/v1/peer.grpc.pb.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "tests/fuzz/fuzz_daemon.h"

namespace {

namespace v1 = kvrail::v1;
namespace peer_v1 = kvrail::peer::v1;
using kvrail::fuzz::Build;
using kvrail::fuzz::Check;
using kvrail::fuzz::CheckAnswered;

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

kvrail::fuzz::FuzzDaemonOptions DaemonOptions() {
  kvrail::fuzz::FuzzDaemonOptions options;
  options.name = "peer";
  options.fabric = true;
  options.slots = kSlots;
  options.slot_bytes = kSlotBytes;
  return options;
}

// The daemon, the owner's paged destination exported to peer-a, and the templates. The stub goes
// before the daemon (declared after it).
struct Daemon {
  kvrail::fuzz::FuzzDaemon daemon{DaemonOptions()};
  std::unique_ptr<peer_v1::Peer::Stub> stub = peer_v1::Peer::NewStub(daemon.channel());
  uint64_t session = 0;
  uint64_t region_id = 0;
  uint64_t region_size = 0;
  peer_v1::HelloRequest hello;
  peer_v1::BeginRemoteTransferRequest begin;

  Daemon() {
    // The destination: a host region of a local session.
    session = daemon.OpenSession();
    v1::RegionSpec spec;
    *spec.mutable_paged_kv() = Layout();
    absl::StatusOr<kvrail::planner::KvLayout> k =
        kvrail::planner::ResolveLayout(spec.paged_kv(), UINT64_MAX, "");
    if (!k.ok()) fprintf(stderr, "%s\n", k.status().ToString().c_str());
    Check(k.ok(), "layout");
    region_size = k->offset + k->layer_stride * k->num_layers;
    spec.set_size_bytes(region_size);
    spec.set_writable(true);
    region_id = daemon.RegisterHostRegion(session, spec);
    // The owner's write grant, which a Begin needs beside the export (spec.dst.grant).
    const v1::Grant granted = daemon.Grant(session, region_id, v1::GRANT_ACCESS_WRITE);

    // Exported to peer-a by its owner, as kvraild's clients do it.
    v1::ExportRegionRequest exp;
    exp.set_region_id(region_id);
    exp.set_peer_node_id(kvrail::fuzz::kPeerNode);
    v1::RegionLease lease;
    auto ctx = daemon.Context(daemon.Credential(session));
    grpc::Status s = v1::Transfer::NewStub(daemon.channel())->ExportRegion(ctx.get(), exp, &lease);
    if (!s.ok()) fprintf(stderr, "%s\n", s.error_message().c_str());
    Check(s.ok(), "export");

    // peer-a's hello: its NIC at some loopback port (nothing is ever sent there).
    peer_v1::PeerHello* h = hello.mutable_hello();
    h->set_version(1);
    h->set_node_id("peer-a");
    h->set_boot_id(7);
    h->set_provider("tcp;ofi_rxm");
    peer_v1::PeerNic* nic = h->add_nics();
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
    t->mutable_dst()->set_grant(granted.token());
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
    peer_v1::HelloResponse hr;
    auto c1 = Context();
    s = stub->Hello(c1.get(), hello, &hr);
    if (!s.ok()) fprintf(stderr, "%s\n", s.error_message().c_str());
    Check(s.ok(), "template hello");
    peer_v1::BeginRemoteTransferResponse br;
    auto c2 = Context();
    s = stub->BeginRemoteTransfer(c2.get(), begin, &br);
    if (!s.ok()) fprintf(stderr, "%s\n", s.error_message().c_str());
    Check(s.ok(), "template begin");
    peer_v1::AbortRemoteTransferRequest abort;
    abort.set_sender_node_id("peer-a");
    abort.set_handle(br.handle());
    peer_v1::EndRemoteTransferResponse er;
    auto c3 = Context();
    Check(stub->AbortRemoteTransfer(c3.get(), abort, &er).ok(), "template abort");
  }

  // Peer calls carry no session credentials.
  std::unique_ptr<grpc::ClientContext> Context() { return daemon.Context(""); }
};

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
    auto ctx = d->Context();
    grpc::Status s;
    switch (op % 6) {
      case 0: {
        peer_v1::HelloRequest req;
        peer_v1::HelloResponse resp;
        if (!Build(d->hello, raw, body, len, &req)) continue;
        s = d->stub->Hello(ctx.get(), req, &resp);
        break;
      }
      case 1: {
        peer_v1::HeartbeatRequest tmpl, req;
        tmpl.set_node_id("peer-a");
        tmpl.set_boot_id(7);
        peer_v1::HeartbeatResponse resp;
        if (!Build(tmpl, raw, body, len, &req)) continue;
        s = d->stub->Heartbeat(ctx.get(), req, &resp);
        break;
      }
      case 2: {
        peer_v1::GetLeaseRequest tmpl, req;
        tmpl.set_region_id(d->region_id);
        tmpl.set_requester_node_id("peer-a");
        v1::RegionLease resp;
        if (!Build(tmpl, raw, body, len, &req)) continue;
        s = d->stub->GetLease(ctx.get(), req, &resp);
        break;
      }
      case 3: {
        peer_v1::BeginRemoteTransferRequest req;
        peer_v1::BeginRemoteTransferResponse resp;
        if (!Build(d->begin, raw, body, len, &req)) continue;
        s = d->stub->BeginRemoteTransfer(ctx.get(), req, &resp);
        if (s.ok()) {
          handles.push_back(resp.handle());
          last_handle = resp.handle();
        }
        break;
      }
      case 4: {
        peer_v1::EndRemoteTransferRequest tmpl, req;
        tmpl.set_sender_node_id("peer-a");
        tmpl.set_handle(last_handle);
        peer_v1::EndRemoteTransferResponse resp;
        if (!Build(tmpl, raw, body, len, &req)) continue;
        s = d->stub->EndRemoteTransfer(ctx.get(), req, &resp);
        break;
      }
      default: {
        peer_v1::AbortRemoteTransferRequest tmpl, req;
        tmpl.set_sender_node_id("peer-a");
        tmpl.set_handle(last_handle);
        tmpl.set_error_message("fuzz");
        peer_v1::EndRemoteTransferResponse resp;
        if (!Build(tmpl, raw, body, len, &req)) continue;
        s = d->stub->AbortRemoteTransfer(ctx.get(), req, &resp);
        break;
      }
    }
    CheckAnswered(s);
  }
  // Abort whatever this input began (an already ended handle answers NOT_FOUND).
  for (uint32_t h : handles) {
    peer_v1::AbortRemoteTransferRequest req;
    req.set_sender_node_id("peer-a");
    req.set_handle(h);
    peer_v1::EndRemoteTransferResponse resp;
    auto ctx = d->Context();
    CheckAnswered(d->stub->AbortRemoteTransfer(ctx.get(), req, &resp));
  }
  return 0;
}

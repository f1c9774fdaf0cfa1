// The receiver's handling of arrivals (receiver.h): immediate data is forgeable, so an arrival is
// applied or credited only when the seal in the named peer's receive slot shows that peer wrote
// it. Here a real receiver over real lanes (tcp;ofi_rxm on 127.0.0.1, proxies not started: the
// test is the NIC, writing into receive slots and handing arrivals to OnArrival) with two peers,
// "peer-a" and "peer-c", each with an inbound transfer into an exported host region. What is
// checked is each peer's slot accounting: the consume counters and the credits queued for the
// lane's proxy (what the sender would see).
#include "daemon/fabric/receiver.h"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/unique_fd.h"
#include "daemon/access/access.h"
#include "daemon/directory/directory.h"
#include "daemon/fabric/command_ring.h"
#include "daemon/fabric/imm_data.h"
#include "daemon/fabric/lanes.h"
#include "daemon/fabric/leases.h"
#include "daemon/fabric/peers.h"
#include "daemon/fabric/tile_pack.h"
#include "daemon/planner/planner.h"
#include "daemon/regions/regions.h"
#include "daemon/sessions/sessions.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

namespace {

constexpr uint32_t kSlots = 4;
constexpr uint64_t kSlotBytes = 64 << 10;
constexpr uint64_t kBoot = 7;

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

// One receiving daemon ("node-b") without its gRPC side. Thread-compatible.
struct Rig {
  std::unique_ptr<sessions::SessionTable> session_table = sessions::SessionTable::Create();
  std::unique_ptr<regions::RegionTable> regions =
      regions::RegionTable::Create(Clock::Real(), session_table.get());
  std::unique_ptr<access::Grants> grants =
      access::Grants::Create(Clock::Real(), session_table.get(), regions.get());
  FabricOptions options;
  PeerTable peers;
  std::unique_ptr<Lanes> lanes;
  std::unique_ptr<Leases> leases;
  std::unique_ptr<Receiver> receiver;
  planner::KvLayout layout;
  uint64_t region_size = 0;
  std::shared_ptr<regions::Region> dst;
  std::string grant;  // the owner's write grant of dst
  PeerConn* a = nullptr;
  PeerConn* c = nullptr;
  std::vector<uint8_t> source;  // the senders' source region (same layout)
  uint64_t nonce = 1;

  Rig() {
    options.node_id = "node-b";
    options.nic_addresses = {"127.0.0.1"};
    options.slots = kSlots;
    options.slot_bytes = kSlotBytes;
    options.unpack_threads = 1;  // arrivals are handled in order
    auto made = Lanes::Create(options, &peers);
    if (!made.ok()) FAIL(made.status().ToString());
    lanes = *std::move(made);
    for (const char* node : {"peer-a", "peer-c"}) {
      directory::Peer p;
      p.node_id = node;
      p.address = "127.0.0.1:9";
      auto added = peers.Add(p, [this](PeerConn* conn) { return lanes->AddPeer(conn); });
      if (!added.ok()) FAIL(added.status().ToString());
      absl::MutexLock lock(&(*added)->mu);
      (*added)->introduced = true;  // as after its Hello
      (*added)->boot_id = kBoot;
    }
    a = peers.Find("peer-a");
    c = peers.Find("peer-c");
    REQUIRE(a != nullptr);
    REQUIRE(c != nullptr);
    leases = std::make_unique<Leases>(options.node_id, regions.get(), &peers);
    receiver =
        Receiver::Create(options, lanes.get(), &peers, leases.get(), regions.get(), grants.get());

    auto k = planner::ResolveLayout(Layout(), UINT64_MAX, "");
    REQUIRE(k.ok());
    layout = *k;
    region_size = k->offset + k->layer_stride * k->num_layers;
    const uint64_t session = session_table->BeginSession();
    UniqueFd fd(::memfd_create("receiver_test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    REQUIRE((fd.valid() && ::ftruncate(fd.get(), static_cast<off_t>(region_size)) == 0));
    auto token = session_table->AddFd(session, std::move(fd));
    REQUIRE(token.ok());
    v1::RegionSpec spec;
    *spec.mutable_paged_kv() = Layout();
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
    spec.set_size_bytes(region_size);
    spec.set_writable(true);
    spec.mutable_share()->set_fd_token(*token);
    auto region = regions->Register(spec, session);
    REQUIRE(region.ok());
    dst = *region;
    // The owner's write grant, which the receiver checks beside the export (spec.dst.grant).
    v1::CreateGrantRequest grant_request;
    grant_request.set_region_id(dst->id());
    grant_request.set_access(v1::GRANT_ACCESS_WRITE);
    sessions::Caller owner;
    owner.session_id = session;
    auto granted = grants->CreateGrant(grant_request, owner);
    REQUIRE(granted.ok());
    grant = granted->token();
    REQUIRE(leases->Export(dst->id(), "peer-a").ok());
    REQUIRE(leases->Export(dst->id(), "peer-c").ok());
    source.resize(region_size);
    for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 131 + 7);
  }
  ~Rig() {
    receiver->Stop();
    lanes->Stop();
  }

  peer_v1::BeginRemoteTransferRequest BeginRequest(const std::string& sender) const {
    peer_v1::BeginRemoteTransferRequest begin;
    begin.set_sender_node_id(sender);
    begin.set_sender_boot_id(kBoot);
    begin.set_sender_transfer_id(1);
    v1::TransferSpec* t = begin.mutable_spec();
    t->mutable_src()->set_region_id(99);
    t->mutable_src()->add_block_ids(3);
    t->mutable_src()->add_block_ids(1);
    t->mutable_dst()->set_region_id(dst->id());
    t->mutable_dst()->set_grant(grant);
    t->mutable_dst()->add_block_ids(5);
    t->mutable_dst()->add_block_ids(6);
    begin.mutable_source()->set_size_bytes(region_size);
    *begin.mutable_source()->mutable_paged_kv() = Layout();
    begin.set_tile_bytes(4096);
    auto plan = Plan(begin);
    begin.set_bytes_total(plan.bytes_total());
    begin.set_tiles_total(plan.num_tiles());
    return begin;
  }
  planner::Plan Plan(const peer_v1::BeginRemoteTransferRequest& begin) const {
    planner::RegionView view{region_size, true, true, layout};
    planner::PlanOptions po;
    po.tile_bytes = begin.tile_bytes();
    auto plan = planner::MakePlan(begin.spec(), view, view, po);
    if (!plan.ok()) FAIL(plan.status().ToString());
    return *std::move(plan);
  }
  uint32_t Begin(const std::string& sender) {
    peer_v1::BeginRemoteTransferResponse response;
    const absl::Status begun = receiver->Begin(BeginRequest(sender), &response);
    if (!begun.ok()) FAIL(begun.ToString());
    return response.handle();
  }

  // What `peer` really does: its tile's bytes and then its seal (its registration's key, a fresh
  // nonce) into its own receive slot, as its RMA write would.
  // `generation`: the one the peer was told for its index (its seals carry it).
  void WriteTile(PeerConn* peer, const planner::Plan& plan, uint32_t handle, uint32_t slot,
                 uint32_t tile, std::optional<uint32_t> generation = std::nullopt) {
    uint8_t* s = lanes->RecvSlot(0, peer->index, slot);
    PackTileHost(plan, tile, source.data(), s);
    TileSeal seal;
    seal.key = lanes->PeerRegistration(0, peer->index).key();
    seal.nonce = (nonce += 2);
    seal.handle = handle;
    seal.tile = tile;
    seal.generation = generation.value_or(peer->generation);
    std::memcpy(s + TileBytes(plan, tile), &seal, sizeof(seal));
  }
  // The completion the NIC reports: immediate data naming (index, handle, slot, tile).
  void Arrive(uint32_t index, uint32_t handle, uint32_t slot, uint32_t tile) {
    receiver->OnArrival(Arrival{0, index, handle, slot, tile, 0});
  }

  std::vector<CreditOp> Credits() {
    Lane& lane = lanes->at(0);
    absl::MutexLock lock(&lane.mu);
    return {lane.credits.begin(), lane.credits.end()};
  }
  uint64_t Consumed(PeerConn* peer, uint32_t slot) {
    absl::MutexLock lock(&peer->mu);
    return peer->consumed[0][slot];
  }
  // Waits (up to 10 s) until `n` credits are queued in all.
  bool WaitCredits(size_t n) {
    for (int i = 0; i < 1000; ++i) {
      if (Credits().size() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

TEST_CASE("a peer's own tile, sealed by it, is applied and credited to it") {
  Rig rig;
  const uint32_t h = rig.Begin("peer-a");
  const planner::Plan plan = rig.Plan(rig.BeginRequest("peer-a"));
  REQUIRE(plan.num_tiles() >= 2);
  rig.WriteTile(rig.a, plan, h, 1, 0);
  rig.Arrive(rig.a->index, h, 1, 0);
  REQUIRE(rig.WaitCredits(1));
  const CreditOp credit = rig.Credits()[0];
  CHECK(credit.peer == rig.a->index);
  CHECK(credit.slot == 1);
  CHECK(credit.applied);
  CHECK((credit.value & kCreditNotApplied) == 0);
  CHECK(rig.Consumed(rig.a, 1) == 1);
  // The destination holds the tile as the reference scatter of the same packed bytes puts it.
  std::vector<uint8_t> packed(TileBytes(plan, 0));
  PackTileHost(plan, 0, rig.source.data(), packed.data());
  std::vector<uint8_t> expected(rig.region_size, 0);
  UnpackTileHost(plan, 0, packed.data(), expected.data());
  CHECK(std::memcmp(rig.dst->data(), expected.data(), rig.region_size) == 0);
  CHECK(rig.receiver->refused_arrivals() == 0);
}

// A peer naming another's index in its immediate data, with a handle that is not that peer's,
// must not make the receiver credit that peer's slot "not applied": the victim's tile in flight
// there would fail ("peer dropped tile") and its consume counter would be skewed.
TEST_CASE("forged arrivals naming another peer's index touch none of that peer's slots") {
  Rig rig;
  const uint32_t ha = rig.Begin("peer-a");
  const uint32_t hc = rig.Begin("peer-c");
  const planner::Plan plan = rig.Plan(rig.BeginRequest("peer-a"));
  // peer-c, authenticated as itself, names peer-a's index with: a handle unknown here, its own
  // transfer's handle, and peer-a's transfer with a tile out of range.
  rig.Arrive(rig.a->index, 0x4242, 2, 0);
  rig.Arrive(rig.a->index, hc, 2, 0);
  rig.Arrive(rig.a->index, ha, 2, plan.num_tiles() + 5);
  // And peer-a's live transfer with a valid tile number: no seal of peer-a's there (empty slot).
  rig.Arrive(rig.a->index, ha, 3, 0);
  // Then a real tile of peer-c's own transfer: arrivals are handled in order (one unpacker), so
  // once its credit is queued the forged ones were handled.
  rig.WriteTile(rig.c, plan, hc, 0, 1);
  rig.Arrive(rig.c->index, hc, 0, 1);
  REQUIRE(rig.WaitCredits(1));
  const std::vector<CreditOp> credits = rig.Credits();
  for (const CreditOp& op : credits) {
    INFO("credit for peer " << op.peer << " slot " << op.slot << " tile " << op.tile);
    CHECK(op.peer == rig.c->index);
  }
  REQUIRE(credits.size() == 1);
  CHECK(credits[0].applied);
  for (uint32_t s = 0; s < kSlots; ++s) CHECK(rig.Consumed(rig.a, s) == 0);
  CHECK(rig.Consumed(rig.c, 0) == 1);
  CHECK(rig.receiver->refused_arrivals() == 4);
  // peer-a's transfer is untouched: its own tile still lands and is credited to it.
  rig.WriteTile(rig.a, plan, ha, 2, 0);
  rig.Arrive(rig.a->index, ha, 2, 0);
  REQUIRE(rig.WaitCredits(2));
  CHECK(rig.Credits()[1].peer == rig.a->index);
  CHECK(rig.Credits()[1].applied);
  CHECK(rig.Consumed(rig.a, 2) == 1);
}

TEST_CASE("a tile of a transfer that ended here is credited to its own peer, not applied") {
  Rig rig;
  const uint32_t h = rig.Begin("peer-a");
  const planner::Plan plan = rig.Plan(rig.BeginRequest("peer-a"));
  REQUIRE(rig.receiver->End("peer-a", h, /*abort=*/true, "test").ok());
  // Its handle is not given to the next transfer while such tiles may be in flight.
  const uint32_t next = rig.Begin("peer-c");
  CHECK(next != h);
  // peer-c naming peer-a's index and the ended handle, with no seal of peer-a's: refused.
  rig.Arrive(rig.a->index, h, 1, 0);
  // peer-a's own late tile (sealed by it): its slot is freed, "not applied"; nothing written.
  rig.WriteTile(rig.a, plan, h, 1, 0);
  rig.Arrive(rig.a->index, h, 1, 0);
  REQUIRE(rig.WaitCredits(1));
  const std::vector<CreditOp> credits = rig.Credits();
  REQUIRE(credits.size() == 1);
  CHECK(credits[0].peer == rig.a->index);
  CHECK(credits[0].slot == 1);
  CHECK_FALSE(credits[0].applied);
  CHECK((credits[0].value & kCreditNotApplied) != 0);
  CHECK(rig.Consumed(rig.a, 1) == 1);
  CHECK(rig.receiver->refused_arrivals() == 1);
  const std::vector<uint8_t> zeros(rig.region_size, 0);
  CHECK(std::memcmp(rig.dst->data(), zeros.data(), rig.region_size) == 0);
  // The same seal again (a replay, by anyone naming peer-a): refused, not credited.
  rig.Arrive(rig.a->index, h, 1, 0);
  rig.WriteTile(rig.c, plan, next, 0, 0);
  rig.Arrive(rig.c->index, next, 0, 0);
  REQUIRE(rig.WaitCredits(2));
  CHECK(rig.Credits().size() == 2);
  CHECK(rig.Credits()[1].peer == rig.c->index);
  CHECK(rig.Consumed(rig.a, 1) == 1);
  CHECK(rig.receiver->refused_arrivals() == 2);
}

TEST_CASE("a dropped peer's late tiles are credited to it; another peer naming it gets nothing") {
  Rig rig;
  const uint32_t h = rig.Begin("peer-a");
  const planner::Plan plan = rig.Plan(rig.BeginRequest("peer-a"));
  rig.receiver->DropPeer(rig.a, absl::UnavailableError("test: liveness"));
  rig.Arrive(rig.a->index, h, 0, 1);  // forged (no seal)
  rig.WriteTile(rig.a, plan, h, 0, 1);
  rig.Arrive(rig.a->index, h, 0, 1);
  REQUIRE(rig.WaitCredits(1));
  REQUIRE(rig.Credits().size() == 1);
  CHECK(rig.Credits()[0].peer == rig.a->index);
  CHECK_FALSE(rig.Credits()[0].applied);
  CHECK(rig.receiver->refused_arrivals() == 1);
}

// A peer index is reclaimed once its peer left, and given to another peer. A late
// tile of the former holder must never be applied or credited for the new one: while the index
// is quarantined nothing naming it is taken; after reuse the new holder's seals carry the new
// generation (and a new registration key), so a seal of the former holder is refused even where
// the provider reused the registration key (here: the new key written with the old generation).
TEST_CASE("a stale arrival for a reclaimed peer index is refused") {
  Rig rig;
  const uint32_t ha = rig.Begin("peer-a");
  const planner::Plan plan = rig.Plan(rig.BeginRequest("peer-a"));
  const uint32_t index = rig.a->index;
  const uint64_t old_key = rig.lanes->PeerRegistration(0, index).key();
  // peer-a leaves (its transfers dropped) and is retired: its index is quarantined.
  rig.receiver->DropPeer(rig.a, absl::UnavailableError("test: left the directory"));
  REQUIRE(rig.peers.Retire(rig.a, absl::Now()).ok());
  // Its late tile, sealed by it, during the quarantine: neither applied nor credited.
  rig.WriteTile(rig.a, plan, ha, 0, 0);
  rig.Arrive(index, ha, 0, 0);
  // The table full otherwise (a fresh index is taken before a reclaimed one): fillers without
  // staging (nothing reads theirs here).
  while (rig.peers.size() < PeerTable::kMaxPeers) {
    directory::Peer filler;
    filler.node_id = absl::StrCat("filler-", rig.peers.size());
    filler.address = "127.0.0.1:9";
    REQUIRE(rig.peers.Add(filler, [](PeerConn*) { return absl::OkStatus(); }).ok());
  }
  // Quarantine over: the index is free, its staging released; peer-d gets it.
  const std::vector<uint32_t> freed = rig.peers.EndQuarantine(
      absl::Now() + absl::Hours(1), [&](uint32_t i) { rig.lanes->ReleasePeer(i); });
  REQUIRE(freed == std::vector<uint32_t>{index});
  directory::Peer d;
  d.node_id = "peer-d";
  d.address = "127.0.0.1:9";
  auto added = rig.peers.Add(d, [&](PeerConn* conn) { return rig.lanes->AddPeer(conn); });
  REQUIRE(added.ok());
  PeerConn* pd = *added;
  REQUIRE(pd->index == index);
  CHECK(pd->generation == rig.a->generation + 1);
  CHECK(rig.peers.Find("peer-a") == nullptr);
  CHECK(rig.lanes->PeerRegistration(0, index).key() != old_key);  // the old key is closed
  {
    absl::MutexLock lock(&pd->mu);
    pd->introduced = true;
    pd->boot_id = kBoot;
  }
  REQUIRE(rig.leases->Export(rig.dst->id(), "peer-d").ok());
  const uint32_t hd = rig.Begin("peer-d");
  // The former holder's tile as if it had landed in the new holder's slot under a reused key,
  // for the new holder's transfer: its seal carries the old generation. Refused.
  rig.WriteTile(pd, plan, hd, 1, 0, /*generation=*/rig.a->generation);
  rig.Arrive(index, hd, 1, 0);
  // And with the former holder's key: refused.
  {
    uint8_t* slot = rig.lanes->RecvSlot(0, index, 2);
    PackTileHost(plan, 1, rig.source.data(), slot);
    TileSeal seal;
    seal.key = old_key;
    seal.nonce = (rig.nonce += 2);
    seal.handle = hd;
    seal.tile = 1;
    std::memcpy(slot + TileBytes(plan, 1), &seal, sizeof(seal));
  }
  rig.Arrive(index, hd, 2, 1);
  // The new holder's own tile (its generation): applied and credited to it.
  rig.WriteTile(pd, plan, hd, 3, 0);
  rig.Arrive(index, hd, 3, 0);
  REQUIRE(rig.WaitCredits(1));
  const std::vector<CreditOp> credits = rig.Credits();
  REQUIRE(credits.size() == 1);
  CHECK(credits[0].peer == index);
  CHECK(credits[0].slot == 3);
  CHECK(credits[0].applied);
  CHECK(rig.Consumed(pd, 1) == 0);
  CHECK(rig.Consumed(pd, 2) == 0);
  CHECK(rig.Consumed(pd, 3) == 1);
  CHECK(rig.receiver->refused_arrivals() == 3);
}

}  // namespace
}  // namespace kvrail::fabric

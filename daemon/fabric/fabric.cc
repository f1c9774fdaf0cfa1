// The fabric data path: lanes (NIC + ring + staging + proxy thread), the sender engine (packing
// threads), the receiver (unpacking threads) and credit handling. The control path (Peer service,
// hello, liveness, leases) is in peer_service.cc.
#include "daemon/fabric/fabric_service.h"

#include <sys/mman.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/fabric/tile_pack.h"
#include "spdlog/spdlog.h"

namespace kvrail::fabric {

uint64_t FabricImpl::PerPeerBytes() const {
  const uint64_t credit_bytes = (uint64_t{options_.slots} * 8 + 4095) / 4096 * 4096;
  return 2 * uint64_t{options_.slots} * options_.slot_bytes + credit_bytes;
}
uint8_t* FabricImpl::SendSlot(uint32_t lane, uint32_t peer, uint32_t slot) const {
  return lanes_[lane]->memory.get() + peer * PerPeerBytes() + slot * options_.slot_bytes;
}
uint8_t* FabricImpl::RecvSlot(uint32_t lane, uint32_t peer, uint32_t slot) const {
  return SendSlot(lane, peer, 0) + (uint64_t{options_.slots} + slot) * options_.slot_bytes;
}
uint64_t* FabricImpl::CreditWords(uint32_t lane, uint32_t peer) const {
  return reinterpret_cast<uint64_t*>(SendSlot(lane, peer, 0) +
                                     2 * uint64_t{options_.slots} * options_.slot_bytes);
}

absl::Status FabricImpl::Init() {
  if (options_.slots == 0 || options_.slots > 256) {
    return absl::InvalidArgumentError("fabric.slots: must be in [1, 256]");
  }
  if (options_.slot_bytes < 4096 || options_.slot_bytes > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError("fabric.slot_bytes: must be in [4 KiB, 1 GiB]");
  }
  if (options_.nic_addresses.empty()) {
    return absl::InvalidArgumentError("fabric.nics: no NIC address configured");
  }
  uint32_t index = 0;
  for (const directory::Peer& p : directory_->Peers()) {
    if (index >= 127) return absl::InvalidArgumentError("peers: at most 127 fabric peers");
    auto conn = std::make_unique<PeerConn>();
    conn->index = index++;
    conn->node_id = p.node_id;
    conn->address = p.address;
    // Short reconnect backoff: a peer that starts after us (or comes back) is reached quickly.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
    conn->stub = v1::Peer::NewStub(
        grpc::CreateCustomChannel(p.address, grpc::InsecureChannelCredentials(), args));
    peers_.push_back(std::move(conn));
  }
  const uint64_t bytes = std::max<uint64_t>(1, peers_.size()) * PerPeerBytes();
  for (size_t i = 0; i < options_.nic_addresses.size(); ++i) {
    auto lane = std::make_unique<Lane>();
    lane->index = static_cast<uint32_t>(i);
    Nic::Options nic_options;
    nic_options.provider = options_.provider;
    nic_options.address = options_.nic_addresses[i];
    nic_options.name = absl::StrCat("nic", i, "@", options_.nic_addresses[i]);
    KVRAIL_ASSIGN_OR_RETURN(lane->nic, Nic::Open(nic_options));
    KVRAIL_ASSIGN_OR_RETURN(lane->ring, CommandRing::Create(256));
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat("fabric: staging of ", bytes, " bytes"));
    }
    mlock(mem, bytes);  // pinned bounce buffers where RLIMIT_MEMLOCK allows; best effort
    lane->memory = std::unique_ptr<uint8_t, Munmapper>(static_cast<uint8_t*>(mem), Munmapper{bytes});
    lane->memory_bytes = bytes;
    // GPU regions are packed and unpacked by the copy engines straight from/into the slots.
    lane->pin = PinForGpus(lane->memory.get(), bytes);
    KVRAIL_ASSIGN_OR_RETURN(lane->mr, lane->nic->RegisterMemory(lane->memory.get(), bytes, i + 1));
    lane->contexts.resize(std::max<size_t>(1, peers_.size()) * options_.slots);
    for (uint32_t p = 0; p < peers_.size(); ++p) {
      for (uint32_t s = 0; s < options_.slots; ++s) {
        OpContext& c = lane->contexts[p * options_.slots + s];
        c.peer = p;
        c.lane = lane->index;
        c.slot = s;
      }
    }
    lanes_.push_back(std::move(lane));
  }
  for (auto& peer : peers_) {
    absl::MutexLock lock(&peer->mu);
    for (auto& lane : lanes_) {
      peer->credits.push_back(
          std::make_unique<SlotCredits>(options_.slots, CreditWords(lane->index, peer->index)));
      peer->owners.emplace_back(options_.slots);
      peer->consumed.emplace_back(options_.slots, 0);
      peer->remote.emplace_back();
    }
  }
  for (auto& lane : lanes_) {
    Lane* l = lane.get();
    l->proxy = std::thread([this, l] { ProxyLoop(l); });
  }
  for (int i = 0; i < std::max(1, options_.pack_threads); ++i) {
    workers_.emplace_back([this] { PackLoop(); });
  }
  for (int i = 0; i < std::max(1, options_.unpack_threads); ++i) {
    workers_.emplace_back([this] { UnpackLoop(); });
  }
  spdlog::info("{}", Describe());
  return absl::OkStatus();
}

FabricImpl::~FabricImpl() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  stop_.store(true);
  if (liveness_.joinable()) liveness_.join();
  for (auto& lane : lanes_) {
    lane->nic->Signal();
    if (lane->proxy.joinable()) lane->proxy.join();
  }
  for (auto& t : workers_) t.join();
  if (control_.joinable()) control_.join();
  for (auto& lane : lanes_) lane->mr.reset();  // before the domain closes
}

std::string FabricImpl::Describe() const {
  std::vector<std::string> names;
  for (const auto& lane : lanes_) names.push_back(lane->nic->name());
  return absl::StrCat("fabric: ", lanes_.empty() ? options_.provider : lanes_[0]->nic->provider(),
                      ", ", lanes_.size(), " NICs (", absl::StrJoin(names, ", "), "), ",
                      options_.slots, " x ", options_.slot_bytes >> 10, " KiB slots per peer, ",
                      peers_.size(), " peers");
}

// ---- engine::Engine (sender side) ----

void FabricImpl::Enqueue(const std::shared_ptr<engine::Job>& job,
                         const std::vector<uint32_t>& tiles) {
  if (tiles.empty()) return;
  std::shared_ptr<Outbound> out;
  {
    absl::MutexLock lock(&mu_);
    auto it = outbound_.find(job.get());
    if (it != outbound_.end()) {
      out = it->second;
      auto& queue = queues_[static_cast<int>(job->priority())];
      for (uint32_t t : tiles) queue.push_back(PackItem{out, t});
      return;
    }
  }
  for (uint32_t t : tiles) job->OnTileDone(t, absl::InternalError("fabric: job was not begun"));
}

size_t FabricImpl::Remove(const engine::Job* job) {
  size_t removed = 0;
  std::shared_ptr<Outbound> out;
  {
    absl::MutexLock lock(&mu_);
    for (auto& queue : queues_) {
      for (auto it = queue.begin(); it != queue.end();) {
        if (it->out->job.get() == job) {
          out = it->out;
          ++removed;
          it = queue.erase(it);
        } else {
          ++it;
        }
      }
    }
    auto it = outbound_.find(job);
    if (it != outbound_.end()) out = it->second;
  }
  if (out) {
    {
      absl::MutexLock lock(&out->mu);
      out->removed = true;
    }
    MaybeClose(out);
  }
  return removed;
}

std::vector<uint64_t> FabricImpl::QueuedTiles() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> out(engine::kNumPriorityClasses, 0);
  for (int c = 0; c < engine::kNumPriorityClasses; ++c) out[c] = queues_[c].size();
  return out;
}

bool FabricImpl::HasPackWork() const {
  if (stopping_) return true;
  for (const auto& q : queues_) {
    if (!q.empty()) return true;
  }
  return false;
}

void FabricImpl::PackLoop() {
  uint32_t rr = 0;
  while (true) {
    PackItem item;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &FabricImpl::HasPackWork));
      if (stopping_) return;
      for (auto& queue : queues_) {
        if (queue.empty()) continue;
        item = std::move(queue.front());
        queue.pop_front();
        break;
      }
    }
    std::shared_ptr<Outbound>& out = item.out;
    PeerConn* peer = out->peer;
    // A slot on some lane of the peer: round robin over lanes (striping), waiting for credits.
    int lane = -1, slot = -1;
    while (true) {
      {
        absl::MutexLock lock(&out->mu);
        if (out->failed.has_value()) break;
      }
      absl::MutexLock lock(&peer->mu);
      const uint32_t lanes = peer->lanes;
      for (uint32_t k = 0; k < lanes && slot < 0; ++k) {
        const uint32_t l = (rr + k) % lanes;
        auto& owners = peer->owners[l];
        slot = peer->credits[l]->Acquire([&](uint32_t s) { return owners[s].outbound == nullptr; });
        if (slot >= 0) {
          lane = static_cast<int>(l);
          owners[slot] = SlotOwner{out, item.tile};
        }
      }
      if (slot >= 0) break;
      // All slots in flight: wait for a credit (the proxy signals slots_cv_).
      slots_cv_.WaitWithTimeout(&peer->mu, absl::Milliseconds(20));
      if (stop_.load()) return;
    }
    ++rr;
    if (slot < 0) {
      absl::Status why;
      {
        absl::MutexLock lock(&out->mu);
        why = *out->failed;
      }
      out->job->OnTileDone(item.tile, why);
      continue;
    }
    {
      absl::MutexLock lock(&out->mu);
      ++out->inflight;
    }
    out->job->OnTileStart(item.tile);
    const uint64_t bytes = TileBytes(out->job->plan(), item.tile);
    const engine::MemoryRef src = out->job->src();
    const absl::Status packed =
        PackTile(out->job->plan(), item.tile, RegionSide{src.cuda, src.device, src.base},
                 SendSlot(lane, peer->index, slot));
    if (!packed.ok()) {
      // The slot never reached the wire: give it back here, and fail the tile.
      (void)ReleaseUnsentSlot(peer, lane, static_cast<uint32_t>(slot));
      FinishTile(out, item.tile, packed);  // fails the transfer; aborts it on the peer
      continue;
    }
    kernels::NicCommand cmd{};
    cmd.opcode = kOpWriteTile;
    cmd.tile = item.tile;
    cmd.slot = static_cast<uint32_t>(slot);
    cmd.lane = static_cast<uint16_t>(peer->index);
    cmd.remote_handle = static_cast<uint16_t>(out->handle);
    cmd.transfer_tag = out->id;
    cmd.bytes = static_cast<uint32_t>(bytes);
    Lane& l = *lanes_[lane];
    while (!l.ring->TryPush(cmd)) std::this_thread::yield();
    l.nic->Signal();
  }
}

// ---- the proxy: one per NIC ----

void FabricImpl::ProxyLoop(Lane* lane) {
  std::optional<kernels::NicCommand> pending;
  std::optional<CreditOp> pending_credit;
  uint32_t inflight = 0;
  fi_cq_data_entry entries[32];
  while (!stop_.load()) {
    bool busy = false;
    // Commands from the ring, in batches, up to the in-flight cap.
    for (int batch = 0; batch < 32 && inflight < options_.max_inflight; ++batch) {
      if (!pending) pending = lane->ring->Pop();
      if (!pending) break;
      const ssize_t rc = PostWrite(lane, *pending);
      if (rc == -FI_EAGAIN) break;
      busy = true;
      if (rc == 0) ++inflight;
      pending.reset();
    }
    // Credits owed to senders.
    for (int batch = 0; batch < 32; ++batch) {
      if (!pending_credit) {
        absl::MutexLock lock(&lane->mu);
        if (lane->credits.empty()) break;
        pending_credit = lane->credits.front();
        lane->credits.pop_front();
      }
      const ssize_t rc = PostCredit(lane, *pending_credit);
      if (rc == -FI_EAGAIN) break;
      busy = true;
      pending_credit.reset();
    }
    ssize_t n = busy || pending || pending_credit || inflight > 0
                    ? lane->nic->ReadCompletions(entries, 32)
                    : lane->nic->WaitCompletions(entries, 32, 50);
    if (n == -FI_EAVAIL) {
      void* context = nullptr;
      absl::Status error = lane->nic->ReadError(&context);
      if (context != nullptr) {
        if (inflight > 0) --inflight;
        auto* op = static_cast<OpContext*>(context);
        spdlog::warn("fabric: write on {} failed: {}", lane->nic->name(), error.ToString());
        OnWriteFailed(op->peer, op->lane, op->slot, error);
      } else {
        spdlog::warn("fabric: {}: {}", lane->nic->name(), error.ToString());
      }
      continue;
    }
    if (n < 0) {
      spdlog::warn("fabric: fi_cq_read on {}: {}", lane->nic->name(),
                   FiError("fi_cq_read", n).ToString());
      continue;
    }
    for (ssize_t i = 0; i < n; ++i) {
      const fi_cq_data_entry& e = entries[i];
      if (e.flags & FI_REMOTE_CQ_DATA) {
        if (e.data & kCreditBit) {
          OnCredit(lane->index, ImmIndex(e.data), ImmSlot(e.data), ImmTile(e.data),
                   (e.data & kNotAppliedBit) == 0);
        } else {
          absl::MutexLock lock(&mu_);
          arrivals_.push_back(Arrival{lane->index, ImmIndex(e.data), ImmHandle(e.data),
                                      ImmSlot(e.data), ImmTile(e.data), e.len});
        }
      } else if (e.op_context != nullptr && inflight > 0) {
        --inflight;  // a local write completed; its slot stays owned until the peer's credit
      }
    }
  }
}

namespace {

// The peer's endpoint on `lane` and the index it knows this daemon by, read together.
std::pair<PeerConn::Remote, uint32_t> RemoteOn(PeerConn* peer, uint32_t lane) {
  absl::MutexLock lock(&peer->mu);
  return {peer->remote[lane], peer->index_at_peer};
}

}  // namespace

ssize_t FabricImpl::PostWrite(Lane* lane, const kernels::NicCommand& cmd) {
  PeerConn* peer = peers_[cmd.lane].get();
  const auto [remote, index_at_peer] = RemoteOn(peer, lane->index);
  OpContext* ctx = &lane->contexts[peer->index * options_.slots + cmd.slot];
  const ssize_t rc = lane->nic->WriteData(
      SendSlot(lane->index, peer->index, cmd.slot), cmd.bytes, lane->mr->desc(),
      TileImm(index_at_peer, cmd.remote_handle, cmd.slot, cmd.tile), remote.addr,
      remote.recv_base + uint64_t{cmd.slot} * options_.slot_bytes, remote.key, ctx);
  if (rc != 0 && rc != -FI_EAGAIN) {
    OnWriteFailed(peer->index, lane->index, cmd.slot, FiError("fi_writedata", rc));
  }
  return rc;
}

ssize_t FabricImpl::PostCredit(Lane* lane, const CreditOp& op) {
  PeerConn* peer = peers_[op.peer].get();
  const auto [remote, index_at_peer] = RemoteOn(peer, lane->index);
  const ssize_t rc = lane->nic->InjectWriteData(
      &op.value, sizeof(op.value), CreditImm(index_at_peer, op.slot, op.tile, op.applied),
      remote.addr, remote.credit_base + uint64_t{op.slot} * 8, remote.key);
  if (rc != 0 && rc != -FI_EAGAIN) {
    spdlog::warn("fabric: credit to '{}' lost: {}", peer->node_id,
                 FiError("fi_inject_writedata", rc).ToString());
  }
  return rc;
}

// The peer consumed our tile in (lane, slot): the tile is done (or was dropped).
void FabricImpl::OnCredit(uint32_t lane, uint32_t peer_index, uint32_t slot, uint32_t tile,
                          bool applied) {
  if (peer_index >= peers_.size() || slot >= options_.slots) return;
  PeerConn* peer = peers_[peer_index].get();
  SlotOwner owner;
  {
    absl::MutexLock lock(&peer->mu);
    if (lane >= peer->owners.size()) return;
    owner = std::move(peer->owners[lane][slot]);
    peer->owners[lane][slot] = SlotOwner{};
  }
  slots_cv_.SignalAll();
  if (!owner.outbound || owner.tile != tile) return;  // orphaned by a failure: slot freed only
  FinishTile(owner.outbound, tile,
             applied ? absl::OkStatus()
                     : absl::UnavailableError(absl::StrCat("peer '", peer->node_id,
                                                           "' dropped tile ", tile,
                                                           " (the transfer ended there)")));
}

SlotOwner FabricImpl::ReleaseUnsentSlot(PeerConn* peer, uint32_t lane, uint32_t slot) {
  SlotOwner owner;
  {
    absl::MutexLock lock(&peer->mu);
    owner = std::move(peer->owners[lane][slot]);
    peer->owners[lane][slot] = SlotOwner{};
    peer->credits[lane]->ReturnLocally(slot);  // never reached the peer: no credit will come
  }
  slots_cv_.SignalAll();
  return owner;
}

void FabricImpl::OnWriteFailed(uint32_t peer_index, uint32_t lane, uint32_t slot,
                               const absl::Status& error) {
  PeerConn* peer = peers_[peer_index].get();
  const SlotOwner owner = ReleaseUnsentSlot(peer, lane, slot);
  if (owner.outbound) {
    FinishTile(owner.outbound, owner.tile,
               absl::UnavailableError(absl::StrCat("fabric write to '", peer->node_id,
                                                   "' failed: ", error.message())));
  }
}

void FabricImpl::FinishTile(const std::shared_ptr<Outbound>& out, uint32_t tile,
                            const absl::Status& status) {
  {
    absl::MutexLock lock(&out->mu);
    if (out->inflight > 0) --out->inflight;
    if (status.ok()) {
      ++out->ok_tiles;
    } else if (!out->failed.has_value()) {
      out->failed = status;
    }
  }
  out->job->OnTileDone(tile, status);
  MaybeClose(out);
}

// Ends the outbound transfer once nothing of it is in flight: End (all tiles landed) or Abort.
void FabricImpl::MaybeClose(const std::shared_ptr<Outbound>& out) {
  bool end = false;  // else abort, with `why`
  absl::Status why;
  {
    absl::MutexLock lock(&out->mu);
    if (out->closed || out->inflight > 0) return;
    if (out->ok_tiles == out->job->plan().num_tiles()) {
      end = true;
    } else if (out->failed.has_value() || out->removed) {
      why = out->failed.value_or(absl::CancelledError("ended by the sender"));
    } else {
      return;
    }
    out->closed = true;
  }
  {
    absl::MutexLock lock(&mu_);
    outbound_.erase(out->job.get());
    control_queue_.push_back([this, out, end, why] { SendEnd(out, end, why); });
  }
}

// Fails every transfer to or from `peer` (it is down or restarted).
void FabricImpl::FailPeer(PeerConn* peer, const absl::Status& why) {
  std::vector<std::shared_ptr<Outbound>> outs;
  std::vector<PackItem> dropped;
  std::vector<std::shared_ptr<Inbound>> dropped_inbound;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [job, out] : outbound_) {
      if (out->peer == peer) outs.push_back(out);
    }
    for (auto& queue : queues_) {
      for (auto it = queue.begin(); it != queue.end();) {
        if (it->out->peer == peer) {
          dropped.push_back(std::move(*it));
          it = queue.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto it = inbound_.begin(); it != inbound_.end();) {
      if (it->second->peer == peer->index) {
        spdlog::warn("fabric: inbound transfer {} from '{}' dropped: {}",
                     it->second->sender_transfer_id, peer->node_id, why.ToString());
        dropped_inbound.push_back(it->second);
        it = inbound_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& out : outs) {
    absl::MutexLock lock(&out->mu);
    if (!out->failed.has_value()) out->failed = why;
  }
  for (auto& in : dropped_inbound) {
    EndInboundRecord(*in, absl::UnavailableError(absl::StrCat(
                              "the sender '", peer->node_id, "' is gone: ", why.message())));
  }
  // In-flight tiles: their slots stay reserved (orphaned) until a late credit or a re-base.
  std::vector<SlotOwner> orphaned;
  {
    absl::MutexLock lock(&peer->mu);
    for (auto& lane : peer->owners) {
      for (SlotOwner& o : lane) {
        if (o.outbound) orphaned.push_back(std::move(o));
        o = SlotOwner{};
      }
    }
  }
  slots_cv_.SignalAll();
  for (auto& o : orphaned) FinishTile(o.outbound, o.tile, why);
  for (auto& item : dropped) item.out->job->OnTileDone(item.tile, why);
  for (auto& out : outs) MaybeClose(out);
}

// ---- the receiver ----

bool FabricImpl::HasArrivals() const { return stopping_ || !arrivals_.empty(); }

bool FabricImpl::ApplyTile(Inbound& in, const Arrival& a) {
  {
    absl::MutexLock lock(&in.mu);
    if (in.applied[a.tile]) return false;  // a repeat: applied once already
    in.applied[a.tile] = true;
  }
  const v1::RegionSpec& dst = in.dst->spec();
  const bool cuda = dst.memory_kind() == v1::MEMORY_KIND_CUDA;
  const absl::Status unpacked =
      UnpackTile(in.plan, a.tile, RecvSlot(a.lane, a.peer, a.slot),
                 RegionSide{cuda, cuda ? dst.device() : -1, in.dst->data()});
  absl::MutexLock lock(&in.mu);
  if (!unpacked.ok()) {
    // Reported to the sender as not applied (its transfer fails); the tile may come again.
    spdlog::warn("fabric: tile {} of transfer {} from '{}': {}", a.tile, in.sender_transfer_id,
                 in.sender_node, unpacked.ToString());
    in.applied[a.tile] = false;
    return false;
  }
  if (in.job != nullptr && !in.ended) {
    in.job->OnTileStart(a.tile);
    in.job->OnTileDone(a.tile, absl::OkStatus());
  }
  if (++in.applied_count == in.plan.num_tiles()) {
    spdlog::info("fabric: inbound transfer {} from '{}' complete: {} tiles, {} bytes",
                 in.sender_transfer_id, in.sender_node, in.plan.num_tiles(),
                 in.plan.bytes_total());
  }
  return true;
}

void FabricImpl::UnpackLoop() {
  while (true) {
    Arrival a;
    std::shared_ptr<Inbound> in;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &FabricImpl::HasArrivals));
      if (stopping_) return;
      a = arrivals_.front();
      arrivals_.pop_front();
      auto it = inbound_.find(a.handle);
      if (it != inbound_.end() && it->second->peer == a.peer) in = it->second;
    }
    if (a.peer >= peers_.size() || a.slot >= options_.slots) {
      spdlog::warn("fabric: arrival with peer index {} slot {} ignored", a.peer, a.slot);
      continue;
    }
    bool applied = false;
    // Providers need not report the length of a remote write (tcp reports 0); check it when given.
    if (in != nullptr && a.tile < in->plan.num_tiles() &&
        (a.len == 0 || a.len == TileBytes(in->plan, a.tile))) {
      applied = ApplyTile(*in, a);
    } else if (in == nullptr) {
      spdlog::debug("fabric: tile {} for unknown handle {} dropped", a.tile, a.handle);
    } else {
      spdlog::warn("fabric: tile {} ({} bytes) does not fit transfer {}; dropped", a.tile, a.len,
                   in->sender_transfer_id);
    }
    PeerConn* peer = peers_[a.peer].get();
    uint64_t value;
    {
      absl::MutexLock lock(&peer->mu);
      value = ++peer->consumed[a.lane][a.slot];
    }
    Lane& lane = *lanes_[a.lane];
    {
      absl::MutexLock lock(&lane.mu);
      lane.credits.push_back(CreditOp{a.peer, a.slot, a.tile, applied, value});
    }
    lane.nic->Signal();
  }
}

}  // namespace kvrail::fabric

#include "daemon/fabric/sender.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "daemon/fabric/command_ring.h"
#include "daemon/fabric/lane_health.h"
#include "daemon/fabric/lane_route.h"
#include "daemon/fabric/leases.h"
#include "daemon/fabric/peer_rpc.h"
#include "daemon/fabric/relay.h"
#include "daemon/fabric/tile_copy.h"
#include "daemon/fabric/tile_pack.h"
#include "spdlog/spdlog.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

// One transfer this daemon sends. Thread contract: the fields above `mu` are fixed once Begin has
// published it; `mu` guards the counters.
struct Outbound {
  uint64_t id = 0;
  std::shared_ptr<engine::Job> job;
  PeerConn* peer = nullptr;
  uint32_t handle = 0;
  std::vector<std::string> nics;
  // Rail-aware lane choice (lane_route.h): the lanes this transfer's tiles use (all when
  // route.all; when none of them is usable, the peer's other lanes: failover).
  LaneRoute route;
  absl::Mutex mu;
  std::optional<absl::Status> failed ABSL_GUARDED_BY(mu);
  bool removed ABSL_GUARDED_BY(mu) = false;
  uint32_t inflight ABSL_GUARDED_BY(mu) = 0;
  uint32_t ok_tiles ABSL_GUARDED_BY(mu) = 0;
  bool closed ABSL_GUARDED_BY(mu) = false;
  // spec.digest: the digest each tile was sent with (indexed by tile; grown on first use).
  std::vector<uint64_t> digests ABSL_GUARDED_BY(mu);
  // The fabric kernel for a GPU source (packs into the mapped slot and writes the
  // command ring itself); null: the copy engines / host pack. Set by Begin, before publication.
  std::unique_ptr<GpuTileKernels> gpu;
  // The hierarchical path's relay hop (relay.h): packs through a relay slot (on the
  // relay GPU R, or the host twin) into the send slot; null: the direct path. Set by Begin.
  std::unique_ptr<RelayTransfer> relay;
  // Lane failover: lanes failed under this transfer, tiles re-sent, and the latest failover's
  // detection and first re-sent tile (for the record's path reason).
  uint32_t failovers ABSL_GUARDED_BY(mu) = 0;
  uint32_t resent ABSL_GUARDED_BY(mu) = 0;
  std::string failover_what ABSL_GUARDED_BY(mu);
  std::optional<absl::Time> failover_detected ABSL_GUARDED_BY(mu);
};

namespace {

// Thread contract: see Sender. mu_ guards the queues, the transfer table and the closing queue;
// each PeerConn and Outbound has its own lock, never taken while mu_ is held (FailPeer takes
// mu_, releases it, then the others). health_mu_ guards the lanes' health (lane failover);
// when nested, a peer's mu comes first, then health_mu_, then an Outbound's mu.
class SenderImpl final : public Sender {
 public:
  SenderImpl(const FabricOptions& options, uint64_t boot_id, Lanes* lanes, PeerTable* peers,
             const directory::Directory* directory, Introduce introduce)
      : options_(options),
        boot_id_(boot_id),
        lanes_(lanes),
        peers_(peers),
        directory_(directory),
        introduce_(std::move(introduce)),
        // The hierarchy reads the lanes' live load (LaneLoad) when it decides a
        // transfer's relay; called from Begin, after Start sized lane_out_.
        relay_(RelayStage::Create(RelaySide::kSend, options,
                                  ParseRelayConfig(options.relay.c_str()),
                                  [this] { return LaneLoad(); })) {}
  ~SenderImpl() override { Stop(); }
  void Start();

  // transfers::RemotePath
  absl::StatusOr<Prepared> Prepare(const v1::TransferSpec& spec) override;
  absl::StatusOr<std::vector<std::string>> Begin(uint64_t id, const v1::TransferSpec& spec,
                                                 const regions::Region& src, uint64_t tile_bytes,
                                                 const std::shared_ptr<engine::Job>& job) override;

  // engine::Engine
  std::string name() const override { return "fabric"; }
  // Runs PATH_FABRIC transfers from host or GPU sources (not routed through the engine registry:
  // the remote path hands it its transfers).
  engine::Capabilities capabilities() const override {
    engine::Capabilities caps;
    caps.host_to_host = true;
    caps.gpu_memory = true;
    caps.digest = true;
    return caps;
  }
  void Enqueue(const std::shared_ptr<engine::Job>& job,
               const std::vector<uint32_t>& tiles) override;
  size_t Remove(const engine::Job* job) override;
  std::vector<uint64_t> QueuedTiles() const override;
  std::string Describe() const override { return lanes_->Describe(); }
  std::map<std::string, double> Gauges() const override;

  // CreditSink
  void OnCredit(uint32_t lane, uint32_t peer_index, uint32_t slot, uint32_t tile,
                bool applied) override;
  void OnWriteFailed(uint32_t peer_index, uint32_t lane, uint32_t slot,
                     const absl::Status& error) override;

  void FailPeer(PeerConn* peer, const absl::Status& why) override;
  bool HasTransfers(const PeerConn* peer) const override {
    absl::MutexLock lock(&mu_);
    for (const auto& [job, out] : outbound_) {
      if (out->peer == peer) return true;
    }
    for (const auto& queue : queues_) {
      for (const PackItem& item : queue) {
        if (item.out->peer == peer) return true;
      }
    }
    return false;
  }
  void Stop() override;

 private:
  struct PackItem {
    std::shared_ptr<Outbound> out;
    uint32_t tile = 0;
    // Lane failover: re-sent after its lane failed, detected at `detected`.
    bool resend = false;
    absl::Time detected;
  };
  // A transfer to end on the peer: End when all its tiles landed, else Abort with `why`.
  struct Closing {
    std::shared_ptr<Outbound> out;
    bool end = false;
    absl::Status why;
  };

  bool HasPackWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PackLoop();
  // Takes a free slot on some lane of the transfer's peer (round robin from lane `rr`, waiting
  // for credits) and makes the tile its owner: (lane, slot), or nullopt once the transfer has
  // failed or the sender stops.
  std::optional<std::pair<uint32_t, uint32_t>> TakeSlot(const PackItem& item, uint32_t rr);
  // Frees `slot` of `lane` toward `peer` whose write never reached the wire (no credit will
  // come for it) and wakes waiting packers; returns who owned it.
  SlotOwner ReleaseUnsentSlot(PeerConn* peer, uint32_t lane, uint32_t slot);
  void FinishTile(const std::shared_ptr<Outbound>& out, uint32_t tile, const absl::Status& status);
  // Queues End or Abort for `out` once nothing of it is in flight.
  void MaybeClose(const std::shared_ptr<Outbound>& out);
  void CloseLoop();
  void SendEnd(const Closing& closing);

  // ---- lane failover (lane_health.h) ----
  // The peer's lane health (created on first use); health_mu_ is taken inside the peer's mu.
  LaneHealth& HealthOf(const PeerConn* peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(health_mu_);
  // Fails `lane` toward `peer` (under the peer's mu): the owners of the slots it was waiting on,
  // taken out of the slots (which stay used until a late credit or a write error frees them).
  std::vector<SlotOwner> FailLaneLocked(PeerConn* peer, uint32_t lane, absl::Time now,
                                        const std::string& why, bool* any_left, std::string* state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer->mu);
  // After FailLaneLocked: re-queues `tiles` at the front of their classes when a lane is left,
  // else fails every transfer to the peer (UNAVAILABLE naming it).
  void Resend(PeerConn* peer, uint32_t lane, std::vector<SlotOwner> tiles, absl::Time detected,
              const std::string& why, bool any_left, const std::string& state);
  // The watchdog: fails silent lanes (LaneHealth::Silent) every few milliseconds.
  void WatchLoop();

  // ---- load-aware striping ----
  // Tiles out per local lane now (slots with an owner, over all peers). Thread contract: any
  // thread, no lock (relaxed atomic reads: each lane's count was true at some instant, not all
  // at one); lane_out_'s size is fixed by Start before any caller. Read by the packers'
  // TakeSlot, Begin's lane choice and the relay stage's hierarchy.
  std::vector<uint32_t> LaneLoad() const {
    std::vector<uint32_t> load(lane_out_.size());
    for (size_t l = 0; l < load.size(); ++l) load[l] = lane_out_[l].load(std::memory_order_relaxed);
    return load;
  }
  // A slot of `lane` lost its owner (credit, release, failure).
  void Unowned(uint32_t lane) {
    if (lane < lane_out_.size()) lane_out_[lane].fetch_sub(1, std::memory_order_relaxed);
  }

  const FabricOptions options_;
  const uint64_t boot_id_;
  Lanes* const lanes_;
  PeerTable* const peers_;
  const directory::Directory* const directory_;
  const Introduce introduce_;
  const std::unique_ptr<RelayStage> relay_;  // the relay hop (PATH_HIERARCHICAL)

  std::vector<std::thread> packers_;
  std::thread closer_;
  std::thread watcher_;
  std::atomic<bool> stop_{false};
  // Per local lane: slots with an owner (tiles out, to every peer); changed under that peer's mu.
  std::vector<std::atomic<uint32_t>> lane_out_;
  absl::CondVar slots_cv_;  // a slot may have been freed (waited on under a peer's mu)

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<PackItem> queues_[engine::kNumPriorityClasses] ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<const engine::Job*, std::shared_ptr<Outbound>> outbound_ ABSL_GUARDED_BY(mu_);
  std::deque<Closing> closing_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex health_mu_;
  absl::flat_hash_map<const PeerConn*, std::unique_ptr<LaneHealth>> health_
      ABSL_GUARDED_BY(health_mu_);
  uint64_t tiles_resent_ ABSL_GUARDED_BY(health_mu_) = 0;
  double last_resend_ms_ ABSL_GUARDED_BY(health_mu_) = 0;
};

void SenderImpl::Start() {
  lane_out_ = std::vector<std::atomic<uint32_t>>(lanes_->size());  // before any thread starts
  for (int i = 0; i < std::max(1, options_.pack_threads); ++i) {
    packers_.emplace_back([this] { PackLoop(); });
  }
  closer_ = std::thread([this] { CloseLoop(); });
  watcher_ = std::thread([this] { WatchLoop(); });
}

void SenderImpl::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  stop_.store(true);
  for (auto& t : packers_) {
    if (t.joinable()) t.join();
  }
  if (closer_.joinable()) closer_.join();
  if (watcher_.joinable()) watcher_.join();
}

// ---- RemotePath ----

absl::StatusOr<transfers::RemotePath::Prepared> SenderImpl::Prepare(const v1::TransferSpec& spec) {
  PeerConn* peer = peers_->Find(spec.dst().node_id());
  if (peer == nullptr) {
    return absl::NotFoundError(absl::StrCat("spec.dst.node_id: '", spec.dst().node_id(),
                                            "' is not in this daemon's peer directory"));
  }
  bool ready;
  {
    absl::MutexLock lock(&peer->mu);
    ready = peer->introduced && peer->up;
  }
  if (!ready) {
    absl::Status hello = introduce_(peer);
    if (!hello.ok()) {
      return absl::UnavailableError(absl::StrCat("spec.dst.node_id: peer '", peer->node_id,
                                                 "' is unreachable: ", hello.message()));
    }
  }
  peer_v1::GetLeaseRequest request;
  request.set_region_id(spec.dst().region_id());
  request.set_requester_node_id(options_.node_id);
  v1::RegionLease lease;
  auto context = PeerCallContext(absl::Seconds(5));
  KVRAIL_RETURN_IF_ERROR(
      FromPeerRpc(peer->stub->GetLease(context.get(), request, &lease), "spec.dst.region_id: "));
  KVRAIL_ASSIGN_OR_RETURN(
      planner::RegionView view,
      RemoteViewOf(lease.size_bytes(), lease.writable(),
                   lease.has_paged_kv() ? &lease.paged_kv() : nullptr, "lease.paged_kv."));
  Prepared prepared;
  prepared.dst = MakeLeasedRegion(std::move(lease), std::move(view));
  prepared.engine = this;
  // spec.digest: each tile travels with its 8-byte digest after it (tile_copy.h).
  // Every tile is followed by its seal (lanes.h TileSeal).
  prepared.max_tile_bytes =
      options_.slot_bytes - kTileSealBytes - (spec.digest() ? kDigestTrailerBytes : 0);
  return prepared;
}

absl::StatusOr<std::vector<std::string>> SenderImpl::Begin(
    uint64_t id, const v1::TransferSpec& spec, const regions::Region& src, uint64_t tile_bytes,
    const std::shared_ptr<engine::Job>& job) {
  PeerConn* peer = peers_->Find(spec.dst().node_id());
  if (peer == nullptr) return absl::NotFoundError("spec.dst.node_id: unknown peer");
  peer_v1::BeginRemoteTransferRequest request;
  request.set_sender_node_id(options_.node_id);
  request.set_sender_boot_id(boot_id_);
  request.set_sender_transfer_id(id);
  *request.mutable_spec() = spec;
  request.mutable_source()->set_size_bytes(src.spec().size_bytes());
  if (src.spec().has_paged_kv())
    *request.mutable_source()->mutable_paged_kv() = src.spec().paged_kv();
  request.set_tile_bytes(tile_bytes);
  request.set_bytes_total(job->plan().bytes_total());
  request.set_tiles_total(job->plan().num_tiles());
  peer_v1::BeginRemoteTransferResponse response;
  auto context = PeerCallContext(absl::Seconds(5));
  KVRAIL_RETURN_IF_ERROR(
      FromPeerRpc(peer->stub->BeginRemoteTransfer(context.get(), request, &response),
                  absl::StrCat("peer '", peer->node_id, "' refused the transfer: ")));
  auto out = std::make_shared<Outbound>();
  out->id = id;
  out->job = job;
  out->peer = peer;
  out->handle = response.handle();
  {
    // Per transfer: the GPU kernel for a GPU source, else the copy engines / host pack; said in
    // the path reason.
    const job::Placement src_ref = job->src();
    std::string why;
    out->gpu = GpuTileKernels::ForSource(job->plan(),
                                         RegionSide{src_ref.cuda, src_ref.device, src_ref.base},
                                         job->wants_digest(), options_.gpu_pack_kernels, &why);
    // Which lanes (rail-aware; all of them whenever something is unknown), and why.
    LaneRouteInput in;
    std::vector<std::string> remote_names;
    {
      absl::MutexLock lock(&peer->mu);
      in.lanes = peer->lanes;
      for (uint32_t l = 0; l < peer->lanes; ++l) remote_names.push_back(peer->remote[l].nic_name);
    }
    for (const std::string& name : remote_names) in.peer_lane_nics.push_back(NicOfLaneName(name));
    in.local = options_.topology.get();
    in.local_lane_nics = options_.lane_nics;
    in.lane_load = LaneLoad();  // the chosen lanes least loaded first
    if (in.local != nullptr && src.spec().memory_kind() == v1::MEMORY_KIND_CUDA) {
      in.src_gpu = GpuIndexOf(*in.local, src.spec().device_uuid(), src.spec().device());
    }
    std::optional<directory::Peer> listed;
    if (directory_ != nullptr) {
      absl::StatusOr<directory::Peer> p = directory_->Lookup(peer->node_id);
      if (p.ok() && p->has_record) listed = *std::move(p);
    }
    if (listed.has_value()) {
      in.peer = &listed->record;
      for (const auto& gpu : listed->record.gpus()) {
        if (!response.dst_gpu_uuid().empty() &&
            absl::EqualsIgnoreCase(gpu.uuid(), response.dst_gpu_uuid())) {
          in.dst_gpu = gpu.index();
        }
      }
    }
    // The relay hop (relay.h): the hierarchy's choice of GPU R for this side, or a
    // forced one; a relay packs through R and the tiles leave by R's NICs.
    RelayNote relay_note;
    out->relay =
        relay_->ForTransfer(job->plan(), RegionSide{src_ref.cuda, src_ref.device, src_ref.base},
                            in.src_gpu, job->wants_digest(), &relay_note);
    if (out->relay != nullptr) {
      out->gpu.reset();  // the relay packs (a kernel into R's slot, or the host twin)
      if (out->relay->plan().relay_gpu_index >= 0) in.src_gpu = out->relay->plan().relay_gpu_index;
    }
    NoteRelay(relay_note, &why);
    out->route = ChooseLanes(in);
    const std::string lanes_note = absl::StrCat("lanes: ", out->route.reason);
    job->OnEngineNote(why.empty() ? lanes_note : absl::StrCat(why, "; ", lanes_note));
  }
  {
    absl::MutexLock lock(&peer->mu);
    for (uint32_t l = 0; l < peer->lanes; ++l) {
      if (!out->route.all && std::find(out->route.lanes.begin(), out->route.lanes.end(), l) ==
                                 out->route.lanes.end()) {
        continue;
      }
      out->nics.push_back(absl::StrCat(lanes_->at(l).nic->name(), "->", peer->remote[l].nic_name));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    outbound_[job.get()] = out;
  }
  return out->nics;
}

// ---- engine::Engine ----

void SenderImpl::Enqueue(const std::shared_ptr<engine::Job>& job,
                         const std::vector<uint32_t>& tiles) {
  if (tiles.empty()) return;
  {
    absl::MutexLock lock(&mu_);
    auto it = outbound_.find(job.get());
    if (it != outbound_.end()) {
      auto& queue = queues_[static_cast<int>(job->priority())];
      for (uint32_t t : tiles) queue.push_back(PackItem{it->second, t});
      return;
    }
  }
  for (uint32_t t : tiles) job->OnTileDone(t, absl::InternalError("fabric: job was not begun"));
}

size_t SenderImpl::Remove(const engine::Job* job) {
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

std::vector<uint64_t> SenderImpl::QueuedTiles() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> out(engine::kNumPriorityClasses, 0);
  for (int c = 0; c < engine::kNumPriorityClasses; ++c) out[c] = queues_[c].size();
  return out;
}

// ---- packing ----

bool SenderImpl::HasPackWork() const {
  if (stopping_) return true;
  for (const auto& q : queues_) {
    if (!q.empty()) return true;
  }
  return false;
}

std::optional<std::pair<uint32_t, uint32_t>> SenderImpl::TakeSlot(const PackItem& item,
                                                                  uint32_t rr) {
  const std::shared_ptr<Outbound>& out = item.out;
  PeerConn* peer = out->peer;
  while (true) {
    {
      absl::MutexLock lock(&out->mu);
      // Ended (aborted, cancelled, past its deadline) while this tile waited for a slot: the
      // tile fails and the packer moves on (waiting on held up every transfer behind it).
      if (out->removed && !out->failed.has_value()) {
        out->failed = absl::CancelledError("the transfer ended while its tile waited for a slot");
      }
      if (out->failed.has_value()) return std::nullopt;
    }
    absl::MutexLock lock(&peer->mu);
    const uint32_t lanes = peer->lanes;
    const absl::Time now = absl::Now();
    {
      // Released before the wait below (which gives up only the peer's mu).
      absl::MutexLock health_lock(&health_mu_);
      LaneHealth& health = HealthOf(peer);
      if (!health.AnyLeft(now)) {
        // Every lane to the peer failed and rests: the transfer fails (lane failover's end).
        const absl::Status why = absl::UnavailableError(absl::StrCat(
            "peer '", peer->node_id, "': no fabric lane left (", health.Describe(), ")"));
        absl::MutexLock out_lock(&out->mu);
        if (!out->failed.has_value()) out->failed = why;
        return std::nullopt;
      }
      // The transfer's lanes (rail-aware), least loaded first: the tiles this
      // daemon has out on each lane to every peer, ties round robin from `rr`
      // (LaneTryOrderByLoad); when none of them is usable (failed and resting, or its probe is
      // out), the peer's other lanes (lane failover).
      const LaneRoute& route = out->route;
      std::vector<bool> usable(lanes, false);
      bool chosen_usable = false;
      for (uint32_t l = 0; l < lanes; ++l) {
        const bool chosen =
            route.all || std::find(route.lanes.begin(), route.lanes.end(), l) != route.lanes.end();
        if (chosen && health.MayUse(l, now)) usable[l] = chosen_usable = true;
      }
      for (uint32_t l = 0; l < lanes && !chosen_usable; ++l) {
        if (health.MayUse(l, now)) usable[l] = true;
      }
      for (uint32_t l : LaneTryOrderByLoad(route, usable, LaneLoad(), rr)) {
        if (l >= lanes) continue;
        auto& owners = peer->owners[l];
        const int slot =
            peer->credits[l]->Acquire([&](uint32_t s) { return owners[s].outbound == nullptr; });
        if (slot >= 0) {
          owners[slot] = SlotOwner{out, item.tile};
          lane_out_[l].fetch_add(1, std::memory_order_relaxed);
          health.OnSent(l, static_cast<uint32_t>(slot), now);
          return std::make_pair(l, static_cast<uint32_t>(slot));
        }
      }
    }
    // All slots in flight: wait for a credit (OnCredit signals slots_cv_).
    slots_cv_.WaitWithTimeout(&peer->mu, absl::Milliseconds(20));
    if (stop_.load()) return std::nullopt;
  }
}

void SenderImpl::PackLoop() {
  uint32_t rr = 0;
  while (true) {
    PackItem item;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SenderImpl::HasPackWork));
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
    const std::optional<std::pair<uint32_t, uint32_t>> taken = TakeSlot(item, rr);
    ++rr;
    if (!taken.has_value()) {
      std::optional<absl::Status> why;
      {
        absl::MutexLock lock(&out->mu);
        why = out->failed;
      }
      if (!why.has_value()) return;  // stopping
      out->job->OnTileDone(item.tile, *why);
      continue;
    }
    const auto [lane, slot] = *taken;
    {
      absl::MutexLock lock(&out->mu);
      ++out->inflight;
    }
    out->job->OnTileStart(item.tile);
    const uint64_t bytes = TileBytes(out->job->plan(), item.tile);
    const job::Placement src = out->job->src();
    const RegionSide src_side{src.cuda, src.device, src.base};
    uint8_t* const staging = lanes_->SendSlot(lane, peer->index, slot);
    absl::Status packed;
    bool published = false;  // the command is in the ring already (written by the GPU)
    uint64_t wire_bytes = bytes;
    if (out->job->wants_digest()) {  // spec.digest: hashed while packing, sent after the bytes
      const absl::StatusOr<uint64_t> digest =
          PackTileWithDigest(out->job->plan(), item.tile, src_side, staging);
      packed = digest.status();
      if (digest.ok()) {
        wire_bytes += kDigestTrailerBytes;
        absl::MutexLock lock(&out->mu);
        if (out->digests.size() <= item.tile) out->digests.resize(out->job->plan().num_tiles());
        out->digests[item.tile] = *digest;
      }
    } else if (out->relay != nullptr) {
      // Through a relay slot (GPU R's memory, or the host twin) into the send slot.
      packed = out->relay->Pack(item.tile, staging);
    } else if (out->gpu != nullptr) {
      // The GPU gathers the tile into the slot and publishes its command in the ring.
      // Enqueued on the transfer's stream, not waited for: this thread goes on to the next
      // free slot, so a kernel per free slot is in flight; the proxy polls while the ring holds
      // reserved numbers. The slot is the tile's until its credit, which needs the command.
      kernels::NicCommand engine{};
      engine.peer = static_cast<uint16_t>(peer->index);
      engine.remote_handle = static_cast<uint16_t>(out->handle);
      engine.transfer_tag = out->id;
      packed =
          out->gpu->PackAndPublish(item.tile, slot, staging, lanes_->at(lane).ring.get(), engine);
      published = packed.ok();
    } else {
      packed = PackTile(out->job->plan(), item.tile, src_side, staging);
    }
    if (!packed.ok()) {
      // The slot never reached the wire: give it back here, and fail the tile.
      (void)ReleaseUnsentSlot(peer, lane, slot);
      FinishTile(out, item.tile, packed);  // fails the transfer; aborts it on the peer
      continue;
    }
    kernels::NicCommand cmd{};
    cmd.opcode = kOpWriteTile;
    cmd.tile = item.tile;
    cmd.slot = slot;
    cmd.peer = static_cast<uint16_t>(peer->index);
    cmd.remote_handle = static_cast<uint16_t>(out->handle);
    cmd.transfer_tag = out->id;
    cmd.bytes = static_cast<uint32_t>(wire_bytes);
    if (published) {
      // Wakes a proxy asleep in fi_cq_sread; it then polls until the kernel's command appears.
      lanes_->at(lane).nic->Signal();
    } else {
      lanes_->PostCommand(lane, cmd);
    }
    if (item.resend) {
      // Lane failover: the first re-sent tile of a failover is on its new lane's ring.
      const absl::Time posted = absl::Now();
      std::string note;
      std::optional<double> resend_ms;
      {
        absl::MutexLock lock(&out->mu);
        ++out->resent;
        if (out->failover_detected.has_value() && *out->failover_detected == item.detected) {
          const double ms = absl::ToDoubleMilliseconds(posted - item.detected);
          note = absl::StrCat("lane failover: ", out->failover_what, "; first re-sent tile on ",
                              lanes_->at(lane).nic->name(), " ", absl::StrFormat("%.3f", ms),
                              " ms after detection");
          out->failover_detected.reset();
          spdlog::warn("fabric: transfer {} to '{}': {}", out->id, peer->node_id, note);
          resend_ms = ms;
        }
      }
      if (resend_ms.has_value()) {
        absl::MutexLock health_lock(&health_mu_);  // never inside an Outbound's mu (TakeSlot)
        last_resend_ms_ = *resend_ms;
      }
      if (!note.empty()) out->job->OnEngineNote(note);
    }
  }
}

// ---- credits and failures (proxy threads) ----

void SenderImpl::OnCredit(uint32_t lane, uint32_t peer_index, uint32_t slot, uint32_t tile,
                          bool applied) {
  if (peer_index >= peers_->size() || slot >= options_.slots) return;
  PeerConn* peer = peers_->at(peer_index);
  // A retired index (its peer left; its transfers failed): nothing is owed.
  if (peer->retired.load(std::memory_order_acquire)) return;
  SlotOwner owner;
  {
    absl::MutexLock lock(&peer->mu);
    if (lane >= peer->owners.size()) return;
    // The credit word lies in this peer's registration (only it holds the key): a completion
    // naming this peer while the word does not show the slot returned did not come from it (the
    // immediate data is forgeable by any peer); and the word, not the imm bit, says "applied".
    if (!peer->credits[lane]->Returned(slot)) {
      spdlog::warn(
          "fabric: credit naming '{}' slot {} lane {} ignored: its credit word shows no "
          "return",
          peer->node_id, slot, lane);
      return;
    }
    applied = !peer->credits[lane]->NotApplied(slot);
    owner = std::move(peer->owners[lane][slot]);
    peer->owners[lane][slot] = SlotOwner{};
    if (owner.outbound) Unowned(lane);
    absl::MutexLock health_lock(&health_mu_);
    HealthOf(peer).OnCredit(lane, slot, absl::Now());
  }
  slots_cv_.SignalAll();
  if (!owner.outbound || owner.tile != tile) return;  // orphaned by a failure: slot freed only
  const bool digest = owner.outbound->job->wants_digest();
  if (applied && digest) {
    // The receiver applies a digest tile only when its read-back digest equals the one sent.
    uint64_t sent = 0;
    {
      absl::MutexLock lock(&owner.outbound->mu);
      if (tile < owner.outbound->digests.size()) sent = owner.outbound->digests[tile];
    }
    owner.outbound->job->OnTileDigest(tile, sent, sent);
  }
  FinishTile(owner.outbound, tile,
             applied ? absl::OkStatus()
                     : absl::UnavailableError(absl::StrCat(
                           "peer '", peer->node_id, "' dropped tile ", tile,
                           digest ? " (the transfer ended there, or the tile's read-back digest "
                                    "did not match: DATA_LOSS in the peer's transfer)"
                                  : " (the transfer ended there)")));
}

SlotOwner SenderImpl::ReleaseUnsentSlot(PeerConn* peer, uint32_t lane, uint32_t slot) {
  SlotOwner owner;
  {
    absl::MutexLock lock(&peer->mu);
    owner = std::move(peer->owners[lane][slot]);
    peer->owners[lane][slot] = SlotOwner{};
    if (owner.outbound) Unowned(lane);
    peer->credits[lane]->ReturnLocally(slot);  // never reached the peer: no credit will come
    absl::MutexLock health_lock(&health_mu_);
    HealthOf(peer).OnReleased(lane, slot);
  }
  slots_cv_.SignalAll();
  return owner;
}

void SenderImpl::OnWriteFailed(uint32_t peer_index, uint32_t lane, uint32_t slot,
                               const absl::Status& error) {
  if (peer_index >= peers_->size() || slot >= options_.slots) return;
  PeerConn* peer = peers_->at(peer_index);
  // Lane failover: a write error fails the lane for this peer at once; the failed write's tile
  // and every other tile waiting on the lane go out again on the remaining lanes.
  const std::string why = absl::StrCat("write error: ", error.message());
  const absl::Time now = absl::Now();
  std::vector<SlotOwner> tiles;
  bool any_left = false;
  std::string state;
  {
    absl::MutexLock lock(&peer->mu);
    if (lane >= peer->owners.size()) return;
    SlotOwner owner = std::move(peer->owners[lane][slot]);
    peer->owners[lane][slot] = SlotOwner{};
    if (owner.outbound) Unowned(lane);
    peer->credits[lane]->ReturnLocally(slot);  // never reached the peer: no credit will come
    {
      absl::MutexLock health_lock(&health_mu_);
      HealthOf(peer).OnReleased(lane, slot);
    }
    tiles = FailLaneLocked(peer, lane, now, why, &any_left, &state);
    if (owner.outbound) tiles.insert(tiles.begin(), std::move(owner));
  }
  slots_cv_.SignalAll();
  Resend(peer, lane, std::move(tiles), now, why, any_left, state);
}

// ---- lane failover ----

LaneHealth& SenderImpl::HealthOf(const PeerConn* peer) {
  std::unique_ptr<LaneHealth>& h = health_[peer];
  if (h == nullptr) {
    h = std::make_unique<LaneHealth>(lanes_->size(), options_.slots, options_.lane_timeout,
                                     options_.lane_cooldown, options_.liveness_timeout);
  }
  return *h;
}

std::vector<SlotOwner> SenderImpl::FailLaneLocked(PeerConn* peer, uint32_t lane, absl::Time now,
                                                  const std::string& why, bool* any_left,
                                                  std::string* state) {
  std::vector<uint32_t> slots;
  {
    absl::MutexLock health_lock(&health_mu_);
    LaneHealth& health = HealthOf(peer);
    slots = health.Fail(lane, now, why);
    *any_left = health.AnyLeft(now);
    *state = health.Describe();
  }
  std::vector<SlotOwner> tiles;
  for (uint32_t s : slots) {
    SlotOwner& o = peer->owners[lane][s];
    if (o.outbound) {
      Unowned(lane);
      tiles.push_back(std::move(o));
    }
    o = SlotOwner{};  // the slot stays used: a late credit (or a write error) frees it
  }
  return tiles;
}

void SenderImpl::Resend(PeerConn* peer, uint32_t lane, std::vector<SlotOwner> tiles,
                        absl::Time detected, const std::string& why, bool any_left,
                        const std::string& state) {
  const std::string lane_name = lanes_->at(lane).nic->name();
  if (!any_left) {
    spdlog::warn("fabric: lane {} to '{}' failed ({}); no lane to it is left: {}", lane_name,
                 peer->node_id, why, state);
    // The tiles taken from the lane are still counted in flight: finish them with the peer's
    // failure (FailPeer fails the transfers, the queued tiles and the other lanes' tiles).
    const absl::Status failed = absl::UnavailableError(
        absl::StrCat("peer '", peer->node_id, "': no fabric lane left (", state, ")"));
    FailPeer(peer, failed);
    for (SlotOwner& o : tiles) FinishTile(o.outbound, o.tile, failed);
    return;
  }
  std::vector<PackItem> items;
  std::vector<SlotOwner> ended;
  absl::flat_hash_map<Outbound*, uint32_t> per_transfer;
  for (SlotOwner& o : tiles) {
    Outbound& out = *o.outbound;
    absl::MutexLock lock(&out.mu);
    if (out.failed.has_value() || out.closed) {
      ended.push_back(std::move(o));
      continue;
    }
    if (out.inflight > 0) --out.inflight;  // queued again: counted in flight when re-taken
    if (per_transfer[&out]++ == 0) {
      ++out.failovers;
      out.failover_detected = detected;
      out.failover_what = absl::StrCat(lane_name, " to '", peer->node_id, "' failed (", why, ")");
    }
    items.push_back(PackItem{o.outbound, o.tile, true, detected});
  }
  spdlog::warn(
      "fabric: lane {} to '{}' failed ({}): {} tiles of {} transfers re-sent on the "
      "other lanes ({})",
      lane_name, peer->node_id, why, items.size(), per_transfer.size(), state);
  {
    absl::MutexLock lock(&health_mu_);
    tiles_resent_ += items.size();
  }
  {
    absl::MutexLock lock(&mu_);
    // At the front of their classes, in their order: they were the oldest tiles out.
    for (auto it = items.rbegin(); it != items.rend(); ++it) {
      queues_[static_cast<int>(it->out->job->priority())].push_front(std::move(*it));
    }
  }
  for (SlotOwner& o : ended) {
    absl::Status status;
    {
      absl::MutexLock lock(&o.outbound->mu);
      status = o.outbound->failed.value_or(absl::CancelledError("ended by the sender"));
    }
    FinishTile(o.outbound, o.tile, status);
  }
}

void SenderImpl::WatchLoop() {
  const absl::Duration tick =
      std::clamp(options_.lane_timeout / 20, absl::Milliseconds(1), absl::Milliseconds(20));
  while (!stop_.load()) {
    absl::SleepFor(tick);
    for (uint32_t p = 0; p < peers_->size(); ++p) {
      PeerConn* peer = peers_->at(p);
      const absl::Time now = absl::Now();
      std::vector<std::pair<uint32_t, std::string>> silent;
      {
        absl::MutexLock lock(&peer->mu);
        absl::MutexLock health_lock(&health_mu_);
        auto it = health_.find(peer);
        if (it == health_.end()) continue;
        silent = it->second->Silent(now);
      }
      for (const auto& [lane, why] : silent) {
        std::vector<SlotOwner> tiles;
        bool any_left = false;
        std::string state;
        {
          absl::MutexLock lock(&peer->mu);
          tiles = FailLaneLocked(peer, lane, now, why, &any_left, &state);
        }
        slots_cv_.SignalAll();
        Resend(peer, lane, std::move(tiles), now, why, any_left, state);
      }
    }
  }
}

std::map<std::string, double> SenderImpl::Gauges() const {
  absl::MutexLock lock(&health_mu_);
  double up = 0, failed = 0, probing = 0, failovers = 0;
  for (const auto& [peer, h] : health_) {
    failovers += static_cast<double>(h->failovers());
    for (uint32_t l = 0; l < h->lanes(); ++l) {
      switch (h->state(l)) {
        case LaneState::kUp:
          ++up;
          break;
        case LaneState::kFailed:
          ++failed;
          break;
        case LaneState::kProbing:
          ++probing;
          break;
      }
    }
  }
  return {
      {"fabric_lane_failovers_total", failovers},
      {"fabric_lanes_up", up},
      {"fabric_lanes_failed", failed},
      {"fabric_lanes_probing", probing},
      {"fabric_tiles_resent_total", static_cast<double>(tiles_resent_)},
      {"fabric_failover_first_resend_ms", last_resend_ms_},
      // Tiles through a relay slot in this process (this daemon), each side.
      {"fabric_relay_tiles_sent_total", static_cast<double>(ProcessRelayedTiles(RelaySide::kSend))},
      {"fabric_relay_tiles_received_total",
       static_cast<double>(ProcessRelayedTiles(RelaySide::kReceive))}};
}

void SenderImpl::FinishTile(const std::shared_ptr<Outbound>& out, uint32_t tile,
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

void SenderImpl::MaybeClose(const std::shared_ptr<Outbound>& out) {
  Closing closing{out, false, absl::OkStatus()};
  {
    absl::MutexLock lock(&out->mu);
    if (out->closed || out->inflight > 0) return;
    if (out->ok_tiles == out->job->plan().num_tiles()) {
      closing.end = true;
    } else if (out->failed.has_value() || out->removed) {
      closing.why = out->failed.value_or(absl::CancelledError("ended by the sender"));
    } else {
      return;
    }
    out->closed = true;
  }
  absl::MutexLock lock(&mu_);
  outbound_.erase(out->job.get());
  closing_.push_back(std::move(closing));
}

void SenderImpl::FailPeer(PeerConn* peer, const absl::Status& why) {
  std::vector<std::shared_ptr<Outbound>> outs;
  std::vector<PackItem> dropped;
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
  }
  for (auto& out : outs) {
    absl::MutexLock lock(&out->mu);
    if (!out->failed.has_value()) out->failed = why;
  }
  // In-flight tiles: their slots stay reserved (orphaned) until a late credit or a re-base.
  std::vector<SlotOwner> orphaned;
  {
    absl::MutexLock lock(&peer->mu);
    for (uint32_t l = 0; l < peer->owners.size(); ++l) {
      for (SlotOwner& o : peer->owners[l]) {
        if (o.outbound) {
          Unowned(l);
          orphaned.push_back(std::move(o));
        }
        o = SlotOwner{};
      }
    }
  }
  slots_cv_.SignalAll();
  for (auto& o : orphaned) FinishTile(o.outbound, o.tile, why);
  for (auto& item : dropped) item.out->job->OnTileDone(item.tile, why);
  for (auto& out : outs) MaybeClose(out);
  {
    // Membership: a lost peer's lanes start afresh when it is back (restarted with a
    // new boot id, or listed by the directory again): its failed lanes were its death, not theirs.
    absl::MutexLock lock(&health_mu_);
    health_.erase(peer);
  }
}

// ---- End / Abort (the closing thread) ----

void SenderImpl::CloseLoop() {
  while (true) {
    Closing closing;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !closing_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (closing_.empty()) return;
      closing = std::move(closing_.front());
      closing_.pop_front();
    }
    SendEnd(closing);
  }
}

void SenderImpl::SendEnd(const Closing& closing) {
  const Outbound& out = *closing.out;
  auto context = PeerCallContext(absl::Seconds(2));
  peer_v1::EndRemoteTransferResponse response;
  grpc::Status status;
  if (closing.end) {
    peer_v1::EndRemoteTransferRequest request;
    request.set_sender_node_id(options_.node_id);
    request.set_handle(out.handle);
    request.set_sender_transfer_id(out.id);
    status = out.peer->stub->EndRemoteTransfer(context.get(), request, &response);
  } else {
    peer_v1::AbortRemoteTransferRequest request;
    request.set_sender_node_id(options_.node_id);
    request.set_handle(out.handle);
    request.set_sender_transfer_id(out.id);
    request.set_error_code(static_cast<int32_t>(closing.why.code()));
    request.set_error_message(std::string(closing.why.message()));
    status = out.peer->stub->AbortRemoteTransfer(context.get(), request, &response);
  }
  if (!status.ok()) {
    spdlog::info("fabric: {} of transfer {} on '{}' not delivered: {}",
                 closing.end ? "end" : "abort", out.id, out.peer->node_id, status.error_message());
  }
}

}  // namespace

std::unique_ptr<Sender> Sender::Create(const FabricOptions& options, uint64_t boot_id, Lanes* lanes,
                                       PeerTable* peers, const directory::Directory* directory,
                                       Introduce introduce) {
  auto sender =
      std::make_unique<SenderImpl>(options, boot_id, lanes, peers, directory, std::move(introduce));
  sender->Start();
  return sender;
}

}  // namespace kvrail::fabric

// Internal to the fabric module: the Sender implementation, declared here so its parts can live
// in small files: the lifecycle, RemotePath, the engine queues and closing transfers (sender.cc),
// taking slots and posting tiles (sender_post.cc), credits, write failures and lane failover
// (sender_credits.cc). Nothing outside the sender includes it.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/directory/directory.h"
#include "daemon/engine/engine.h"
#include "daemon/fabric/fabric_options.h"
#include "daemon/fabric/lane_health.h"
#include "daemon/fabric/lane_route.h"
#include "daemon/fabric/lanes.h"
#include "daemon/fabric/peers.h"
#include "daemon/fabric/relay.h"
#include "daemon/fabric/sender.h"
#include "daemon/fabric/tile_copy.h"

namespace kvrail::fabric {

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

}  // namespace kvrail::fabric

// Internal to the fabric module: the implementation class, split over fabric.cc (data path) and
// peer_service.cc (control path).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <set>

#include "base/status.h"
#include "daemon/fabric/fabric_impl.h"

namespace kvrail::fabric {

// Thread contract: public methods are thread-safe. Threads: one proxy per lane, pack and unpack
// workers, the liveness thread and the control thread (End/Abort RPCs). mu_ guards the queues and
// transfer tables; each PeerConn, Outbound and Inbound has its own lock (never taken before mu_
// is released, except peer->mu under nothing else).
class FabricImpl final : public Fabric, public engine::Engine {
 public:
  FabricImpl(const FabricOptions& options, regions::RegionTable* regions,
             directory::Directory* directory)
      : options_(options), regions_(regions), directory_(directory) {}
  ~FabricImpl() override;
  absl::Status Init();
  // Installs the Peer service and starts the control thread (End/Abort RPCs).
  void StartControl(std::unique_ptr<grpc::Service> service);

  // Fabric
  grpc::Service* peer_service() override { return service_.get(); }
  void StartLiveness() override;
  std::string Describe() const override;
  void SetInboundSink(transfers::InboundSink* sink) override;

  // transfers::RemotePath
  absl::StatusOr<Prepared> Prepare(const v1::TransferSpec& spec) override;
  absl::StatusOr<std::vector<std::string>> Begin(uint64_t id, const v1::TransferSpec& spec,
                                                 const regions::Region& src, uint64_t tile_bytes,
                                                 const std::shared_ptr<engine::Job>& job) override;

  // engine::Engine (the sender engine of fabric transfers)
  std::string name() const override { return "fabric"; }
  void Enqueue(const std::shared_ptr<engine::Job>& job, const std::vector<uint32_t>& tiles) override;
  size_t Remove(const engine::Job* job) override;
  std::vector<uint64_t> QueuedTiles() const override;

  // Peer service handlers (peer_service.cc).
  absl::StatusOr<v1::PeerHello> OnHello(const v1::PeerHello& hello);
  absl::StatusOr<v1::RegionLease> OnExport(uint64_t region_id, const std::string& peer_node);
  absl::StatusOr<v1::RegionLease> OnGetLease(uint64_t region_id, const std::string& requester);
  absl::StatusOr<uint32_t> OnBegin(const v1::BeginRemoteTransferRequest& request);
  absl::StatusOr<uint32_t> OnEnd(const std::string& sender, uint32_t handle, bool abort,
                                 const std::string& why);
  void OnHeartbeat(const std::string& node_id, uint64_t boot_id);
  uint64_t boot_id() const { return boot_id_; }
  const std::string& node_id() const { return options_.node_id; }

 private:
  // Scatters an arrived tile of `in` (once: a repeat is not applied again) and reports it to the
  // local record; whether it was applied.
  bool ApplyTile(Inbound& in, const Arrival& a);
  // Ends `in`'s local record (if any) with `why` unless it has ended; then no tile of it reports.
  void EndInboundRecord(Inbound& in, const absl::Status& why);

  // The TransferManager, for inbound records; readers hold sink_mu_ while they call it.
  mutable absl::Mutex sink_mu_;
  transfers::InboundSink* sink_ ABSL_GUARDED_BY(sink_mu_) = nullptr;

  struct PackItem {
    std::shared_ptr<Outbound> out;
    uint32_t tile = 0;
  };

  uint64_t PerPeerBytes() const;
  uint8_t* SendSlot(uint32_t lane, uint32_t peer, uint32_t slot) const;
  uint8_t* RecvSlot(uint32_t lane, uint32_t peer, uint32_t slot) const;
  uint64_t* CreditWords(uint32_t lane, uint32_t peer) const;
  PeerConn* FindPeer(const std::string& node_id) const;

  // Data path (fabric.cc).
  bool HasPackWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasArrivals() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PackLoop();
  void UnpackLoop();
  void ProxyLoop(Lane* lane);
  ssize_t PostWrite(Lane* lane, const kernels::NicCommand& cmd);
  ssize_t PostCredit(Lane* lane, const CreditOp& op);
  void OnCredit(uint32_t lane, uint32_t peer_index, uint32_t slot, uint32_t tile, bool applied);
  void OnWriteFailed(uint32_t peer_index, uint32_t lane, uint32_t slot, const absl::Status& error);
  // Frees `slot` of `lane` toward `peer` whose write never reached the wire (no credit will
  // come for it) and wakes waiting packers; returns who owned it.
  SlotOwner ReleaseUnsentSlot(PeerConn* peer, uint32_t lane, uint32_t slot);
  void FinishTile(const std::shared_ptr<Outbound>& out, uint32_t tile, const absl::Status& status);
  void MaybeClose(const std::shared_ptr<Outbound>& out);
  void FailPeer(PeerConn* peer, const absl::Status& why);

  // Control path (peer_service.cc).
  v1::PeerHello HelloFor(const PeerConn& peer) const;
  absl::Status ApplyHello(PeerConn* peer, const v1::PeerHello& hello);
  absl::Status Introduce(PeerConn* peer);
  void LivenessLoop();
  void ControlLoop();
  void SendEnd(const std::shared_ptr<Outbound>& out, bool end, const absl::Status& why);

  const FabricOptions options_;
  regions::RegionTable* const regions_;
  directory::Directory* const directory_;
  const uint64_t boot_id_ = MakeBootId();
  static uint64_t MakeBootId();

  std::vector<std::unique_ptr<Lane>> lanes_;
  std::vector<std::unique_ptr<PeerConn>> peers_;  // fixed after Init
  std::unique_ptr<grpc::Service> service_;
  std::vector<std::thread> workers_;
  std::thread liveness_;
  std::thread control_;
  std::atomic<bool> stop_{false};
  absl::CondVar slots_cv_;  // a slot may have been freed (waited on under a peer's mu)

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<PackItem> queues_[engine::kNumPriorityClasses] ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<const engine::Job*, std::shared_ptr<Outbound>> outbound_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::shared_ptr<Inbound>> inbound_ ABSL_GUARDED_BY(mu_);
  uint32_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<Arrival> arrivals_ ABSL_GUARDED_BY(mu_);
  std::deque<std::function<void()>> control_queue_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::set<std::string>> exports_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvrail::fabric

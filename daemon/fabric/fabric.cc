// The fabric facade: builds the parts (peer table, lanes, leases, receiver, sender, peer control,
// the Peer service), wires them together and stops them in order. Peers join while it runs (peer
// control adds them from the directory, each with its staging). The parts are lanes.h,
// sender.h, receiver.h, peer_control.h and peer_service.h.
#include "daemon/fabric/fabric.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <utility>

#include "base/status.h"
#include "daemon/fabric/lane_route.h"
#include "daemon/fabric/lanes.h"
#include "daemon/fabric/leases.h"
#include "daemon/fabric/peer_control.h"
#include "daemon/fabric/peer_service.h"
#include "daemon/fabric/peers.h"
#include "daemon/fabric/receiver.h"
#include "daemon/fabric/sender.h"
#include "spdlog/spdlog.h"

namespace kvrail::fabric {
namespace {

// Thread contract: see Fabric. The members are set in Create and fixed afterwards; each part is
// thread-safe on its own. Destruction stops the threads in dependency order: liveness (it may
// fail transfers), the sender's packers and closing thread, the receiver's unpackers, then the
// proxies (which report to the sender and the receiver).
class FabricImpl final : public Fabric {
 public:
  ~FabricImpl() override;
  static absl::StatusOr<std::unique_ptr<Fabric>> Create(const FabricOptions& options,
                                                        regions::RegionTable* regions,
                                                        const access::Grants* grants,
                                                        directory::Directory* directory);

  // Fabric
  grpc::Service* peer_service() override { return service_.get(); }
  absl::StatusOr<v1::RegionLease> ExportRegion(uint64_t region_id,
                                               const std::string& peer_node) override {
    return leases_->Export(region_id, peer_node);
  }
  void StartLiveness() override { control_->StartLiveness(); }
  std::string Describe() const override { return lanes_->Describe(); }
  void SetInboundSink(transfers::InboundSink* sink) override {
    receiver_->SetInboundSink(sink);
    absl::MutexLock lock(&sink_mu_);
    sink_ = sink;
  }

  // transfers::RemotePath: the sender's.
  absl::StatusOr<Prepared> Prepare(const v1::TransferSpec& spec) override {
    // A peer the directory has but the liveness round has not added yet is added now.
    control_->FindOrAdd(spec.dst().node_id());
    return sender_->Prepare(spec);
  }
  absl::StatusOr<std::vector<std::string>> Begin(uint64_t id, const v1::TransferSpec& spec,
                                                 const regions::Region& src, uint64_t tile_bytes,
                                                 const std::shared_ptr<engine::Job>& job) override {
    return sender_->Begin(id, spec, src, tile_bytes, job);
  }
  const engine::Engine* engine() const override { return sender_.get(); }

 private:
  FabricImpl() = default;
  // A peer is down or restarted: every transfer from or to it fails with `why`.
  void OnPeerLost(PeerConn* peer, const absl::Status& why);

  // Declared in construction order; destroyed in reverse, after the destructor's Stop calls.
  std::unique_ptr<PeerTable> peers_;
  std::unique_ptr<Lanes> lanes_;
  std::unique_ptr<Leases> leases_;
  std::unique_ptr<Receiver> receiver_;
  std::unique_ptr<Sender> sender_;
  std::unique_ptr<PeerControl> control_;
  std::unique_ptr<grpc::Service> service_;
  // The transfer manager, told of lost peers (InboundSink::PeerLost); held while it is called.
  absl::Mutex sink_mu_;
  transfers::InboundSink* sink_ ABSL_GUARDED_BY(sink_mu_) = nullptr;
};

// The net interface holding IPv4 `address` ("" when none does, or it cannot be read).
std::string InterfaceOf(const std::string& address) {
  in_addr want{};
  if (inet_pton(AF_INET, address.c_str(), &want) != 1) return "";
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string name;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == want.s_addr) {
      name = a->ifa_name;
      break;
    }
  }
  freeifaddrs(list);
  return name;
}

absl::StatusOr<std::unique_ptr<Fabric>> FabricImpl::Create(const FabricOptions& given,
                                                           regions::RegionTable* regions,
                                                           const access::Grants* grants,
                                                           directory::Directory* directory) {
  // The options first, so a bad fabric.* key is reported before anything about the peers.
  KVRAIL_RETURN_IF_ERROR(Lanes::CheckOptions(given));
  FabricOptions options = given;
  if (options.topology != nullptr && options.lane_nics.empty()) {
    // Each lane's topology NIC, from its address's interface (rail-aware lane choice).
    for (const std::string& address : options.nic_addresses) {
      options.lane_nics.push_back(NicOfInterface(*options.topology, InterfaceOf(address)));
    }
  }
  std::unique_ptr<FabricImpl> fabric(new FabricImpl());
  FabricImpl* f = fabric.get();
  const uint64_t boot_id = MakeBootId();
  f->peers_ = std::make_unique<PeerTable>(options.tls);
  // A retired peer's index is reused only after any tile or credit of it could still be in
  // flight: its own liveness fails its transfers to us within liveness_timeout, a lane's within
  // lane_timeout; twice that (docs/fabric.md "Membership").
  f->peers_->set_quarantine(2 * (options.liveness_timeout + options.lane_timeout));
  KVRAIL_ASSIGN_OR_RETURN(f->lanes_, Lanes::Create(options, f->peers_.get()));
  f->leases_ = std::make_unique<Leases>(options.node_id, regions, f->peers_.get());
  f->receiver_ = Receiver::Create(options, f->lanes_.get(), f->peers_.get(), f->leases_.get(),
                                  regions, grants);
  // Peer control and the sender need each other (a lost peer fails the sender's transfers; the
  // sender introduces a peer that is not up): both calls go through this facade, and neither
  // happens before Create returns (the liveness thread and the service start later).
  f->control_ = PeerControl::Create(
      options, boot_id, f->lanes_.get(), f->peers_.get(), directory,
      [f](PeerConn* peer, const absl::Status& why) { f->OnPeerLost(peer, why); });
  // The directory's peers now (in its order: node ids sorted); later ones join through the
  // liveness round (PeerControl::SyncDirectory) or their Hello.
  for (const directory::Peer& p : directory->Peers()) {
    if (p.node_id == options.node_id) continue;
    KVRAIL_RETURN_IF_ERROR(f->control_->AddPeer(p).status());
  }
  f->sender_ = Sender::Create(options, boot_id, f->lanes_.get(), f->peers_.get(), directory,
                              [f](PeerConn* peer) { return f->control_->Introduce(peer); });
  f->control_->SetBusyCheck([f](const PeerConn* peer) {
    return f->sender_->HasTransfers(peer) || f->receiver_->HasTransfers(peer);
  });
  f->lanes_->StartProxies(f->sender_.get(), f->receiver_.get());
  f->service_ =
      MakePeerService(options.node_id, boot_id, f->control_.get(), f->leases_.get(),
                      f->receiver_.get(), /*require_certificates=*/options.tls != nullptr);
  spdlog::info("{}", f->Describe());
  return std::unique_ptr<Fabric>(std::move(fabric));
}

FabricImpl::~FabricImpl() {
  if (control_) control_->Stop();
  if (sender_) sender_->Stop();
  if (receiver_) receiver_->Stop();
  if (lanes_) lanes_->Stop();
}

void FabricImpl::OnPeerLost(PeerConn* peer, const absl::Status& why) {
  receiver_->DropPeer(peer, why);
  sender_->FailPeer(peer, why);
  // Transfers to the peer with nothing in the fabric (a layer-wise one waiting for its next
  // layer) end now too, not at their deadline.
  absl::MutexLock lock(&sink_mu_);
  if (sink_ != nullptr) sink_->PeerLost(peer->node_id, why);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Fabric>> Fabric::Create(const FabricOptions& options,
                                                       regions::RegionTable* regions,
                                                       const access::Grants* grants,
                                                       directory::Directory* directory) {
  return FabricImpl::Create(options, regions, grants, directory);
}

}  // namespace kvrail::fabric

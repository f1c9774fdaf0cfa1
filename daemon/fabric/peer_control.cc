#include "daemon/fabric/peer_control.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "base/status.h"
#include "daemon/fabric/peer_auth.h"
#include "daemon/fabric/peer_rpc.h"
#include "spdlog/spdlog.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

namespace {

// Thread contract: see PeerControl. Fields are fixed after construction but for the liveness
// thread (started and joined by the owner) and stop_.
class PeerControlImpl final : public PeerControl {
 public:
  PeerControlImpl(const FabricOptions& options, uint64_t boot_id, Lanes* lanes, PeerTable* peers,
                  directory::Directory* directory, PeerLost on_lost)
      : options_(options),
        boot_id_(boot_id),
        lanes_(lanes),
        peers_(peers),
        directory_(directory),
        on_lost_(std::move(on_lost)) {}
  ~PeerControlImpl() override { Stop(); }

  absl::StatusOr<PeerConn*> AddPeer(const directory::Peer& peer) override;
  PeerConn* FindOrAdd(const std::string& node_id) override;
  void SyncDirectory() override;
  void Reclaim(absl::Time now) override;
  void SetBusyCheck(std::function<bool(const PeerConn*)> busy) override {
    absl::MutexLock lock(&busy_mu_);
    busy_ = std::move(busy);
  }
  absl::Status Introduce(PeerConn* peer) override;
  absl::StatusOr<peer_v1::PeerHello> OnHello(const peer_v1::PeerHello& hello) override;
  void OnHeartbeat(const std::string& node_id, uint64_t boot_id) override;
  void StartLiveness() override;
  void Stop() override;

 private:
  peer_v1::PeerHello HelloFor(const PeerConn& peer) const;
  absl::Status ApplyHello(PeerConn* peer, const peer_v1::PeerHello& hello);
  void LivenessLoop();
  // Whether `peer` is still withdrawn: cleared (and false) once the directory lists it again.
  bool StillWithdrawn(PeerConn* peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer->mu);
  // The directory's word on a peer of the table (SyncDirectory).
  void ApplyDirectoryState(PeerConn* peer);
  // One round for `peer`: Hello or Heartbeat, then up, or down after liveness_timeout.
  void CheckPeer(PeerConn* peer);
  // Marks down every up peer silent for more than liveness_timeout (between rounds).
  void SweepSilent();
  // Retires `peer` from the table at `now` and removes its addresses from the lanes.
  absl::Status RetirePeer(PeerConn* peer, absl::Time now);
  // The directory names `listed.address` for `peer` (another address): re-dial (SyncDirectory).
  void Redial(PeerConn* peer, const directory::Peer& listed);

  const FabricOptions options_;
  const uint64_t boot_id_;
  Lanes* const lanes_;
  PeerTable* const peers_;
  directory::Directory* const directory_;
  const PeerLost on_lost_;
  std::thread liveness_;
  std::atomic<bool> stop_{false};
  // Nodes AddPeer refused (logged once each, not every round).
  absl::Mutex refused_mu_;
  absl::flat_hash_set<std::string> refused_ ABSL_GUARDED_BY(refused_mu_);
  absl::Mutex busy_mu_;
  std::function<bool(const PeerConn*)> busy_ ABSL_GUARDED_BY(busy_mu_);
};

// The directory lists `node` and does not say it is down (or gone).
bool Listed(const directory::Directory& directory, const std::string& node) {
  absl::StatusOr<directory::Peer> p = directory.Lookup(node);
  return p.ok() && p->state != directory::PeerState::kDown;
}

absl::StatusOr<PeerConn*> PeerControlImpl::AddPeer(const directory::Peer& peer) {
  absl::StatusOr<PeerConn*> added =
      peers_->Add(peer, [this](PeerConn* conn) { return lanes_->AddPeer(conn); });
  if (added.ok()) {
    spdlog::info("fabric: peer '{}' at {} added (index {}, staging on {} lanes)", peer.node_id,
                 peer.address, (*added)->index, lanes_->size());
    return added;
  }
  if (added.status().code() == absl::StatusCode::kAlreadyExists) {
    if (PeerConn* known = peers_->Find(peer.node_id)) return known;
  }
  bool first;
  {
    absl::MutexLock lock(&refused_mu_);
    first = refused_.insert(peer.node_id).second;
  }
  if (first) spdlog::error("fabric: {}", added.status().ToString());
  return added.status();
}

PeerConn* PeerControlImpl::FindOrAdd(const std::string& node_id) {
  if (PeerConn* peer = peers_->Find(node_id)) return peer;
  absl::StatusOr<directory::Peer> listed = directory_->Lookup(node_id);
  if (!listed.ok() || listed->state == directory::PeerState::kDown) return nullptr;
  absl::StatusOr<PeerConn*> added = AddPeer(*listed);
  return added.ok() ? *added : nullptr;
}

void PeerControlImpl::SyncDirectory() {
  for (const directory::Peer& p : directory_->Peers()) {
    if (p.node_id == options_.node_id) continue;
    PeerConn* peer = peers_->Find(p.node_id);
    if (peer == nullptr) {
      // A node gone before we met it is not added (it would only cost staging).
      if (p.state != directory::PeerState::kDown) (void)AddPeer(p);
      continue;
    }
    if (!p.address.empty() && p.address != peer->address &&
        p.state != directory::PeerState::kDown) {
      Redial(peer, p);
      continue;
    }
    ApplyDirectoryState(peer);
  }
}

absl::Status PeerControlImpl::RetirePeer(PeerConn* peer, absl::Time now) {
  KVRAIL_RETURN_IF_ERROR(peers_->Retire(peer, now));
  absl::MutexLock lock(&peer->mu);
  // Its lanes: the addresses leave the address vectors (the provider's connections to it close;
  // nothing is posted to it any more: the proxies skip retired peers).
  for (uint32_t l = 0; l < peer->remote.size() && l < lanes_->size(); ++l) {
    PeerConn::Remote& r = peer->remote[l];
    if (r.addr != FI_ADDR_UNSPEC) lanes_->at(l).nic->RemoveAddress(r.addr);
    r = PeerConn::Remote{};
  }
  peer->lanes = 0;
  peer->up = false;
  peer->introduced = false;
  return absl::OkStatus();
}

void PeerControlImpl::Redial(PeerConn* peer, const directory::Peer& listed) {
  const std::string old_address = peer->address;
  {
    absl::MutexLock lock(&peer->mu);
    peer->up = false;
  }
  spdlog::warn("fabric: peer '{}' moved from {} to {}: re-dialing (new stub, new lanes, hello)",
               peer->node_id, old_address, listed.address);
  on_lost_(peer, absl::UnavailableError(absl::StrCat("peer '", peer->node_id, "' moved from ",
                                                     old_address, " to ", listed.address,
                                                     " (its directory record changed)")));
  const absl::Status retired = RetirePeer(peer, absl::Now());
  if (!retired.ok()) {
    spdlog::error("fabric: re-dialing '{}': {}", peer->node_id, retired.ToString());
    return;
  }
  absl::StatusOr<PeerConn*> added = AddPeer(listed);
  if (!added.ok()) {
    spdlog::error("fabric: re-dialing '{}' at {}: {}", peer->node_id, listed.address,
                  added.status().ToString());
  }
}

void PeerControlImpl::Reclaim(absl::Time now) {
  std::function<bool(const PeerConn*)> busy;
  {
    absl::MutexLock lock(&busy_mu_);
    busy = busy_;
  }
  for (PeerConn* peer : peers_->Snapshot()) {
    absl::StatusOr<directory::Peer> listed = directory_->Lookup(peer->node_id);
    {
      absl::MutexLock lock(&peer->mu);
      // Dropped by the directory: absent, its record gone (etcd), or withdrawn (it vanished while
      // up here). A peer merely silent (our own MarkDown) is not: it may answer again.
      const bool dropped =
          !listed.ok() || (listed->has_record && !listed->registered) || peer->withdrawn;
      if (!dropped || peer->up) continue;
      if (listed.ok() && listed->state != directory::PeerState::kDown) continue;
    }
    if (busy && busy(peer)) continue;
    const absl::Status retired = RetirePeer(peer, now);
    if (retired.ok()) {
      spdlog::info("fabric: peer '{}' left: index {} (generation {}) reclaimed after a quarantine",
                   peer->node_id, peer->index, peer->generation);
    }
  }
  for (uint32_t index :
       peers_->EndQuarantine(now, [this](uint32_t i) { lanes_->ReleasePeer(i); })) {
    KVRAIL_DEBUG("fabric: peer index {} is free again (staging released)", index);
  }
}

bool PeerControlImpl::StillWithdrawn(PeerConn* peer) {
  if (peer->withdrawn && Listed(*directory_, peer->node_id)) {
    peer->withdrawn = false;
    spdlog::info("fabric: peer '{}' is back in the directory", peer->node_id);
  }
  return peer->withdrawn;
}

void PeerControlImpl::ApplyDirectoryState(PeerConn* peer) {
  {
    // Read under the peer's lock: our own MarkUp/MarkDown are made under it too, so a kDown seen
    // here while the peer is up is the directory's (the record vanished), not ours.
    absl::MutexLock lock(&peer->mu);
    if (peer->withdrawn) {
      StillWithdrawn(peer);
      return;
    }
    if (!peer->up || Listed(*directory_, peer->node_id)) return;
    peer->up = false;
    peer->withdrawn = true;
  }
  spdlog::warn("fabric: peer '{}' left the directory: down", peer->node_id);
  on_lost_(peer, absl::UnavailableError(absl::StrCat(
                     "peer '", peer->node_id, "' at ", peer->address,
                     " is down: its directory record is gone (lease ended or it left)")));
}

peer_v1::PeerHello PeerControlImpl::HelloFor(const PeerConn& peer) const {
  peer_v1::PeerHello hello;
  hello.set_version(1);
  hello.set_node_id(options_.node_id);
  hello.set_boot_id(boot_id_);
  hello.set_provider(lanes_->provider());
  for (uint32_t l = 0; l < lanes_->size(); ++l) {
    const Lane& lane = lanes_->at(l);
    peer_v1::PeerNic* nic = hello.add_nics();
    nic->set_name(lane.nic->name());
    nic->set_fabric_address(lane.nic->address());
    // The registration of this peer's receive slots and credit words only, under a random key
    // that only this peer is told (over mTLS): other peers' writes to it are refused by the
    // provider, and writes with this key reach nothing outside this peer's range.
    const MemoryRegion& mr = lanes_->PeerRegistration(l, peer.index);
    nic->set_mr_key(mr.key());
    const uint8_t* base = mr.base();
    nic->set_recv_base(mr.remote_base() + (lanes_->RecvSlot(l, peer.index, 0) - base));
    nic->set_credit_base(mr.remote_base() +
                         (reinterpret_cast<uint8_t*>(lanes_->CreditWords(l, peer.index)) - base));
  }
  hello.set_slots(options_.slots);
  hello.set_slot_bytes(options_.slot_bytes);
  hello.set_your_index(peer.index);
  hello.set_your_index_generation(peer.generation);
  hello.set_topology_summary(options_.topology_summary);
  hello.set_software_version(options_.software_version);
  return hello;
}

absl::Status PeerControlImpl::ApplyHello(PeerConn* peer, const peer_v1::PeerHello& hello) {
  if (hello.version() != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "peer '", hello.node_id(), "' speaks peer protocol ", hello.version(), ", not 1"));
  }
  if (hello.provider() != lanes_->provider()) {
    return absl::FailedPreconditionError(absl::StrCat("peer '", hello.node_id(),
                                                      "' uses provider '", hello.provider(),
                                                      "', this daemon '", lanes_->provider(), "'"));
  }
  if (hello.slots() != options_.slots || hello.slot_bytes() != options_.slot_bytes ||
      hello.nics_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "peer '", hello.node_id(), "' staging (", hello.slots(), " x ", hello.slot_bytes(),
        ") differs from this daemon's (fabric.slots, fabric.slot_bytes must match)"));
  }
  // fi_av_insert reads as many bytes as the provider's address format has, whatever the
  // string's length: a peer's address must be exactly as long as ours.
  for (int l = 0; l < hello.nics_size() && l < static_cast<int>(lanes_->size()); ++l) {
    const size_t ours = lanes_->at(l).nic->address().size();
    if (hello.nics(l).fabric_address().size() != ours) {
      return absl::InvalidArgumentError(absl::StrCat(
          "hello.nics[", l, "].fabric_address: ", hello.nics(l).fabric_address().size(),
          " bytes from peer '", peer->node_id, "', provider '", lanes_->provider(),
          "' addresses have ", ours));
    }
  }
  bool restarted = false, readded = false;
  uint32_t old_index = 0;
  {
    absl::MutexLock lock(&peer->mu);
    if (StillWithdrawn(peer)) {
      return absl::UnavailableError(
          absl::StrCat("peer '", peer->node_id, "' is not in the directory (its record is gone)"));
    }
    restarted = peer->introduced && peer->boot_id != hello.boot_id();
    // The same process, but it retired our entry (we were silent past its liveness timeout and
    // our directory record lapsed: a stall) and added us again under a new index or generation:
    // new staging, keys and consume counters there. Our tiles out to the old entry are never
    // credited and our slot counts no longer match its counters, so the pairing starts afresh as
    // after a restart; keeping the old state left every slot to it waiting forever.
    readded = peer->introduced && !restarted &&
              (peer->index_at_peer != hello.your_index() ||
               peer->generation_at_peer != hello.your_index_generation());
    old_index = peer->index_at_peer;
  }
  if (restarted) {
    spdlog::warn("fabric: peer '{}' restarted (boot id changed)", peer->node_id);
    on_lost_(peer, absl::UnavailableError(absl::StrCat("peer '", peer->node_id, "' restarted")));
  } else if (readded) {
    spdlog::warn(
        "fabric: peer '{}' dropped this node and added it again (index {} -> {}): its "
        "lanes start afresh",
        peer->node_id, old_index, hello.your_index());
    on_lost_(peer, absl::UnavailableError(absl::StrCat(
                       "peer '", peer->node_id,
                       "' dropped this node (silent past its liveness timeout) and re-added it")));
  }
  absl::MutexLock lock(&peer->mu);
  if (peer->introduced && peer->boot_id == hello.boot_id() &&
      peer->index_at_peer == hello.your_index() &&
      peer->generation_at_peer == hello.your_index_generation()) {
    // Already applied (both sides say hello).
    peer->up = true;
    peer->last_ok = absl::Now();
    return absl::OkStatus();
  }
  const uint32_t lanes = std::min<uint32_t>(lanes_->size(), hello.nics_size());
  for (uint32_t l = 0; l < lanes_->size(); ++l) {
    PeerConn::Remote& r = peer->remote[l];
    if (r.addr != FI_ADDR_UNSPEC) lanes_->at(l).nic->RemoveAddress(r.addr);
    r = PeerConn::Remote{};
    if (l >= lanes) continue;
    const peer_v1::PeerNic& nic = hello.nics(l);
    KVRAIL_ASSIGN_OR_RETURN(r.addr, lanes_->at(l).nic->InsertAddress(nic.fabric_address()));
    r.key = nic.mr_key();
    r.recv_base = nic.recv_base();
    r.credit_base = nic.credit_base();
    r.nic_name = nic.name();
    if (restarted || readded) {
      peer->credits[l]->Rebase();
      std::fill(peer->consumed[l].begin(), peer->consumed[l].end(), 0);
    }
  }
  peer->lanes = lanes;
  peer->index_at_peer = hello.your_index();
  peer->generation_at_peer = hello.your_index_generation();
  peer->boot_id = hello.boot_id();
  peer->peer_slot_bytes = hello.slot_bytes();
  peer->introduced = true;
  peer->up = true;
  peer->last_ok = absl::Now();
  directory_->MarkUp(peer->node_id, peer->last_ok, peer->boot_id);
  spdlog::info("fabric: peer '{}' introduced: {} lanes, provider {}, {}", peer->node_id, lanes,
               hello.provider(), hello.topology_summary());
  return absl::OkStatus();
}

absl::Status PeerControlImpl::Introduce(PeerConn* peer) {
  {
    absl::MutexLock lock(&peer->mu);
    if (StillWithdrawn(peer)) {
      return absl::UnavailableError(
          absl::StrCat("peer '", peer->node_id, "' is down: its directory record is gone"));
    }
  }
  peer_v1::HelloRequest request;
  *request.mutable_hello() = HelloFor(*peer);
  peer_v1::HelloResponse response;
  auto context = PeerCallContext(absl::Seconds(2));
  KVRAIL_RETURN_IF_ERROR(
      FromPeerRpc(peer->stub->Hello(context.get(), request, &response),
                  absl::StrCat("hello to '", peer->node_id, "' at ", peer->address, ": ")));
  // With mTLS the channel accepted only a certificate naming the peer (as its first CN: one CN
  // exactly, checked here); the answer must name it too (and, either way, be of bounded size).
  KVRAIL_RETURN_IF_ERROR(CheckServerCertificate(*context, peer->node_id,
                                                absl::StrCat("hello to '", peer->node_id, "': ")));
  KVRAIL_RETURN_IF_ERROR(CheckHelloBounds(response.hello(), "response.hello."));
  KVRAIL_RETURN_IF_ERROR(
      CheckClaimedNode(response.hello().node_id(), peer->node_id, "response.hello.node_id"));
  return ApplyHello(peer, response.hello());
}

absl::StatusOr<peer_v1::PeerHello> PeerControlImpl::OnHello(const peer_v1::PeerHello& hello) {
  PeerConn* peer = FindOrAdd(hello.node_id());
  if (peer == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("node '", hello.node_id(), "' is not in this daemon's peer directory"));
  }
  KVRAIL_RETURN_IF_ERROR(ApplyHello(peer, hello));
  return HelloFor(*peer);
}

void PeerControlImpl::OnHeartbeat(const std::string& node_id, uint64_t boot_id) {
  PeerConn* peer = peers_->Find(node_id);
  if (peer == nullptr) return;
  absl::MutexLock lock(&peer->mu);
  if (peer->introduced && peer->boot_id == boot_id && !peer->withdrawn) {
    peer->last_ok = absl::Now();
    directory_->MarkUp(node_id, peer->last_ok, boot_id);
  }
}

void PeerControlImpl::StartLiveness() {
  liveness_ = std::thread([this] { LivenessLoop(); });
}

void PeerControlImpl::Stop() {
  stop_.store(true);
  if (liveness_.joinable()) liveness_.join();
}

void PeerControlImpl::LivenessLoop() {
  while (!stop_.load()) {
    SyncDirectory();
    Reclaim(absl::Now());
    for (PeerConn* peer : peers_->Snapshot()) CheckPeer(peer);
    // Between rounds, every 10 ms: a peer silent past liveness_timeout is down now, not at the
    // next round (up to heartbeat_interval later).
    for (absl::Duration left = options_.heartbeat_interval;
         left > absl::ZeroDuration() && !stop_.load(); left -= absl::Milliseconds(10)) {
      absl::SleepFor(std::min(left, absl::Milliseconds(10)));
      SweepSilent();
    }
  }
}

void PeerControlImpl::SweepSilent() {
  const absl::Time now = absl::Now();
  for (PeerConn* peer : peers_->Snapshot()) {
    absl::Duration silent;
    std::string last_error;
    {
      absl::MutexLock lock(&peer->mu);
      if (peer->withdrawn || !peer->up || peer->last_ok == absl::InfinitePast() ||
          now - peer->last_ok <= options_.liveness_timeout) {
        continue;
      }
      peer->up = false;
      silent = now - peer->last_ok;
      last_error = peer->last_error;
      directory_->MarkDown(peer->node_id);
    }
    spdlog::warn("fabric: peer '{}' is down (last error: {})", peer->node_id, last_error);
    on_lost_(peer, absl::UnavailableError(absl::StrCat(
                       "peer '", peer->node_id, "' at ", peer->address, " is down: no answer for ",
                       absl::FormatDuration(silent), " (", last_error, ")")));
  }
}

void PeerControlImpl::CheckPeer(PeerConn* peer) {
  bool introduced;
  uint64_t seq, known_boot;
  {
    absl::MutexLock lock(&peer->mu);
    if (peer->withdrawn) return;  // down already; SyncDirectory brings it back
    introduced = peer->introduced;
    seq = ++peer->heartbeat_seq;
    known_boot = peer->boot_id;
  }
  absl::Status status;
  if (!introduced) {
    status = Introduce(peer);
  } else {
    peer_v1::HeartbeatRequest request;
    request.set_node_id(options_.node_id);
    request.set_boot_id(boot_id_);
    request.set_sequence(seq);
    peer_v1::HeartbeatResponse response;
    auto context = PeerCallContext(std::min(options_.liveness_timeout / 2, absl::Seconds(1)),
                                   /*wait_for_ready=*/false);
    status = FromPeerRpc(peer->stub->Heartbeat(context.get(), request, &response), "heartbeat: ");
    if (status.ok() && response.boot_id() != known_boot) status = Introduce(peer);
  }
  const absl::Time now = absl::Now();
  bool newly_down = false;
  absl::Duration silent;
  {
    absl::MutexLock lock(&peer->mu);
    if (!status.ok()) peer->last_error = std::string(status.message());
    if (peer->withdrawn) {
      // Withdrawn meanwhile (an OnHello could not clear it): the directory's word stands.
    } else if (status.ok()) {
      peer->up = true;
      peer->last_ok = now;
      directory_->MarkUp(peer->node_id, now, peer->boot_id);
    } else if (peer->last_ok == absl::InfinitePast()) {
      directory_->MarkDown(peer->node_id);
    } else if (peer->up && now - peer->last_ok > options_.liveness_timeout) {
      peer->up = false;
      newly_down = true;
      silent = now - peer->last_ok;
      directory_->MarkDown(peer->node_id);
    }
  }
  if (newly_down) {
    spdlog::warn("fabric: peer '{}' is down ({})", peer->node_id, status.ToString());
    on_lost_(peer, absl::UnavailableError(absl::StrCat(
                       "peer '", peer->node_id, "' at ", peer->address, " is down: no answer for ",
                       absl::FormatDuration(silent), " (", status.message(), ")")));
  }
}

}  // namespace

std::unique_ptr<PeerControl> PeerControl::Create(const FabricOptions& options, uint64_t boot_id,
                                                 Lanes* lanes, PeerTable* peers,
                                                 directory::Directory* directory,
                                                 PeerLost on_lost) {
  return std::make_unique<PeerControlImpl>(options, boot_id, lanes, peers, directory,
                                           std::move(on_lost));
}

}  // namespace kvrail::fabric

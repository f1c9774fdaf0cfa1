// Internal to the fabric module: peer control. Membership (peers that appear in the directory are
// added to the table with their staging; peers the directory drops are down), Hello (exchanging
// endpoints, staging addresses and indices; a changed boot id means the peer restarted), the
// heartbeat loop that declares a silent peer down, and the answers to a peer's Hello and
// Heartbeat. The Peer gRPC service that serves
// them is peer_service.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/directory/directory.h"
#include "daemon/fabric/fabric_options.h"
#include "daemon/fabric/lanes.h"
#include "daemon/fabric/peers.h"
#include "proto/kvrail/peer/v1/peer.pb.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

// Thread contract: thread-safe (all state is the peers', under their locks). Threads of its own:
// the liveness thread, once StartLiveness is called. Hello and Heartbeat come on gRPC threads,
// Introduce also from the sender.
class PeerControl {
 public:
  // What to do when a peer is lost (down, or restarted: its transfers must fail). Called without
  // any fabric lock held.
  using PeerLost = std::function<void(PeerConn* peer, const absl::Status& why)>;
  // The arguments outlive peer control.
  static std::unique_ptr<PeerControl> Create(const FabricOptions& options, uint64_t boot_id,
                                             Lanes* lanes, PeerTable* peers,
                                             directory::Directory* directory, PeerLost on_lost);
  virtual ~PeerControl() = default;

  // Adds `peer` to the table with its staging on every lane (PeerTable::Add + Lanes::AddPeer);
  // the known entry when it is there already. RESOURCE_EXHAUSTED past PeerTable::kMaxPeers.
  virtual absl::StatusOr<PeerConn*> AddPeer(const directory::Peer& peer) = 0;
  // The table's peer `node_id`; one the directory lists (and does not mark down) but the table
  // does not have yet is added first. nullptr when neither knows it (or it cannot be added).
  virtual PeerConn* FindOrAdd(const std::string& node_id) = 0;
  // Membership from the directory (each liveness round): newcomers are added; a peer that is up
  // here but down or gone in the directory (its record vanished) is withdrawn: down, its
  // transfers failed UNAVAILABLE naming it, not contacted until the directory lists it again.
  // Also: a peer whose directory record names another Peer address than its
  // entry's (same node id; it moved) is re-dialed: its transfers fail UNAVAILABLE naming both
  // addresses, its entry is retired (old stub and lanes dropped) and a new entry with a new stub
  // is added, which says Hello again.
  virtual void SyncDirectory() = 0;
  // Reclaims peer indexes (each liveness round, at `now`): a peer the directory
  // dropped (absent, its record gone, or withdrawn) that is not up and has no transfer either way
  // (`busy`, SetBusyCheck) is retired from the table (its addresses removed from the lanes), its
  // index quarantined; indexes whose quarantine ended get their staging released and are free
  // for newcomers (PeerTable).
  virtual void Reclaim(absl::Time now) = 0;
  // Whether a peer still has transfers in the fabric (sender or receiver); unset: never.
  virtual void SetBusyCheck(std::function<bool(const PeerConn*)> busy) = 0;

  // Says hello to `peer` (Peer.Hello) and applies its answer.
  virtual absl::Status Introduce(PeerConn* peer) = 0;
  // A peer's Hello: applied, and answered with ours. A node the directory lists but the table
  // does not have yet is added first; PERMISSION_DENIED for a node not in the directory.
  virtual absl::StatusOr<peer_v1::PeerHello> OnHello(const peer_v1::PeerHello& hello) = 0;
  // A peer's Heartbeat: it is alive (when its boot id is the one introduced).
  virtual void OnHeartbeat(const std::string& node_id, uint64_t boot_id) = 0;
  // Starts the liveness thread: every heartbeat_interval, SyncDirectory, then Hello (until
  // introduced) or Heartbeat to each peer not withdrawn; a peer silent for liveness_timeout is
  // down.
  virtual void StartLiveness() = 0;
  // Stops and joins the liveness thread.
  virtual void Stop() = 0;
};

}  // namespace kvrail::fabric

// Internal to the fabric module: peer control. Hello (exchanging endpoints, staging addresses and
// indices; a changed boot id means the peer restarted), the heartbeat loop that declares a silent
// peer down, and the answers to a peer's Hello and Heartbeat. The Peer gRPC service that serves
// them is peer_service.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/directory/directory.h"
#include "daemon/fabric/fabric_options.h"
#include "daemon/fabric/lanes.h"
#include "daemon/fabric/peers.h"
#include "proto/kvrail/v1/peer.pb.h"

namespace kvrail::fabric {

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

  // Says hello to `peer` (Peer.Hello) and applies its answer.
  virtual absl::Status Introduce(PeerConn* peer) = 0;
  // A peer's Hello: applied, and answered with ours. PERMISSION_DENIED for a node not in the
  // directory.
  virtual absl::StatusOr<v1::PeerHello> OnHello(const v1::PeerHello& hello) = 0;
  // A peer's Heartbeat: it is alive (when its boot id is the one introduced).
  virtual void OnHeartbeat(const std::string& node_id, uint64_t boot_id) = 0;
  // Starts the liveness thread: every heartbeat_interval, Hello (until introduced) or Heartbeat
  // to each peer; a peer silent for liveness_timeout is down.
  virtual void StartLiveness() = 0;
  // Stops and joins the liveness thread.
  virtual void Stop() = 0;
};

}  // namespace kvrail::fabric

// The peer directory: which daemons exist (node id -> control address) and whether they are
// alive. Two implementations: the static one (DaemonConfig.peers) and the etcd one
// (DaemonConfig.etcd: every daemon registers a node record under a TTL lease it keeps alive and
// watches the prefix for the others), which also carries the static peers.
//
// Contract to the fabric (the PeerTable that takes peers joining later polls Peers() on each
// heartbeat; docs/fabric.md, "Directory"):
//  - Peers() reflects etcd membership within the watch latency (a put or delete under the prefix
//    is applied when etcd's watch delivers it, typically milliseconds). Peers are sorted by node
//    id, so a joining peer may sort anywhere: key fabric state by node id, not by position.
//  - A peer whose record vanished (its lease ended: the daemon died, or it could not reach etcd
//    for a TTL; or the key was deleted) STAYS listed with state kDown, `registered` false and its
//    last record, so transfers to it fail UNAVAILABLE naming the peer. MarkUp() does not revive
//    it (a working heartbeat to a daemon etcd considers gone does not override etcd).
//  - A record that reappears (a restarted daemon: new record.boot_id; or the same daemon after
//    re-registering) makes the peer kUp-able again: its state becomes kUnknown and the next
//    MarkUp sets kUp. A new boot id also resets a kUp peer to kUnknown (re-introduce it).
//  - Peer.record carries the record's fields (NICs with rails, GPUs by UUID, fabric addresses,
//    boot id, build info); Peer.address is the record's address (a static entry's address wins
//    when both name a node).
//  - etcd unreachable: nothing is dropped; Status() says "degraded" until it is reachable again.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/kvrail/v1/admin.pb.h"

namespace kvrail::directory {

enum class PeerState { kUnknown, kUp, kDown };
// PeerInfo.state of `state`.
v1::PeerState ToProto(PeerState state);

struct Peer {
  std::string node_id;
  std::string address;  // control address host:port (the peer's tcp_listen)
  PeerState state = PeerState::kUnknown;
  absl::Time last_seen = absl::InfinitePast();
  uint64_t boot_id = 0;  // the fabric's hello boot id; 0 until the first hello
  // Etcd directory only:
  bool is_static = true;    // from config peers
  bool registered = false;  // has a live etcd record now
  bool has_record = false;  // `record` is set (the live one, or the last one seen)
  v1::DirectoryNodeRecord record;
};

// Thread-safe.
class Directory {
 public:
  virtual ~Directory() = default;
  // Every known peer (this node excluded), sorted by node id.
  virtual std::vector<Peer> Peers() const = 0;
  // NOT_FOUND "spec.dst.node_id: ..." style errors are the caller's; this says "unknown peer".
  virtual absl::StatusOr<Peer> Lookup(const std::string& node_id) const = 0;
  // Liveness reports from the heartbeat loop.
  virtual void MarkUp(const std::string& node_id, absl::Time when, uint64_t boot_id) = 0;
  virtual void MarkDown(const std::string& node_id) = 0;
  // For Admin.ListPeers.
  virtual std::vector<v1::PeerInfo> List() const = 0;
  // The directory's own health (Stats.directory, kvrail status, the health service's
  // "kvrail.v1.Directory", metrics). The static directory is always "ok".
  virtual v1::DirectoryStatus Status() const;
  // Called (on the directory's thread, without its locks held) whenever Status().state changes;
  // nullptr to stop. The callback must not call back into SetStateListener.
  virtual void SetStateListener(std::function<void(const v1::DirectoryStatus&)> listener);
};

// Peer -> Admin.ListPeers entry (state name, last seen, source, record).
v1::PeerInfo ToPeerInfo(const Peer& peer);

// The static directory: `peers` (node id -> control address) from the config; an entry naming
// `self` is ignored.
std::unique_ptr<Directory> CreateStaticDirectory(const std::map<std::string, std::string>& peers,
                                                 const std::string& self);

}  // namespace kvrail::directory

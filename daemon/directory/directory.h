// The peer directory: which daemons exist (node id -> control address) and whether they are
// alive. Static today (DaemonConfig.peers); the interface is what an etcd-backed directory
// (leases with TTLs, watches) will implement later.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/kvrail/v1/admin.pb.h"

namespace kvrail::directory {

enum class PeerState { kUnknown, kUp, kDown };
const char* PeerStateName(PeerState state);

struct Peer {
  std::string node_id;
  std::string address;  // control address host:port (the peer's tcp_listen)
  PeerState state = PeerState::kUnknown;
  absl::Time last_seen = absl::InfinitePast();
  uint64_t boot_id = 0;  // 0 until the first hello
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
};

// The static directory: `peers` (node id -> control address) from the config; an entry naming
// `self` is ignored.
std::unique_ptr<Directory> CreateStaticDirectory(const std::map<std::string, std::string>& peers,
                                                 const std::string& self);

}  // namespace kvrail::directory

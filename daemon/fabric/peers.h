// Internal to the fabric module: what this daemon knows of each configured peer (PeerConn) and
// the fixed table of them (PeerTable). Shared by the sender (slot credits and owners, the peer's
// endpoints), the receiver (consume counters) and peer control (hello, liveness).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/directory/directory.h"
#include "daemon/fabric/command_ring.h"
#include "daemon/fabric/fabric_options.h"
#include "daemon/fabric/fi.h"
#include "proto/kvrail/v1/peer.grpc.pb.h"

namespace kvrail::fabric {

struct Outbound;  // a transfer being sent (sender.h); only the sender creates and reads them

// A send slot's current use: the transfer and tile whose bytes are in it until the peer's credit.
struct SlotOwner {
  std::shared_ptr<Outbound> outbound;
  uint32_t tile = 0;
};

// One peer. Thread contract: index, node_id, address and stub are fixed at creation; everything
// mutable is guarded by `mu`. The per-lane vectors are sized by Lanes::Create and keep their size.
struct PeerConn {
  uint32_t index = 0;  // our index for the peer (its position in the directory)
  std::string node_id;
  std::string address;
  std::unique_ptr<v1::Peer::Stub> stub;
  absl::Mutex mu;
  bool introduced ABSL_GUARDED_BY(mu) = false;
  uint64_t boot_id ABSL_GUARDED_BY(mu) = 0;
  uint32_t index_at_peer ABSL_GUARDED_BY(mu) = 0;
  uint32_t lanes ABSL_GUARDED_BY(mu) = 0;  // min(our NICs, its NICs)
  uint64_t peer_slot_bytes ABSL_GUARDED_BY(mu) = 0;
  struct Remote {
    fi_addr_t addr = FI_ADDR_UNSPEC;
    uint64_t key = 0, recv_base = 0, credit_base = 0;
    std::string nic_name;
  };
  std::vector<Remote> remote ABSL_GUARDED_BY(mu);                         // per lane
  std::vector<std::unique_ptr<SlotCredits>> credits ABSL_GUARDED_BY(mu);  // per lane (sender)
  std::vector<std::vector<SlotOwner>> owners ABSL_GUARDED_BY(mu);   // per lane, per slot (sender)
  std::vector<std::vector<uint64_t>> consumed ABSL_GUARDED_BY(mu);  // per lane, per slot (receiver)
  // Per lane, per slot (receiver): the nonce of the last tile seal consumed there (lanes.h TileSeal).
  std::vector<std::vector<uint64_t>> sealed ABSL_GUARDED_BY(mu);
  absl::Time last_ok ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  bool up ABSL_GUARDED_BY(mu) = false;
  uint64_t heartbeat_seq ABSL_GUARDED_BY(mu) = 0;
};

// The peers from the directory, in its order (which fixes each peer's index), with a gRPC stub
// each. Thread contract: immutable after Create (any thread may read it); each PeerConn guards
// its own state.
class PeerTable {
 public:
  // At most 127 peers (the index is 7 bits of immediate data); errors name the config key.
  // With `tls`, each channel presents this node's certificate and accepts only the peer's own
  // (peer_tls.h); without, the channels are plaintext (insecure_peers).
  static absl::StatusOr<std::unique_ptr<PeerTable>> Create(
      const directory::Directory& directory,
      const std::shared_ptr<const PeerTlsPem>& tls = nullptr);

  size_t size() const { return peers_.size(); }
  PeerConn* at(uint32_t index) const { return peers_[index].get(); }
  // The peer named `node_id`, or nullptr when it is not in the directory.
  PeerConn* Find(const std::string& node_id) const;
  const std::vector<std::unique_ptr<PeerConn>>& all() const { return peers_; }

 private:
  PeerTable() = default;
  std::vector<std::unique_ptr<PeerConn>> peers_;
};

// A random, odd id for this daemon's run: peers tell a restart by its change.
uint64_t MakeBootId();

}  // namespace kvrail::fabric

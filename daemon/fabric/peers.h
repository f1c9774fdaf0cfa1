// Internal to the fabric module: what this daemon knows of each peer (PeerConn) and the
// append-only table of them (PeerTable: peers join while the daemon runs, docs/fabric.md
// "Membership"). Shared by the sender (slot credits and owners, the peer's
// endpoints), the receiver (consume counters) and peer control (hello, liveness).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
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
// mutable is guarded by `mu`. The per-lane vectors are sized by Lanes::AddPeer before the peer is
// published in the table and keep their size.
struct PeerConn {
  uint32_t index = 0;  // our index for the peer (order of arrival in the table)
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
  // The directory says the peer is gone (its record vanished: lease ended, or it left) while we
  // still had it up: down, not contacted, until the directory lists it again.
  bool withdrawn ABSL_GUARDED_BY(mu) = false;
  uint64_t heartbeat_seq ABSL_GUARDED_BY(mu) = 0;
  std::string last_error ABSL_GUARDED_BY(mu);  // of the last failed Hello/Heartbeat (for logs)
};

// The peers this daemon knows, in order of arrival (which fixes each peer's index), with a gRPC
// stub each. Append-only: entries are never removed or moved, so a PeerConn* stays valid for the
// table's life and index i names one peer forever (a peer that restarts keeps its entry).
// Thread contract: Add is serialized by the table; size, at, Find and Snapshot may be called from
// any thread without a lock (a peer is published, with release semantics, only after Add's
// `prepare` finished, so whoever reaches it through the table sees its staging); each PeerConn
// guards its own state.
class PeerTable {
 public:
  // The index is 7 bits of immediate data (imm_data.h): at most 127 peers over the daemon's life.
  static constexpr uint32_t kMaxPeers = 127;

  // With `tls`, each channel presents this node's certificate and accepts only the peer's own
  // (peer_tls.h); without, the channels are plaintext (insecure_peers).
  explicit PeerTable(std::shared_ptr<const PeerTlsPem> tls = nullptr) : tls_(std::move(tls)) {}
  PeerTable(const PeerTable&) = delete;
  PeerTable& operator=(const PeerTable&) = delete;

  // Adds `peer` with index size(). `prepare` runs on the new entry before anyone else can see it
  // (Lanes::AddPeer: staging and per-lane state); if it fails, nothing is added. Errors:
  // ALREADY_EXISTS (node known), INVALID_ARGUMENT (empty node id or address), RESOURCE_EXHAUSTED
  // beyond kMaxPeers (naming the node and the limit).
  absl::StatusOr<PeerConn*> Add(const directory::Peer& peer,
                                const std::function<absl::Status(PeerConn*)>& prepare);

  uint32_t size() const { return size_.load(std::memory_order_acquire); }
  // Requires index < size().
  PeerConn* at(uint32_t index) const { return slots_[index].load(std::memory_order_acquire); }
  // The peer named `node_id`, or nullptr when it is not in the table.
  PeerConn* Find(const std::string& node_id) const;
  // The peers added so far.
  std::vector<PeerConn*> Snapshot() const;

 private:
  const std::shared_ptr<const PeerTlsPem> tls_;
  absl::Mutex add_mu_;  // serializes Add
  std::vector<std::unique_ptr<PeerConn>> owned_ ABSL_GUARDED_BY(add_mu_);
  std::array<std::atomic<PeerConn*>, kMaxPeers> slots_{};
  std::atomic<uint32_t> size_{0};
};

// A random, odd id for this daemon's run: peers tell a restart by its change.
uint64_t MakeBootId();

}  // namespace kvrail::fabric

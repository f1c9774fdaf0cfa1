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
#include "proto/kvrail/peer/v1/peer.grpc.pb.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

struct Outbound;  // a transfer being sent (sender.h); only the sender creates and reads them

// A send slot's current use: the transfer and tile whose bytes are in it until the peer's credit.
struct SlotOwner {
  std::shared_ptr<Outbound> outbound;
  uint32_t tile = 0;
};

// One peer. Thread contract: index, generation, node_id, address and stub are fixed at creation;
// `retired` is set once (PeerTable::Retire); everything mutable is guarded by `mu`. The per-lane
// vectors are sized by Lanes::AddPeer before the peer is published in the table and keep their
// size.
struct PeerConn {
  uint32_t index = 0;  // our index for the peer (a free index of the table when it was added)
  // Which use of `index` this is (0 for the first; +1 each time the index is reclaimed and
  // given to another peer). Told to the peer in Hello; its tile seals must carry it.
  uint32_t generation = 0;
  std::string node_id;
  std::string address;
  std::unique_ptr<peer_v1::Peer::Stub> stub;
  // Retired from the table (it left the directory, or its address changed): not found by node
  // id, not contacted; arrivals and credits naming its index are dropped until the index is
  // reused (then they name the new peer, whose seals carry the new generation).
  std::atomic<bool> retired{false};
  absl::Mutex mu;
  bool introduced ABSL_GUARDED_BY(mu) = false;
  uint64_t boot_id ABSL_GUARDED_BY(mu) = 0;
  uint32_t index_at_peer ABSL_GUARDED_BY(mu) = 0;
  uint32_t generation_at_peer ABSL_GUARDED_BY(mu) = 0;  // of index_at_peer (Hello)
  uint32_t lanes ABSL_GUARDED_BY(mu) = 0;               // min(our NICs, its NICs)
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
  // Per lane, per slot (receiver): the nonce of the last tile seal consumed there (lanes.h
  // TileSeal).
  std::vector<std::vector<uint64_t>> sealed ABSL_GUARDED_BY(mu);
  absl::Time last_ok ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  bool up ABSL_GUARDED_BY(mu) = false;
  // The directory says the peer is gone (its record vanished: lease ended, or it left) while we
  // still had it up: down, not contacted, until the directory lists it again.
  bool withdrawn ABSL_GUARDED_BY(mu) = false;
  uint64_t heartbeat_seq ABSL_GUARDED_BY(mu) = 0;
  std::string last_error ABSL_GUARDED_BY(mu);  // of the last failed Hello/Heartbeat (for logs)
};

// The peers this daemon knows, with a gRPC stub each. An index (7 bits of immediate data) names
// one peer at a time: a peer that left the directory with nothing outstanding is retired
// (Retire), its index is quarantined for `quarantine` (longer than any tile or credit of it can
// be in flight) and then free (EndQuarantine: its staging is released), and a later Add reuses
// it with generation + 1 (docs/fabric.md "Membership"). A PeerConn object is never freed while
// the table lives (a retired one stays reachable through pointers taken earlier, e.g. a
// transfer's), so a PeerConn* stays valid; a peer that restarts keeps its entry.
// Thread contract: Add, Retire and EndQuarantine are serialized by the table; size, at, Find and
// Snapshot may be called from any thread without a lock (a peer is published, with release
// semantics, only after Add's `prepare` finished, so whoever reaches it through the table sees
// its staging); each PeerConn guards its own state.
class PeerTable {
 public:
  // The index is 7 bits of immediate data (imm_data.h): at most 127 peers at a time (live,
  // retired in quarantine).
  static constexpr uint32_t kMaxPeers = 127;

  // With `tls`, each channel presents this node's certificate and accepts only the peer's own
  // (peer_tls.h); without, the channels are plaintext (insecure_peers).
  explicit PeerTable(std::shared_ptr<const PeerTlsPem> tls = nullptr) : tls_(std::move(tls)) {}
  PeerTable(const PeerTable&) = delete;
  PeerTable& operator=(const PeerTable&) = delete;

  // Adds `peer` with a free index: the next never used (size()), else the lowest index whose
  // quarantine ended (EndQuarantine), with that index's next generation. `prepare` runs on the
  // new entry before anyone else can see it (Lanes::AddPeer: staging and per-lane state); if it
  // fails, nothing is added. Errors: ALREADY_EXISTS (node known and not retired),
  // INVALID_ARGUMENT (empty node id or address), RESOURCE_EXHAUSTED when no index is free
  // (naming the node, the limit and how many are in quarantine).
  absl::StatusOr<PeerConn*> Add(const directory::Peer& peer,
                                const std::function<absl::Status(PeerConn*)>& prepare);

  // How long a retired index stays unused (fabric.cc: 2 x (liveness_timeout + lane_timeout)).
  void set_quarantine(absl::Duration quarantine) ABSL_LOCKS_EXCLUDED(add_mu_);
  // Retires `peer` (the current holder of its index) at `now`: Find and Snapshot no longer
  // return it; its index is quarantined until now + quarantine. The caller has failed its
  // transfers and made sure none is outstanding. FAILED_PRECONDITION when already retired.
  absl::Status Retire(PeerConn* peer, absl::Time now) ABSL_LOCKS_EXCLUDED(add_mu_);
  // Frees the indexes whose quarantine ended by `now`: `release` (Lanes::ReleasePeer) runs on
  // each, serialized with Add, before Add may reuse it. Returns them.
  std::vector<uint32_t> EndQuarantine(absl::Time now, const std::function<void(uint32_t)>& release)
      ABSL_LOCKS_EXCLUDED(add_mu_);
  // Indexes retired and still in quarantine, and free ones (for logs and tests).
  uint32_t quarantined() const ABSL_LOCKS_EXCLUDED(add_mu_);
  uint32_t free_indexes() const ABSL_LOCKS_EXCLUDED(add_mu_);

  // One past the highest index ever used.
  uint32_t size() const { return size_.load(std::memory_order_acquire); }
  // The current holder of `index` (possibly retired: check `retired`). Requires index < size().
  PeerConn* at(uint32_t index) const { return slots_[index].load(std::memory_order_acquire); }
  // The live (not retired) peer named `node_id`, or nullptr.
  PeerConn* Find(const std::string& node_id) const;
  // The live peers.
  std::vector<PeerConn*> Snapshot() const;

 private:
  enum class IndexState { kLive, kQuarantined, kFree };
  const std::shared_ptr<const PeerTlsPem> tls_;
  mutable absl::Mutex add_mu_;  // serializes Add, Retire, EndQuarantine
  absl::Duration quarantine_ ABSL_GUARDED_BY(add_mu_) = absl::Seconds(10);
  std::vector<std::unique_ptr<PeerConn>> owned_ ABSL_GUARDED_BY(add_mu_);
  std::array<IndexState, kMaxPeers> state_ ABSL_GUARDED_BY(add_mu_){};
  std::array<absl::Time, kMaxPeers> free_at_ ABSL_GUARDED_BY(add_mu_){};
  std::array<std::atomic<PeerConn*>, kMaxPeers> slots_{};
  std::atomic<uint32_t> size_{0};

  uint32_t QuarantinedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(add_mu_);
};

// A random, odd id for this daemon's run: peers tell a restart by its change.
uint64_t MakeBootId();

}  // namespace kvrail::fabric

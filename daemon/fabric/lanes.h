// Internal to the fabric module: the shared endpoint state. One lane per configured NIC: its
// libfabric endpoint, its command ring, its staging memory (per peer: send slots, receive slots,
// credit words; allocated and registered when the peer is added, Lanes::AddPeer) and its proxy
// thread, the only caller of the NIC's data functions. The sender writes commands and the
// receiver queues credits; the proxies post them and report what completes back to the two
// (CreditSink, ArrivalSink).
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/cuda/cuda_util.h"
#include "daemon/fabric/command_ring.h"
#include "daemon/fabric/fabric_options.h"
#include "daemon/fabric/fi.h"
#include "daemon/fabric/imm_data.h"
#include "daemon/fabric/peers.h"
#include "kernels/device_abi.h"

namespace kvrail::fabric {

struct Munmapper {
  size_t bytes = 0;
  void operator()(uint8_t* p) const {
    if (p != nullptr) munmap(p, bytes);
  }
};

// Context of one posted write (FI_CONTEXT mode: fi_context first).
struct OpContext {
  fi_context ctx;
  uint32_t peer;
  uint32_t lane;
  uint32_t slot;
};

// A credit the receiver owes a sender, queued for the lane's proxy.
struct CreditOp {
  uint32_t peer;
  uint32_t slot;
  uint32_t tile;
  bool applied;
  uint64_t value;
};

// A tile that arrived in receive slot `slot` of `lane` from peer `peer`.
struct Arrival {
  uint32_t lane, peer, handle, slot, tile;
  uint64_t len;
};

// One peer's staging on one lane, allocated and registered when the peer is added: `slots` send
// slots, `slots` receive slots, then the credit words (one page-rounded block). Fixed once made.
struct PeerStaging {
  std::unique_ptr<uint8_t, Munmapper> memory;
  uint64_t bytes = 0;
  std::optional<cuda::HostRegistration> pin;  // after `memory`: unpinned before it is unmapped
  // After `pin`: deregistered before the memory goes. `local_mr` covers the whole block for local
  // access only (the source of writes: no remote access, so its key opens nothing); `peer_mr`
  // covers the receive slots and credit words for the peer's remote writes, under a random key
  // only that peer is told.
  std::unique_ptr<MemoryRegion> local_mr;
  std::unique_ptr<MemoryRegion> peer_mr;
  std::vector<OpContext> contexts;  // [slot]
};

// One NIC with its ring, staging and proxy. Thread contract: the fields but `credits` and
// `staging` are fixed after Lanes::Create; `staging[p]` is set by AddPeer before the peer holding
// index p is published in the PeerTable (so whoever reaches p through the table sees it), and
// reset by ReleasePeer once p's retired holder is past its quarantine (nothing reads it for a
// retired peer; the quarantine is the grace for a reader that checked just before); the proxy
// thread is the only caller of the NIC's data functions; `mu` guards the credit queue.
struct Lane {
  uint32_t index = 0;
  std::unique_ptr<Nic> nic;
  std::unique_ptr<CommandRing> ring;
  // After `nic`: deregistered before it closes. PeerTable::kMaxPeers entries, null until added.
  std::vector<std::unique_ptr<PeerStaging>> staging;
  uint64_t next_nonce = 0;  // proxy thread only: the seal nonce of the next tile write
  std::thread proxy;
  absl::Mutex mu;
  std::deque<CreditOp> credits ABSL_GUARDED_BY(mu);
};

// The sender's side of the proxies' reports. Called on a proxy thread: must not block on the
// network (RPCs go to another thread).
class CreditSink {
 public:
  virtual ~CreditSink() = default;
  // The peer consumed our tile in (lane, slot): done, or dropped there when !applied.
  virtual void OnCredit(uint32_t lane, uint32_t peer, uint32_t slot, uint32_t tile,
                        bool applied) = 0;
  // The write from (lane, slot) to `peer` failed locally or never reached the wire.
  virtual void OnWriteFailed(uint32_t peer, uint32_t lane, uint32_t slot,
                             const absl::Status& error) = 0;
};

// The receiver's side of the proxies' reports. Called on a proxy thread: must not block.
class ArrivalSink {
 public:
  virtual ~ArrivalSink() = default;
  virtual void OnArrival(const Arrival& arrival) = 0;
};

// Thread contract: Create, StartProxies and Stop are called by the owner, in that order (Stop
// also from the destructor). Everything else may be called from any thread: the lanes are fixed
// after Create, a peer's staging is fixed once AddPeer made it (AddPeer runs under the PeerTable's
// Add, so adds are serialized), each lane's proxy is the only caller of its NIC's data
// functions, and a lane's credit queue is guarded by its `mu`. Address-vector changes
// (Nic::InsertAddress/RemoveAddress) are made under the peer's `mu` by peer control.
class Lanes {
 public:
  // The options the lanes need, checked before anything is opened. Errors name the config key.
  static absl::Status CheckOptions(const FabricOptions& options);
  // Opens the NICs. No staging yet: each peer's comes with AddPeer.
  static absl::StatusOr<std::unique_ptr<Lanes>> Create(const FabricOptions& options,
                                                       PeerTable* peers);
  // Allocates, pins and registers `peer`'s staging on every lane and sizes its per-lane state
  // (credits, owners, consume counters, remote endpoints). For PeerTable::Add's `prepare`: the
  // peer is not yet published. Before or after StartProxies.
  absl::Status AddPeer(PeerConn* peer);
  // Frees the staging of the retired peer that held `index` (its registrations closed: the
  // provider refuses its writes from then on). For PeerTable::EndQuarantine's `release`: the
  // index is quarantined (nobody posts or reads for it: retired peers are skipped) and not yet
  // free for Add.
  void ReleasePeer(uint32_t index);
  ~Lanes();
  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;

  // Starts one proxy thread per lane, reporting to `sender` and `receiver` (which outlive Stop).
  void StartProxies(CreditSink* sender, ArrivalSink* receiver);
  // Stops and joins the proxies; nothing is posted or reported afterwards.
  void Stop();

  uint32_t size() const { return static_cast<uint32_t>(lanes_.size()); }
  Lane& at(uint32_t lane) const { return *lanes_[lane]; }
  // The provider every lane uses (as libfabric names it).
  const std::string& provider() const { return lanes_[0]->nic->provider(); }

  // Staging of `peer` on `lane`: send slot, receive slot (where the peer's tiles land) and the
  // credit words (where the peer returns credits for our send slots).
  uint8_t* SendSlot(uint32_t lane, uint32_t peer, uint32_t slot) const;
  uint8_t* RecvSlot(uint32_t lane, uint32_t peer, uint32_t slot) const;
  uint64_t* CreditWords(uint32_t lane, uint32_t peer) const;
  // The registration a peer's writes to us on `lane` must name (its receive slots and credit
  // words).
  const MemoryRegion& PeerRegistration(uint32_t lane, uint32_t peer) const {
    return *lanes_[lane]->staging[peer]->peer_mr;
  }

  // Hands a write command to `lane`'s proxy (waits while its ring is full) and wakes it.
  void PostCommand(uint32_t lane, const kernels::NicCommand& cmd);
  // Queues a credit for `lane`'s proxy to send, and wakes it.
  void QueueCredit(uint32_t lane, const CreditOp& op);

  // "fabric: tcp;ofi_rxm, 2 NICs (nic0@10.0.0.1, nic1@10.0.0.1), 16 x 4096 KiB slots per peer,
  // 1 peers".
  std::string Describe() const;

 private:
  Lanes(const FabricOptions& options, PeerTable* peers) : options_(options), peers_(peers) {}
  uint64_t PerPeerBytes() const;
  void ProxyLoop(Lane* lane);
  // Whether peer `peer` is up (peer control's view), for the proxy's set-aside commands.
  bool PeerUp(uint32_t peer) const;
  ssize_t PostWrite(Lane* lane, const kernels::NicCommand& cmd);
  ssize_t PostCredit(Lane* lane, const CreditOp& op);

  const FabricOptions options_;
  PeerTable* const peers_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  // Set by StartProxies, read by the proxies only.
  CreditSink* sender_ = nullptr;
  ArrivalSink* receiver_ = nullptr;
  std::atomic<bool> stop_{false};
};

}  // namespace kvrail::fabric

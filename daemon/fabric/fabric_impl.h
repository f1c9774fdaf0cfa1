// Internal to the fabric module: the state shared by the data path (fabric.cc) and the control
// path (peer_service.cc).
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "daemon/engine/engine.h"
#include "daemon/fabric/command_ring.h"
#include "daemon/fabric/fabric.h"
#include "daemon/fabric/fi.h"
#include "daemon/fabric/tile_copy.h"
#include "daemon/planner/planner.h"
#include "proto/kvrail/v1/peer.grpc.pb.h"

namespace kvrail::fabric {

// Immediate data (see proto/kvrail/v1/peer.proto).
inline constexpr uint64_t kCreditBit = uint64_t{1} << 63;
inline constexpr uint64_t kNotAppliedBit = uint64_t{1} << 55;
inline uint64_t TileImm(uint32_t sender_index, uint32_t handle, uint32_t slot, uint32_t tile) {
  return (uint64_t{sender_index & 0x7f} << 56) | (uint64_t{handle & 0xffff} << 40) |
         (uint64_t{slot & 0xff} << 32) | tile;
}
inline uint64_t CreditImm(uint32_t index, uint32_t slot, uint32_t tile, bool applied) {
  return kCreditBit | (uint64_t{index & 0x7f} << 56) | (applied ? 0 : kNotAppliedBit) |
         (uint64_t{slot & 0xff} << 32) | tile;
}
inline uint32_t ImmIndex(uint64_t d) { return static_cast<uint32_t>((d >> 56) & 0x7f); }
inline uint32_t ImmHandle(uint64_t d) { return static_cast<uint32_t>((d >> 40) & 0xffff); }
inline uint32_t ImmSlot(uint64_t d) { return static_cast<uint32_t>((d >> 32) & 0xff); }
inline uint32_t ImmTile(uint64_t d) { return static_cast<uint32_t>(d); }

struct Munmapper {
  size_t bytes = 0;
  void operator()(uint8_t* p) const {
    if (p != nullptr) munmap(p, bytes);
  }
};

struct Outbound;

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

// One NIC with its ring, staging and proxy. The proxy thread is the only caller of the NIC's
// data functions; `mu` guards the credit queue.
struct Lane {
  uint32_t index = 0;
  std::unique_ptr<Nic> nic;
  std::unique_ptr<CommandRing> ring;
  std::unique_ptr<uint8_t, Munmapper> memory;
  uint64_t memory_bytes = 0;
  std::optional<cuda::HostRegistration> pin;  // after `memory`: unpinned before it is unmapped
  std::unique_ptr<MemoryRegion> mr;
  std::vector<OpContext> contexts;  // [peer * slots + slot]
  std::thread proxy;
  absl::Mutex mu;
  std::deque<CreditOp> credits ABSL_GUARDED_BY(mu);
};

// A slot's current use on the sender.
struct SlotOwner {
  std::shared_ptr<Outbound> outbound;
  uint32_t tile = 0;
};

// What this daemon knows of one peer. Everything mutable is guarded by `mu`.
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
  std::vector<Remote> remote ABSL_GUARDED_BY(mu);                     // per lane
  std::vector<std::unique_ptr<SlotCredits>> credits ABSL_GUARDED_BY(mu);  // per lane
  std::vector<std::vector<SlotOwner>> owners ABSL_GUARDED_BY(mu);     // per lane, per slot
  std::vector<std::vector<uint64_t>> consumed ABSL_GUARDED_BY(mu);    // receiver side
  absl::Time last_ok ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  bool up ABSL_GUARDED_BY(mu) = false;
  uint64_t heartbeat_seq ABSL_GUARDED_BY(mu) = 0;
};

// One transfer this daemon sends. `mu` guards the counters.
struct Outbound {
  uint64_t id = 0;
  std::shared_ptr<engine::Job> job;
  PeerConn* peer = nullptr;
  uint32_t handle = 0;
  std::vector<std::string> nics;
  absl::Mutex mu;
  std::optional<absl::Status> failed ABSL_GUARDED_BY(mu);
  bool removed ABSL_GUARDED_BY(mu) = false;
  uint32_t inflight ABSL_GUARDED_BY(mu) = 0;
  uint32_t ok_tiles ABSL_GUARDED_BY(mu) = 0;
  bool closed ABSL_GUARDED_BY(mu) = false;
};

// One transfer this daemon receives. `mu` guards the tile accounting.
struct Inbound {
  uint32_t handle = 0;
  uint32_t peer = 0;
  uint64_t sender_transfer_id = 0;
  std::string sender_node;
  std::shared_ptr<regions::Region> dst;
  planner::Plan plan;
  absl::Mutex mu;
  std::vector<bool> applied ABSL_GUARDED_BY(mu);
  uint32_t applied_count ABSL_GUARDED_BY(mu) = 0;
  // This node's record of the transfer (InboundSink); tiles report to it until `ended`.
  uint64_t local_id = 0;
  std::shared_ptr<engine::Job> job;
  bool ended ABSL_GUARDED_BY(mu) = false;
  explicit Inbound(planner::Plan p) : plan(std::move(p)) {}
};

// A tile that arrived, waiting for an unpack worker.
struct Arrival {
  uint32_t lane, peer, handle, slot, tile;
  uint64_t len;
};

}  // namespace kvrail::fabric

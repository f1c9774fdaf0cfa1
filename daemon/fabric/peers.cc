#include "daemon/fabric/peers.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "daemon/fabric/peer_tls.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

absl::StatusOr<PeerConn*> PeerTable::Add(const directory::Peer& peer,
                                         const std::function<absl::Status(PeerConn*)>& prepare) {
  if (peer.node_id.empty() || peer.address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peers: node '", peer.node_id, "' has no node id or no address ('", peer.address, "')"));
  }
  absl::MutexLock lock(&add_mu_);
  if (Find(peer.node_id) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("peers: node '", peer.node_id, "' is known"));
  }
  const uint32_t size = size_.load(std::memory_order_relaxed);
  uint32_t index = size;
  if (size >= kMaxPeers) {
    const auto free = std::find(state_.begin(), state_.end(), IndexState::kFree);
    if (free == state_.end()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "peers: node '", peer.node_id, "' not added: ", kMaxPeers,
          " fabric peers at a time at most (the peer index is 7 bits of immediate data); ",
          QuarantinedLocked(), " indexes of peers that left are in quarantine (free again ",
          "2 x (liveness_timeout + lane_timeout) after they left)"));
    }
    index = static_cast<uint32_t>(free - state_.begin());
  }
  auto conn = std::make_unique<PeerConn>();
  conn->index = index;
  // A reused index: one past its former holder's generation (slots_ keeps the last holder).
  conn->generation = index < size ? at(index)->generation + 1 : 0;
  conn->node_id = peer.node_id;
  conn->address = peer.address;
  // Short reconnect backoff: a peer that starts after us (or comes back) is reached quickly.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  conn->stub = peer_v1::Peer::NewStub(PeerChannel(peer.address, peer.node_id, tls_, args));
  KVRAIL_RETURN_IF_ERROR(prepare(conn.get()));
  PeerConn* const added = conn.get();
  owned_.push_back(std::move(conn));
  state_[index] = IndexState::kLive;
  slots_[index].store(added, std::memory_order_release);
  if (index == size) size_.store(index + 1, std::memory_order_release);
  return added;
}

void PeerTable::set_quarantine(absl::Duration quarantine) {
  absl::MutexLock lock(&add_mu_);
  quarantine_ = quarantine;
}

absl::Status PeerTable::Retire(PeerConn* peer, absl::Time now) {
  absl::MutexLock lock(&add_mu_);
  if (peer->index >= size_.load(std::memory_order_relaxed) || at(peer->index) != peer ||
      peer->retired.load()) {
    return absl::FailedPreconditionError(absl::StrCat("peers: node '", peer->node_id, "' (index ",
                                                      peer->index, " generation ", peer->generation,
                                                      ") is not a live entry"));
  }
  peer->retired.store(true, std::memory_order_release);
  state_[peer->index] = IndexState::kQuarantined;
  free_at_[peer->index] = now + quarantine_;
  return absl::OkStatus();
}

std::vector<uint32_t> PeerTable::EndQuarantine(absl::Time now,
                                               const std::function<void(uint32_t)>& release) {
  absl::MutexLock lock(&add_mu_);
  std::vector<uint32_t> ended;
  for (uint32_t i = 0; i < kMaxPeers; ++i) {
    if (state_[i] == IndexState::kQuarantined && free_at_[i] <= now) {
      if (release) release(i);
      state_[i] = IndexState::kFree;
      ended.push_back(i);
    }
  }
  return ended;
}

uint32_t PeerTable::QuarantinedLocked() const {
  return static_cast<uint32_t>(std::count(state_.begin(), state_.end(), IndexState::kQuarantined));
}

uint32_t PeerTable::quarantined() const {
  absl::MutexLock lock(&add_mu_);
  return QuarantinedLocked();
}

uint32_t PeerTable::free_indexes() const {
  absl::MutexLock lock(&add_mu_);
  return static_cast<uint32_t>(kMaxPeers - size_.load(std::memory_order_relaxed) +
                               std::count(state_.begin(),
                                          state_.begin() + size_.load(std::memory_order_relaxed),
                                          IndexState::kFree));
}

PeerConn* PeerTable::Find(const std::string& node_id) const {
  const uint32_t n = size();
  for (uint32_t i = 0; i < n; ++i) {
    PeerConn* p = at(i);
    if (p->node_id == node_id && !p->retired.load(std::memory_order_acquire)) return p;
  }
  return nullptr;
}

std::vector<PeerConn*> PeerTable::Snapshot() const {
  const uint32_t n = size();
  std::vector<PeerConn*> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    PeerConn* p = at(i);
    if (!p->retired.load(std::memory_order_acquire)) out.push_back(p);
  }
  return out;
}

uint64_t MakeBootId() {
  std::random_device rd;
  return (uint64_t{rd()} << 32 | rd()) | 1;
}

}  // namespace kvrail::fabric

#include "daemon/fabric/peers.h"

#include <grpcpp/grpcpp.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "daemon/fabric/peer_tls.h"

namespace kvrail::fabric {

absl::StatusOr<PeerConn*> PeerTable::Add(const directory::Peer& peer,
                                         const std::function<absl::Status(PeerConn*)>& prepare) {
  if (peer.node_id.empty() || peer.address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("peers: node '", peer.node_id,
                                                   "' has no node id or no address ('",
                                                   peer.address, "')"));
  }
  absl::MutexLock lock(&add_mu_);
  if (Find(peer.node_id) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("peers: node '", peer.node_id, "' is known"));
  }
  const uint32_t index = size_.load(std::memory_order_relaxed);
  if (index >= kMaxPeers) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "peers: node '", peer.node_id, "' not added: at most ", kMaxPeers,
        " fabric peers over a daemon's life (the peer index is 7 bits of immediate data); restart "
        "the daemon to forget peers that left"));
  }
  auto conn = std::make_unique<PeerConn>();
  conn->index = index;
  conn->node_id = peer.node_id;
  conn->address = peer.address;
  // Short reconnect backoff: a peer that starts after us (or comes back) is reached quickly.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  conn->stub = v1::Peer::NewStub(PeerChannel(peer.address, peer.node_id, tls_, args));
  KVRAIL_RETURN_IF_ERROR(prepare(conn.get()));
  PeerConn* const added = conn.get();
  owned_.push_back(std::move(conn));
  slots_[index].store(added, std::memory_order_release);
  size_.store(index + 1, std::memory_order_release);
  return added;
}

PeerConn* PeerTable::Find(const std::string& node_id) const {
  const uint32_t n = size();
  for (uint32_t i = 0; i < n; ++i) {
    PeerConn* p = at(i);
    if (p->node_id == node_id) return p;
  }
  return nullptr;
}

std::vector<PeerConn*> PeerTable::Snapshot() const {
  const uint32_t n = size();
  std::vector<PeerConn*> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) out.push_back(at(i));
  return out;
}

uint64_t MakeBootId() {
  std::random_device rd;
  return (uint64_t{rd()} << 32 | rd()) | 1;
}

}  // namespace kvrail::fabric

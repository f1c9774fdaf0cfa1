#include "daemon/fabric/peers.h"

#include <grpcpp/grpcpp.h>

#include <random>

#include "daemon/fabric/peer_tls.h"

namespace kvrail::fabric {

absl::StatusOr<std::unique_ptr<PeerTable>> PeerTable::Create(
    const directory::Directory& directory, const std::shared_ptr<const PeerTlsPem>& tls) {
  std::unique_ptr<PeerTable> table(new PeerTable());
  uint32_t index = 0;
  for (const directory::Peer& p : directory.Peers()) {
    if (index >= 127) return absl::InvalidArgumentError("peers: at most 127 fabric peers");
    auto conn = std::make_unique<PeerConn>();
    conn->index = index++;
    conn->node_id = p.node_id;
    conn->address = p.address;
    // Short reconnect backoff: a peer that starts after us (or comes back) is reached quickly.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
    conn->stub = v1::Peer::NewStub(PeerChannel(p.address, p.node_id, tls, args));
    table->peers_.push_back(std::move(conn));
  }
  return table;
}

PeerConn* PeerTable::Find(const std::string& node_id) const {
  for (const auto& p : peers_) {
    if (p->node_id == node_id) return p.get();
  }
  return nullptr;
}

uint64_t MakeBootId() {
  std::random_device rd;
  return (uint64_t{rd()} << 32 | rd()) | 1;
}

}  // namespace kvrail::fabric

// Internal to the fabric module: the Peer gRPC service (proto/kvrail/peer/v1/peer.proto), a thin
// adapter from RPCs to peer control (Hello, Heartbeat), the leases (GetLease) and the receiver
// (Begin/End/AbortRemoteTransfer).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "daemon/fabric/leases.h"
#include "daemon/fabric/peer_control.h"
#include "daemon/fabric/receiver.h"

namespace kvrail::fabric {

// The service answers as `node_id` (this run: `boot_id`). The parts outlive it. Thread contract:
// gRPC calls it concurrently; the parts are thread-safe.
// `require_certificates` (mTLS, peer_tls.h): every peer RPC takes the caller's node id from its
// certificate (the unix socket has none: refused) and refuses a message naming another node
// (PERMISSION_DENIED naming the field); without it (insecure_peers) node ids are as claimed.
std::unique_ptr<grpc::Service> MakePeerService(std::string node_id, uint64_t boot_id,
                                               PeerControl* control, Leases* leases,
                                               Receiver* receiver, bool require_certificates);

}  // namespace kvrail::fabric

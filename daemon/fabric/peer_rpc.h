// Internal to the fabric module: calling a peer's Peer service (the client side of the control
// path, used by the sender and by peer control). Stateless functions; any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace kvrail::fabric {

// A peer's answer as a Status whose message starts with `prefix`. Transport failures (deadline,
// connection refused) are UNAVAILABLE: the peer is unreachable.
absl::Status FromPeerRpc(const grpc::Status& status, const std::string& prefix);

// A call context with a deadline of `timeout` from now. `wait_for_ready`: ride out a reconnect in
// progress instead of failing at once (control RPCs; heartbeats fail fast).
std::unique_ptr<grpc::ClientContext> PeerCallContext(absl::Duration timeout,
                                                     bool wait_for_ready = true);

}  // namespace kvrail::fabric

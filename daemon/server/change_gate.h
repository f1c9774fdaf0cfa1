// The gRPC calls that change what a hot restart hands over (regions, grants, new transfers):
// held while a handover is prepared, and once it is done made on the successor with the
// caller's credentials and deadline (Server::HoldChanges, daemon/handover).
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"

namespace kvrail::server {

// Thread-safe.
class ChangeGate {
 public:
  enum class Mode { kServe, kHold, kForward };

  // Waits while changes are held; kServe counts the call as running until Leave.
  Mode Enter() ABSL_LOCKS_EXCLUDED(mu_);
  void Leave() ABSL_LOCKS_EXCLUDED(mu_);
  // Returns once no change runs here.
  void Hold() ABSL_LOCKS_EXCLUDED(mu_);
  void Resume() ABSL_LOCKS_EXCLUDED(mu_);
  // From now on calls go to gRPC target `grpc_target` (connected before this returns, up to
  // 2 s); empty: they are refused UNAVAILABLE.
  void Forward(const std::string& grpc_target) ABSL_LOCKS_EXCLUDED(mu_);
  bool forwarding() ABSL_LOCKS_EXCLUDED(mu_);
  // The successor (set once Forward ran; lives as long as the gate).
  v1::Transfer::Stub* successor() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kServe;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<v1::Transfer::Stub> successor_ ABSL_GUARDED_BY(mu_);
};

// The client context for a call forwarded to the successor: the caller's session credentials
// (kvrail-session metadata) and deadline.
void PrepareForwardedCall(const grpc::ServerContextBase& context, grpc::ClientContext* out);

// The call, made on the successor with the caller's credentials and deadline; UNAVAILABLE when
// there is no successor to call.
template <typename Call>
grpc::Status ForwardCall(const grpc::ServerContext& context, v1::Transfer::Stub* successor,
                         Call call) {
  if (successor == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "kvraild handed over to its successor; call it (reconnect)");
  }
  grpc::ClientContext out;
  PrepareForwardedCall(context, &out);
  return call(successor, &out);
}

}  // namespace kvrail::server

// The one conversion between gRPC's status and the project's error type (absl::Status): the code
// number and the message are kept both ways (absl and gRPC share the canonical code numbers).
// Used by the daemon's services, the fabric's peer service and the client library. Stateless.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace kvrail {

// OK for an OK status (its message, if any, is dropped as gRPC's OK has none).
grpc::Status ToGrpcStatus(const absl::Status& status);

// OK for an OK status; otherwise the same code number with the same message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kvrail

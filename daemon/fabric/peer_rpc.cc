#include "daemon/fabric/peer_rpc.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvrail::fabric {

absl::Status FromPeerRpc(const grpc::Status& status, const std::string& prefix) {
  if (status.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(status.error_code());
  if (code == absl::StatusCode::kDeadlineExceeded) code = absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrCat(prefix, status.error_message()));
}

std::unique_ptr<grpc::ClientContext> PeerCallContext(absl::Duration timeout, bool wait_for_ready) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context->set_wait_for_ready(wait_for_ready);
  return context;
}

}  // namespace kvrail::fabric

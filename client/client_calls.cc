// Client's calls part (client_impl.h lists the parts): the unary and streaming calls, each through
// Impl::Unary (or Impl::Checked for a stream) so that every one reports a lost session alike.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/grpc_status.h"
#include "base/status.h"
#include "client/client_impl.h"
#include "client/kvrail_client.h"
#include "grpcpp/grpcpp.h"
#include "proto/kvrail/v1/admin.grpc.pb.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "wire/session_wire.h"

namespace kvrail::client {

absl::StatusOr<v1::Grant> Client::CreateGrant(uint64_t region_id, v1::GrantAccess access,
                                              absl::Duration ttl, uint32_t layer_begin,
                                              uint32_t layer_end) {
  if (ttl < absl::ZeroDuration()) return absl::InvalidArgumentError("ttl: negative");
  v1::CreateGrantRequest request;
  request.set_region_id(region_id);
  request.set_access(access);
  request.set_ttl_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(ttl)));
  request.set_layer_begin(layer_begin);
  request.set_layer_end(layer_end);
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::CreateGrant, request);
}

absl::Status Client::RevokeGrant(const std::string& token) {
  v1::RevokeGrantRequest request;
  request.set_token(token);
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::RevokeGrant, request).status();
}

absl::StatusOr<v1::RegionLease> Client::ExportRegion(uint64_t region_id,
                                                     const std::string& peer_node) {
  v1::ExportRegionRequest request;
  request.set_region_id(region_id);
  request.set_peer_node_id(peer_node);
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::ExportRegion, request);
}

absl::StatusOr<std::vector<v1::Notification>> Client::PollNotifications(uint32_t max,
                                                                        absl::Duration timeout) {
  if (timeout < absl::ZeroDuration() || timeout > absl::Seconds(60)) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout: ", absl::FormatDuration(timeout), " is outside [0, 60s]"));
  }
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t session, SessionId());
  v1::NotificationPollRequest request;
  request.set_session_id(session);
  request.set_max_notifications(max);
  // Round up so that a sub-millisecond timeout still waits.
  request.set_timeout_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(timeout + absl::Milliseconds(1) - absl::Nanoseconds(1))));
  KVRAIL_ASSIGN_OR_RETURN(v1::NotificationPollResponse response,
                          impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::PollNotifications,
                                       request, timeout + kUnaryDeadline));
  std::vector<v1::Notification> out;
  out.reserve(response.notifications_size());
  for (auto& n : *response.mutable_notifications()) out.push_back(std::move(n));
  return out;
}

absl::Status Client::WatchNotifications(
    const std::function<bool(const v1::Notification&)>& on_notification) {
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t session, SessionId());
  v1::NotificationWatchRequest request;
  request.set_session_id(session);
  grpc::ClientContext context;
  impl_->Bind(&context);
  std::unique_ptr<grpc::ClientReader<v1::Notification>> reader =
      impl_->transfer_->WatchNotifications(&context, request);
  v1::Notification n;
  while (reader->Read(&n)) {
    if (!on_notification(n)) {
      context.TryCancel();
      reader->Finish();  // CANCELLED by us: not an error
      return absl::OkStatus();
    }
  }
  return impl_->Checked(FromGrpcStatus(reader->Finish()));
}

absl::StatusOr<v1::TransferStatus> Client::Get(uint64_t transfer_id) {
  v1::GetTransferRequest request;
  request.set_transfer_id(transfer_id);
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::GetTransfer, request);
}

absl::StatusOr<v1::TransferStatus> Client::Cancel(uint64_t transfer_id) {
  // On the session's own connection (a CANCEL is answered at once), so it follows every SUBMIT
  // this client sent on it: the transfer it names is known by then.
  if (impl_->session_submit_.load() && impl_->session_cancel_.load() &&
      !impl_->unix_path_.empty()) {
    absl::StatusOr<std::shared_ptr<wire::SessionConnection>> session = impl_->Session();
    if (session.ok()) {
      bool sent = false;
      absl::StatusOr<std::string> answer =
          (*session)->Exchange(wire::EncodeCancel(transfer_id), &sent);
      if (answer.ok()) {
        bool brief = false;
        absl::StatusOr<v1::TransferStatus> status = wire::ParseCancelAnswer(*answer, &brief);
        // The whole status did not fit an answer packet (a guard: a record's status, its spec
        // kept without block ids, does not get that large): read it whole, as gRPC answers it.
        if (status.ok() && brief) return Get(transfer_id);
        if (status.status().code() != absl::StatusCode::kUnimplemented) {
          return impl_->Checked(std::move(status));
        }
        impl_->session_cancel_.store(false);  // an older daemon: gRPC from now on
      }
      // No answer (the connection broke): once more over gRPC. A cancel may be repeated: a
      // transfer that has ended answers with its final status.
    }
  }
  v1::CancelTransferRequest request;
  request.set_transfer_id(transfer_id);
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::CancelTransfer, request);
}

absl::Status Client::MarkReady(uint64_t transfer_id, uint32_t layer_begin, uint32_t layer_count) {
  v1::MarkReadyRequest request;
  request.set_transfer_id(transfer_id);
  request.set_layer_begin(layer_begin);
  request.set_layer_count(layer_count);
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::MarkReady, request).status();
}

absl::StatusOr<v1::TransferStatus> Client::Watch(
    uint64_t transfer_id, const std::function<bool(const v1::TransferEvent&)>& on_event,
    uint32_t min_interval_ms) {
  v1::WatchTransferRequest request;
  request.set_transfer_id(transfer_id);
  request.set_min_interval_ms(min_interval_ms);
  grpc::ClientContext context;
  impl_->Bind(&context);
  std::unique_ptr<grpc::ClientReader<v1::TransferEvent>> reader =
      impl_->transfer_->WatchTransfer(&context, request);
  v1::TransferEvent event;
  v1::TransferStatus last;
  bool seen = false;
  while (reader->Read(&event)) {
    last = event.status();
    seen = true;
    if (on_event && !on_event(event)) {
      context.TryCancel();
      reader->Finish();  // CANCELLED by us: not an error
      return last;
    }
  }
  KVRAIL_RETURN_IF_ERROR(impl_->Checked(FromGrpcStatus(reader->Finish())));
  if (!seen) {
    return absl::InternalError(
        absl::StrCat("WatchTransfer(", transfer_id, ") ended without any event"));
  }
  return last;
}

absl::StatusOr<v1::ListRegionsResponse> Client::ListRegions(bool include_library_regions) {
  KVRAIL_ASSIGN_OR_RETURN(
      v1::ListRegionsResponse response,
      impl_->Unary(*impl_->admin_, &v1::Admin::Stub::ListRegions, v1::ListRegionsRequest()));
  if (!include_library_regions) {
    auto* regions = response.mutable_regions();
    regions->erase(
        std::remove_if(regions->begin(), regions->end(),
                       [](const v1::RegionInfo& r) { return r.spec().library_region(); }),
        regions->end());
  }
  return response;
}

absl::StatusOr<v1::ListTransfersResponse> Client::ListTransfers(
    const std::vector<v1::TransferState>& states, uint32_t limit) {
  v1::ListTransfersRequest request;
  for (v1::TransferState state : states) request.add_states(state);
  request.set_limit(limit);
  return ListTransfers(request);
}

absl::StatusOr<v1::ListTransfersResponse> Client::ListTransfers(
    const v1::ListTransfersRequest& request) {
  return impl_->Unary(*impl_->admin_, &v1::Admin::Stub::ListTransfers, request);
}

absl::StatusOr<v1::ListPeersResponse> Client::ListPeers() {
  return impl_->Unary(*impl_->admin_, &v1::Admin::Stub::ListPeers, v1::ListPeersRequest());
}

absl::StatusOr<v1::Stats> Client::GetStats() {
  return impl_->Unary(*impl_->admin_, &v1::Admin::Stub::GetStats, v1::GetStatsRequest());
}

absl::StatusOr<v1::GetTopologyResponse> Client::GetTopology() {
  return impl_->Unary(*impl_->admin_, &v1::Admin::Stub::GetTopology, v1::GetTopologyRequest());
}

// --- Prepared transfers ---

absl::StatusOr<v1::PrepareTransferResponse> Client::PrepareRequest(
    const v1::PrepareTransferRequest& request) {
  // A prepared transfer is its session's: the call must carry the session's credentials.
  KVRAIL_RETURN_IF_ERROR(SessionId().status());
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::PrepareTransfer, request);
}

absl::StatusOr<PreparedTransfer> Client::Prepare(const v1::TransferSpec& shape,
                                                 uint32_t src_block_count,
                                                 uint32_t dst_block_count) {
  v1::PrepareTransferRequest request;
  *request.mutable_spec() = shape;
  request.set_src_block_count(src_block_count);
  request.set_dst_block_count(dst_block_count);
  KVRAIL_ASSIGN_OR_RETURN(v1::PrepareTransferResponse info, PrepareRequest(request));
  return PreparedTransfer(this, std::move(info));
}

absl::Status Client::ReleasePrepared(uint64_t prepared_id) {
  v1::ReleasePreparedRequest request;
  request.set_prepared_id(prepared_id);
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::ReleasePrepared, request).status();
}

}  // namespace kvrail::client

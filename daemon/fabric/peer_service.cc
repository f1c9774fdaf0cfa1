#include "daemon/fabric/peer_service.h"

#include <utility>

#include "absl/time/clock.h"
#include "base/grpc_status.h"
#include "daemon/fabric/peer_auth.h"
#include "proto/kvrail/peer/v1/peer.grpc.pb.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

namespace {

// Thread contract: gRPC calls these concurrently; the parts are thread-safe.
class PeerServiceImpl final : public peer_v1::Peer::Service {
 public:
  PeerServiceImpl(std::string node_id, uint64_t boot_id, PeerControl* control, Leases* leases,
                  Receiver* receiver, bool require_certificates)
      : node_id_(std::move(node_id)),
        boot_id_(boot_id),
        control_(control),
        leases_(leases),
        receiver_(receiver),
        require_certificates_(require_certificates) {}

  grpc::Status Hello(grpc::ServerContext* context, const peer_v1::HelloRequest* request,
                     peer_v1::HelloResponse* response) override {
    absl::Status checked = CheckHelloBounds(request->hello(), "hello.");
    if (checked.ok()) checked = CheckCaller(*context, request->hello().node_id(), "hello.node_id");
    if (!checked.ok()) return ToGrpcStatus(checked);
    auto hello = control_->OnHello(request->hello());
    if (!hello.ok()) return ToGrpcStatus(hello.status());
    *response->mutable_hello() = *std::move(hello);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext* context, const peer_v1::HeartbeatRequest* request,
                         peer_v1::HeartbeatResponse* response) override {
    const absl::Status checked = CheckCaller(*context, request->node_id(), "node_id");
    if (!checked.ok()) return ToGrpcStatus(checked);
    control_->OnHeartbeat(request->node_id(), request->boot_id());
    response->set_node_id(node_id_);
    response->set_boot_id(boot_id_);
    response->set_unix_us(absl::ToUnixMicros(absl::Now()));
    return grpc::Status::OK;
  }
  grpc::Status GetLease(grpc::ServerContext* context, const peer_v1::GetLeaseRequest* request,
                        v1::RegionLease* response) override {
    const absl::Status checked =
        CheckCaller(*context, request->requester_node_id(), "requester_node_id");
    if (!checked.ok()) return ToGrpcStatus(checked);
    return Fill(leases_->Get(request->region_id(), request->requester_node_id()), response);
  }
  grpc::Status BeginRemoteTransfer(grpc::ServerContext* context,
                                   const peer_v1::BeginRemoteTransferRequest* request,
                                   peer_v1::BeginRemoteTransferResponse* response) override {
    // The sizes are bounded by the receiver, before it plans (CheckBeginBounds).
    const absl::Status checked = CheckCaller(*context, request->sender_node_id(), "sender_node_id");
    if (!checked.ok()) return ToGrpcStatus(checked);
    // The handle and the destination's GPU UUID (the region it looked up once).
    return ToGrpcStatus(receiver_->Begin(*request, response));
  }
  grpc::Status EndRemoteTransfer(grpc::ServerContext* context,
                                 const peer_v1::EndRemoteTransferRequest* request,
                                 peer_v1::EndRemoteTransferResponse* response) override {
    const absl::Status checked = CheckCaller(*context, request->sender_node_id(), "sender_node_id");
    if (!checked.ok()) return ToGrpcStatus(checked);
    auto applied = receiver_->End(request->sender_node_id(), request->handle(), false, "");
    if (!applied.ok()) return ToGrpcStatus(applied.status());
    response->set_tiles_applied(*applied);
    return grpc::Status::OK;
  }
  grpc::Status AbortRemoteTransfer(grpc::ServerContext* context,
                                   const peer_v1::AbortRemoteTransferRequest* request,
                                   peer_v1::EndRemoteTransferResponse* response) override {
    const absl::Status checked = CheckCaller(*context, request->sender_node_id(), "sender_node_id");
    if (!checked.ok()) return ToGrpcStatus(checked);
    auto applied = receiver_->End(request->sender_node_id(), request->handle(), true,
                                  BoundedPeerText(request->error_message()));
    if (!applied.ok()) return ToGrpcStatus(applied.status());
    response->set_tiles_applied(*applied);
    return grpc::Status::OK;
  }

 private:
  // With certificates required: the caller's certificate names a node, and `claimed` (the
  // message's `field`) is that node. Without (insecure_peers): the claim stands.
  absl::Status CheckCaller(const grpc::ServerContext& context, const std::string& claimed,
                           absl::string_view field) const {
    if (!require_certificates_) return absl::OkStatus();
    absl::StatusOr<std::string> node = AuthenticatedNode(context);
    if (!node.ok()) return node.status();
    return CheckClaimedNode(claimed, *node, field);
  }

  static grpc::Status Fill(absl::StatusOr<v1::RegionLease> lease, v1::RegionLease* out) {
    if (!lease.ok()) return ToGrpcStatus(lease.status());
    *out = *std::move(lease);
    return grpc::Status::OK;
  }

  const std::string node_id_;
  const uint64_t boot_id_;
  PeerControl* const control_;
  Leases* const leases_;
  Receiver* const receiver_;
  const bool require_certificates_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakePeerService(std::string node_id, uint64_t boot_id,
                                               PeerControl* control, Leases* leases,
                                               Receiver* receiver, bool require_certificates) {
  return std::make_unique<PeerServiceImpl>(std::move(node_id), boot_id, control, leases, receiver,
                                           require_certificates);
}

}  // namespace kvrail::fabric

#include "daemon/server/server.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/grpc_status.h"
#include "proto/kvrail/v1/admin.grpc.pb.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace kvrail::server {
namespace {

class TransferService final : public v1::Transfer::Service {
 public:
  TransferService(regions::RegionTable* regions, transfers::TransferManager* transfers,
                  transfers::NotificationHub* notifications)
      : regions_(regions), transfers_(transfers), notifications_(notifications) {}

  grpc::Status RegisterRegion(grpc::ServerContext*, const v1::RegisterRegionRequest* request,
                              v1::RegisterRegionResponse* response) override {
    auto region = regions_->Register(request->spec(), request->session_id());
    if (!region.ok()) return ToGrpcStatus(region.status());
    *response->mutable_region() = (*region)->Info();
    spdlog::info("region {} registered: '{}' {} bytes, session {}", (*region)->id(),
                 request->spec().name(), request->spec().size_bytes(), request->session_id());
    return grpc::Status::OK;
  }

  grpc::Status UnregisterRegion(grpc::ServerContext*, const v1::UnregisterRegionRequest* request,
                                v1::UnregisterRegionResponse*) override {
    return ToGrpcStatus(regions_->Unregister(request->region_id()));
  }

  grpc::Status SubmitTransfer(grpc::ServerContext*, const v1::SubmitTransferRequest* request,
                              v1::SubmitTransferResponse* response) override {
    auto accepted = transfers_->Submit(request->spec());
    if (!accepted.ok()) {
      spdlog::info("transfer rejected: {}", accepted.status().ToString());
      return ToGrpcStatus(accepted.status());
    }
    *response = *std::move(accepted);
    return grpc::Status::OK;
  }

  grpc::Status GetTransfer(grpc::ServerContext*, const v1::GetTransferRequest* request,
                           v1::TransferStatus* response) override {
    return Fill(transfers_->Get(request->transfer_id()), response);
  }

  grpc::Status WaitTransfer(grpc::ServerContext* context, const v1::WaitTransferRequest* request,
                            v1::TransferStatus* response) override {
    absl::Duration timeout = request->timeout_ms() == 0
                                 ? absl::InfiniteDuration()
                                 : absl::Milliseconds(request->timeout_ms());
    // Wait in slices so a client that went away frees its server thread.
    const absl::Time until = absl::Now() + timeout;
    while (true) {
      const absl::Duration slice = std::min(until - absl::Now(), absl::Milliseconds(250));
      auto status = transfers_->Wait(request->transfer_id(), std::max(slice, absl::ZeroDuration()));
      if (!status.ok()) return ToGrpcStatus(status.status());
      if (status->state() >= v1::TRANSFER_STATE_SUCCEEDED || absl::Now() >= until ||
          context->IsCancelled()) {
        *response = *std::move(status);
        return grpc::Status::OK;
      }
    }
  }

  grpc::Status WatchTransfer(grpc::ServerContext* context, const v1::WatchTransferRequest* request,
                             grpc::ServerWriter<v1::TransferEvent>* writer) override {
    const absl::Duration interval =
        absl::Milliseconds(request->min_interval_ms() == 0 ? 50 : request->min_interval_ms());
    return ToGrpcStatus(transfers_->Watch(request->transfer_id(), interval,
                                    [&](const v1::TransferEvent& event) {
                                      return !context->IsCancelled() && writer->Write(event);
                                    }));
  }

  grpc::Status CancelTransfer(grpc::ServerContext*, const v1::CancelTransferRequest* request,
                              v1::TransferStatus* response) override {
    return Fill(transfers_->Cancel(request->transfer_id()), response);
  }

  grpc::Status MarkReady(grpc::ServerContext*, const v1::MarkReadyRequest* request,
                         v1::MarkReadyResponse*) override {
    return ToGrpcStatus(
        transfers_->MarkReady(request->transfer_id(), request->layer_begin(), request->layer_count()));
  }

  grpc::Status PollNotifications(grpc::ServerContext*, const v1::NotificationPollRequest* request,
                                 v1::NotificationPollResponse* response) override {
    if (notifications_ == nullptr) {
      return ToGrpcStatus(absl::UnimplementedError("notifications: not enabled in this daemon"));
    }
    if (request->timeout_ms() > kMaxPollTimeoutMs) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("timeout_ms: ", request->timeout_ms(), " is above ", kMaxPollTimeoutMs)));
    }
    auto taken = notifications_->Take(request->session_id(), request->max_notifications(),
                                      absl::Milliseconds(request->timeout_ms()));
    if (!taken.ok()) return ToGrpcStatus(taken.status());
    for (auto& n : *taken) *response->add_notifications() = std::move(n);
    return grpc::Status::OK;
  }

  grpc::Status WatchNotifications(grpc::ServerContext* context,
                                  const v1::NotificationWatchRequest* request,
                                  grpc::ServerWriter<v1::Notification>* writer) override {
    if (notifications_ == nullptr) {
      return ToGrpcStatus(absl::UnimplementedError("notifications: not enabled in this daemon"));
    }
    bool first = true;
    // Slices of 250 ms so a client that went away frees its server thread.
    while (!context->IsCancelled()) {
      auto taken = notifications_->Take(request->session_id(), 0, absl::Milliseconds(250));
      if (!taken.ok()) {
        // The session ended while watched: the stream ends OK; unknown at the start: NOT_FOUND.
        return first ? ToGrpcStatus(taken.status()) : grpc::Status::OK;
      }
      first = false;
      for (const auto& n : *taken) {
        if (!writer->Write(n)) return grpc::Status::OK;
      }
    }
    return grpc::Status::OK;
  }

 private:
  static grpc::Status Fill(absl::StatusOr<v1::TransferStatus> status, v1::TransferStatus* out) {
    if (!status.ok()) return ToGrpcStatus(status.status());
    *out = *std::move(status);
    return grpc::Status::OK;
  }

  static constexpr uint32_t kMaxPollTimeoutMs = 60000;

  regions::RegionTable* const regions_;
  transfers::TransferManager* const transfers_;
  transfers::NotificationHub* const notifications_;
};

class AdminService final : public v1::Admin::Service {
 public:
  AdminService(const ServerOptions& options, regions::RegionTable* regions,
               transfers::TransferManager* transfers)
      : options_(options),
        regions_(regions),
        transfers_(transfers),
        started_us_(absl::ToUnixMicros(absl::Now())) {}

  grpc::Status GetTopology(grpc::ServerContext*, const v1::GetTopologyRequest*,
                           v1::GetTopologyResponse* response) override {
    *response = options_.topology;
    return grpc::Status::OK;
  }

  grpc::Status ListRegions(grpc::ServerContext*, const v1::ListRegionsRequest*,
                           v1::ListRegionsResponse* response) override {
    for (auto& info : regions_->List()) *response->add_regions() = std::move(info);
    return grpc::Status::OK;
  }

  grpc::Status ListTransfers(grpc::ServerContext*, const v1::ListTransfersRequest* request,
                             v1::ListTransfersResponse* response) override {
    transfers::ListFilter filter;
    for (int s : request->states()) filter.states.push_back(static_cast<v1::TransferState>(s));
    filter.limit = request->limit();
    filter.region_id = request->region_id();
    filter.label = request->label();
    filter.idempotency_key = request->idempotency_key();
    for (auto& status : transfers_->List(filter)) {
      *response->add_transfers() = std::move(status);
    }
    return grpc::Status::OK;
  }

  grpc::Status ListPeers(grpc::ServerContext*, const v1::ListPeersRequest*,
                         v1::ListPeersResponse* response) override {
    if (options_.list_peers) {
      for (auto& peer : options_.list_peers()) *response->add_peers() = std::move(peer);
      return grpc::Status::OK;
    }
    for (const auto& peer : options_.peers) *response->add_peers() = peer;
    return grpc::Status::OK;
  }

  grpc::Status GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                        v1::Stats* response) override {
    response->set_version(options_.version);
    response->set_node_id(options_.node_id);
    response->set_started_unix_us(started_us_);
    response->set_instance_id(options_.instance_id);
    response->set_regions(regions_->size());
    transfers_->FillStats(response);
    return grpc::Status::OK;
  }

 private:
  const ServerOptions options_;
  regions::RegionTable* const regions_;
  transfers::TransferManager* const transfers_;
  const int64_t started_us_;
};

class ServerImpl final : public Server {
 public:
  ServerImpl(std::unique_ptr<TransferService> transfer, std::unique_ptr<AdminService> admin)
      : transfer_(std::move(transfer)), admin_(std::move(admin)) {}

  absl::Status Build(const ServerOptions& options) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    for (const std::string& address : options.listen) {
      builder.AddListeningPort(address, grpc::InsecureServerCredentials(),
                               address.rfind("unix:", 0) == 0 ? nullptr : &tcp_port_);
    }
    builder.SetMaxReceiveMessageSize(256 << 20);
    builder.SetMaxSendMessageSize(256 << 20);
    builder.RegisterService(transfer_.get());
    builder.RegisterService(admin_.get());
    for (grpc::Service* service : options.extra_services) builder.RegisterService(service);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr) {
      return absl::UnavailableError(absl::StrCat("listen: could not bind every listen address (",
                                                 absl::StrJoin(options.listen, ", "), ")"));
    }
    if (auto* health = server_->GetHealthCheckService()) {
      health->SetServingStatus(true);
      health->SetServingStatus("kvrail.v1.Transfer", true);
    }
    return absl::OkStatus();
  }

  void SetNotServing() override {
    if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  }

  void Shutdown(absl::Duration deadline) override {
    server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline));
  }

  int tcp_port() const override { return tcp_port_; }

 private:
  std::unique_ptr<TransferService> transfer_;
  std::unique_ptr<AdminService> admin_;
  std::unique_ptr<grpc::Server> server_;
  int tcp_port_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      regions::RegionTable* regions,
                                                      transfers::TransferManager* transfers) {
  auto server = std::make_unique<ServerImpl>(std::make_unique<TransferService>(regions, transfers, options.notifications),
                                             std::make_unique<AdminService>(options, regions, transfers));
  absl::Status status = server->Build(options);
  if (!status.ok()) return status;
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace kvrail::server

#include "daemon/server/server.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/grpc_status.h"
#include "base/logging.h"
#include "base/status.h"
#include "daemon/server/caller.h"
#include "daemon/server/change_gate.h"
#include "daemon/server/watch_calls.h"
#include "proto/kvrail/v1/admin.grpc.pb.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace kvrail::server {
namespace {

// The caller of a Transfer or Admin call (docs/security.md): PERMISSION_DENIED over TCP unless
// the API is served there, else CallerFromMetadata.
absl::StatusOr<sessions::Caller> CallerOf(grpc::ServerContextBase* context,
                                          const sessions::SessionTable& sessions,
                                          bool tcp_serves_api) {
  if (!tcp_serves_api && !IsLocal(*context)) {
    return absl::PermissionDeniedError(
        "Transfer and Admin calls are served on kvraild's unix socket only (TCP serves the Peer "
        "service; DaemonConfig.tcp_serves_api opts in)");
  }
  return CallerFromMetadata(*context, sessions);
}

#define KVRAIL_CALLER_OR_RETURN(caller)                                                   \
  absl::StatusOr<sessions::Caller> caller##_or = CallerOf(context, *sessions_, tcp_api_); \
  if (!caller##_or.ok()) return ToGrpcStatus(caller##_or.status());                       \
  const sessions::Caller caller = *caller##_or

#define KVRAIL_WATCHER_OR_REFUSE(slot, caller, refuse)               \
  absl::StatusOr<WatcherCounts::Slot> slot = watchers_.Take(caller); \
  if (!slot.ok()) return refuse(ToGrpcStatus(slot.status()))

// A unary callback call answered before it began to wait (a refusal, or what is there now).
grpc::ServerUnaryReactor* AnsweredUnary(grpc::CallbackServerContext* context,
                                        const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

// PollNotifications made on the successor after a handover, without holding a thread: the
// successor's answer finishes the caller's call. Deletes itself when the forwarded call is done.
class ForwardedPoll final : public grpc::ClientUnaryReactor {
 public:
  // Starts the call; the returned reactor answers the caller.
  static grpc::ServerUnaryReactor* Start(grpc::CallbackServerContext* context,
                                         v1::Transfer::Stub* successor,
                                         const v1::NotificationPollRequest* request,
                                         v1::NotificationPollResponse* response) {
    if (successor == nullptr) {
      return AnsweredUnary(context, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                 "kvraild handed over to its successor; call it "
                                                 "(reconnect)"));
    }
    auto* forwarded = new ForwardedPoll(context->DefaultReactor());
    PrepareForwardedCall(*context, &forwarded->out_);
    successor->async()->PollNotifications(&forwarded->out_, request, response, forwarded);
    forwarded->StartCall();
    return forwarded->answer_;
  }

  void OnDone(const grpc::Status& status) override {
    answer_->Finish(status);
    delete this;
  }

 private:
  explicit ForwardedPoll(grpc::ServerUnaryReactor* answer) : answer_(answer) {}
  grpc::ServerUnaryReactor* const answer_;
  grpc::ClientContext out_;
};

// How often the watch pump looks at every open wait and watch (a transfer's end wakes it at
// once): the most a watch event waits to be sent.
constexpr absl::Duration kWatchTick = absl::Milliseconds(5);

// In a Transfer call that changes handed-over state: waits while a handover is prepared; after
// one, answers with the successor's answer. Otherwise counts the call until it returns.
#define KVRAIL_GATE_OR_FORWARD(method)                                           \
  if (gate_->Enter() == ChangeGate::Mode::kForward) {                            \
    return ForwardCall(*context, gate_->successor(),                             \
                       [&](v1::Transfer::Stub* stub, grpc::ClientContext* out) { \
                         return stub->method(out, *request, response);           \
                       });                                                       \
  }                                                                              \
  struct GateLeave {                                                             \
    ChangeGate* gate;                                                            \
    ~GateLeave() { gate->Leave(); }                                              \
  } gate_leave {                                                                 \
    gate_                                                                        \
  }

// WaitTransfer, WatchTransfer, WatchNotifications and PollNotifications are callback methods
// driven by the watch pump (watch_calls.h): they hold no thread while they wait. The rest answer
// at once on gRPC's synchronous pool.
class TransferService final
    : public v1::Transfer::WithCallbackMethod_WaitTransfer<
          v1::Transfer::WithCallbackMethod_WatchTransfer<
              v1::Transfer::WithCallbackMethod_WatchNotifications<
                  v1::Transfer::WithCallbackMethod_PollNotifications<v1::Transfer::Service>>>> {
 public:
  TransferService(const sessions::SessionTable* sessions, regions::RegionTable* regions,
                  access::Grants* grants, transfers::TransferManager* transfers,
                  transfers::NotificationHub* notifications, bool tcp_api,
                  uint32_t max_watchers_per_session, uint32_t max_watchers_per_uid,
                  ChangeGate* gate, ExportRegionFn export_region)
      : sessions_(sessions),
        regions_(regions),
        grants_(grants),
        transfers_(transfers),
        notifications_(notifications),
        tcp_api_(tcp_api),
        watchers_(max_watchers_per_session, max_watchers_per_uid),
        pump_(std::make_shared<WatchPump>(kWatchTick)),
        gate_(gate),
        export_region_(std::move(export_region)) {}

  size_t open_watches() const { return pump_->open(); }

  grpc::Status RegisterRegion(grpc::ServerContext* context,
                              const v1::RegisterRegionRequest* request,
                              v1::RegisterRegionResponse* response) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    KVRAIL_GATE_OR_FORWARD(RegisterRegion);
    if (caller.session_id == 0) {
      return ToGrpcStatus(absl::PermissionDeniedError(
          "session_id: regions belong to a session; register over the unix socket with the "
          "session's kvrail-session credentials (the client library does)"));
    }
    if (request->session_id() != 0 && request->session_id() != caller.session_id) {
      return ToGrpcStatus(absl::PermissionDeniedError(
          absl::StrCat("session_id: ", request->session_id(), " is not the caller's session")));
    }
    auto region = regions_->Register(request->spec(), caller.session_id);
    if (!region.ok()) return ToGrpcStatus(region.status());
    *response->mutable_region() = (*region)->Info();
    // The name is the client's text: a field, never part of the message.
    LogFields(spdlog::level::info, "region registered",
              {{"region_id", (*region)->id()},
               {"region_name", request->spec().name()},
               {"bytes", request->spec().size_bytes()},
               {"session_id", caller.session_id}});
    return grpc::Status::OK;
  }

  grpc::Status UnregisterRegion(grpc::ServerContext* context,
                                const v1::UnregisterRegionRequest* request,
                                v1::UnregisterRegionResponse* response) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    KVRAIL_GATE_OR_FORWARD(UnregisterRegion);
    return ToGrpcStatus(regions_->Unregister(request->region_id(), caller));
  }

  grpc::Status SubmitTransfer(grpc::ServerContext* context,
                              const v1::SubmitTransferRequest* request,
                              v1::SubmitTransferResponse* response) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    KVRAIL_GATE_OR_FORWARD(SubmitTransfer);
    // The submitter is who the credentials say, whatever the spec claims.
    v1::TransferSpec spec = request->spec();
    spec.set_session_id(caller.session_id);
    auto accepted = transfers_->Submit(spec);
    if (!accepted.ok()) {
      spdlog::info("transfer rejected: {}", accepted.status().ToString());
      return ToGrpcStatus(accepted.status());
    }
    *response = *std::move(accepted);
    return grpc::Status::OK;
  }

  // Prepared transfers: the caller's credentials name the owning session; the manager checks
  // the rest (transfers.h).
  grpc::Status PrepareTransfer(grpc::ServerContext* context,
                               const v1::PrepareTransferRequest* request,
                               v1::PrepareTransferResponse* response) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    KVRAIL_GATE_OR_FORWARD(PrepareTransfer);
    return Fill(transfers_->Prepare(caller, *request), response);
  }

  grpc::Status PostTransfer(grpc::ServerContext* context, const v1::PostTransferRequest* request,
                            v1::SubmitTransferResponse* response) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    KVRAIL_GATE_OR_FORWARD(PostTransfer);
    return Fill(transfers_->Post(caller, *request), response);
  }

  grpc::Status ReleasePrepared(grpc::ServerContext* context,
                               const v1::ReleasePreparedRequest* request,
                               v1::ReleasePreparedResponse*) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    return ToGrpcStatus(transfers_->ReleasePrepared(caller, request->prepared_id()));
  }

  grpc::Status GetTransfer(grpc::ServerContext* context, const v1::GetTransferRequest* request,
                           v1::TransferStatus* response) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    return Fill(transfers_->Get(caller, request->transfer_id()), response);
  }

  grpc::ServerUnaryReactor* WaitTransfer(grpc::CallbackServerContext* context,
                                         const v1::WaitTransferRequest* request,
                                         v1::TransferStatus* response) override {
    auto refuse = [context](const grpc::Status& status) { return AnsweredUnary(context, status); };
    absl::StatusOr<sessions::Caller> caller = CallerOf(context, *sessions_, tcp_api_);
    if (!caller.ok()) return refuse(ToGrpcStatus(caller.status()));
    // A refusal comes before the watcher cap (the manager checks the caller on every call).
    if (auto readable = transfers_->Get(*caller, request->transfer_id()); !readable.ok()) {
      return refuse(ToGrpcStatus(readable.status()));
    }
    KVRAIL_WATCHER_OR_REFUSE(slot, *caller, refuse);
    const absl::Duration timeout = request->timeout_ms() == 0
                                       ? absl::InfiniteDuration()
                                       : absl::Milliseconds(request->timeout_ms());
    return StartWait(context, *caller, request->transfer_id(), timeout, response, *std::move(slot),
                     transfers_, pump_);
  }

  grpc::ServerWriteReactor<v1::TransferEvent>* WatchTransfer(
      grpc::CallbackServerContext* context, const v1::WatchTransferRequest* request) override {
    auto refuse = RefusedStream<v1::TransferEvent>;
    absl::StatusOr<sessions::Caller> caller = CallerOf(context, *sessions_, tcp_api_);
    if (!caller.ok()) return refuse(ToGrpcStatus(caller.status()));
    if (auto readable = transfers_->Get(*caller, request->transfer_id()); !readable.ok()) {
      return refuse(ToGrpcStatus(readable.status()));
    }
    KVRAIL_WATCHER_OR_REFUSE(slot, *caller, refuse);
    const absl::Duration interval =
        absl::Milliseconds(request->min_interval_ms() == 0 ? 50 : request->min_interval_ms());
    // The stream ends when the client goes, even while the transfer makes no progress.
    return StartWatch(context, *caller, request->transfer_id(), interval, *std::move(slot),
                      transfers_, pump_);
  }

  grpc::Status CancelTransfer(grpc::ServerContext* context,
                              const v1::CancelTransferRequest* request,
                              v1::TransferStatus* response) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    // The manager decides who may (the operator's audited cancel included).
    return Fill(transfers_->Cancel(caller, request->transfer_id()), response);
  }

  grpc::Status MarkReady(grpc::ServerContext* context, const v1::MarkReadyRequest* request,
                         v1::MarkReadyResponse*) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    return ToGrpcStatus(transfers_->MarkReady(caller, request->transfer_id(),
                                              request->layer_begin(), request->layer_count()));
  }

  grpc::Status CreateGrant(grpc::ServerContext* context, const v1::CreateGrantRequest* request,
                           v1::Grant* response) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    KVRAIL_GATE_OR_FORWARD(CreateGrant);
    auto grant = grants_->CreateGrant(*request, caller);
    if (!grant.ok()) return ToGrpcStatus(grant.status());
    *response = *std::move(grant);
    KVRAIL_DEBUG("grant of region {} ({}) to be used by another party", response->region_id(),
                 v1::GrantAccess_Name(response->access()));
    return grpc::Status::OK;
  }

  grpc::Status RevokeGrant(grpc::ServerContext* context, const v1::RevokeGrantRequest* request,
                           v1::RevokeGrantResponse* response) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    KVRAIL_GATE_OR_FORWARD(RevokeGrant);
    return ToGrpcStatus(grants_->RevokeGrant(request->token(), caller));
  }

  // Exporting lets another node write the region: its owner's decision alone, made on this
  // node (the unix socket, whatever tcp_serves_api says). Deny by default: an anonymous caller
  // is refused before any lookup, any session but the owner's after it (MayExport).
  grpc::Status ExportRegion(grpc::ServerContext* context, const v1::ExportRegionRequest* request,
                            v1::RegionLease* response) override {
    if (!IsLocal(*context)) {
      return ToGrpcStatus(absl::PermissionDeniedError(
          "region_id: ExportRegion is served on kvraild's unix socket only (the region's owner "
          "exports it; TCP never does, tcp_serves_api or not)"));
    }
    absl::StatusOr<sessions::Caller> caller = CallerFromMetadata(*context, *sessions_);
    if (!caller.ok()) return ToGrpcStatus(caller.status());
    absl::Status allowed = MayExport(*caller, request->region_id());
    if (!allowed.ok()) return ToGrpcStatus(allowed);
    if (!export_region_) {
      return ToGrpcStatus(
          absl::FailedPreconditionError("peer_node_id: this daemon has no fabric (neither "
                                        "DaemonConfig.peers nor etcd is set); it "
                                        "exports to no node"));
    }
    absl::StatusOr<v1::RegionLease> lease =
        export_region_(request->region_id(), request->peer_node_id());
    if (!lease.ok()) return ToGrpcStatus(lease.status());
    *response = *std::move(lease);
    return grpc::Status::OK;
  }

  // Answers at once when something is queued or the caller does not wait; a poll that waits
  // takes a watcher place (the caps of WaitTransfer and the watches) and no thread.
  grpc::ServerUnaryReactor* PollNotifications(grpc::CallbackServerContext* context,
                                              const v1::NotificationPollRequest* request,
                                              v1::NotificationPollResponse* response) override {
    auto refuse = [context](const grpc::Status& status) { return AnsweredUnary(context, status); };
    absl::StatusOr<sessions::Caller> caller = CallerOf(context, *sessions_, tcp_api_);
    if (!caller.ok()) return refuse(ToGrpcStatus(caller.status()));
    if (gate_->forwarding()) {
      return ForwardedPoll::Start(context, gate_->successor(), request, response);
    }
    if (absl::Status readable = NotificationsReadable(request->session_id(), *caller);
        !readable.ok()) {
      return refuse(ToGrpcStatus(readable));
    }
    if (request->timeout_ms() > kMaxPollTimeoutMs) {
      return refuse(ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("timeout_ms: ", request->timeout_ms(), " is above ", kMaxPollTimeoutMs))));
    }
    auto taken = notifications_->Take(request->session_id(), request->max_notifications(),
                                      absl::ZeroDuration());
    if (!taken.ok()) return refuse(ToGrpcStatus(taken.status()));
    if (!taken->empty() || request->timeout_ms() == 0) {
      for (auto& n : *taken) *response->add_notifications() = std::move(n);
      return AnsweredUnary(context, grpc::Status::OK);
    }
    KVRAIL_WATCHER_OR_REFUSE(slot, *caller, refuse);
    return StartPoll(context, request->session_id(), request->max_notifications(),
                     absl::Milliseconds(request->timeout_ms()), response, *std::move(slot),
                     notifications_, pump_);
  }

  grpc::ServerWriteReactor<v1::Notification>* WatchNotifications(
      grpc::CallbackServerContext* context, const v1::NotificationWatchRequest* request) override {
    auto refuse = RefusedStream<v1::Notification>;
    absl::StatusOr<sessions::Caller> caller = CallerOf(context, *sessions_, tcp_api_);
    if (!caller.ok()) return refuse(ToGrpcStatus(caller.status()));
    if (absl::Status readable = NotificationsReadable(request->session_id(), *caller);
        !readable.ok()) {
      return refuse(ToGrpcStatus(readable));
    }
    KVRAIL_WATCHER_OR_REFUSE(slot, *caller, refuse);
    return StartNotificationWatch(context, request->session_id(), *std::move(slot), notifications_,
                                  pump_);
  }

 private:
  template <typename Message>
  static grpc::Status Fill(absl::StatusOr<Message> status, Message* out) {
    if (!status.ok()) return ToGrpcStatus(status.status());
    *out = *std::move(status);
    return grpc::Status::OK;
  }

  // PERMISSION_DENIED unless `caller` is the session whose queue it asks for; UNIMPLEMENTED
  // without a notification hub.
  absl::Status NotificationsReadable(uint64_t session_id, const sessions::Caller& caller) const {
    if (session_id != caller.session_id) {
      return absl::PermissionDeniedError(
          "session_id: notifications are read by their own session only");
    }
    if (notifications_ == nullptr) {
      return absl::UnimplementedError("notifications: not enabled in this daemon");
    }
    return absl::OkStatus();
  }

  // OK when `caller` may export region `region_id`: its owner session, and the region is a
  // transfer endpoint (not a client library's own). Errors name region_id.
  absl::Status MayExport(const sessions::Caller& caller, uint64_t region_id) const {
    if (caller.session_id == 0) {
      return absl::PermissionDeniedError(absl::StrCat(
          "region_id: region ", region_id,
          " may be exported by its owner's session only; this call has no kvrail-session "
          "credentials (the client library sends them)"));
    }
    absl::StatusOr<std::shared_ptr<regions::Region>> region = regions_->Get(region_id);
    if (!region.ok()) {
      return absl::NotFoundError(absl::StrCat("region_id: ", region.status().message()));
    }
    if ((*region)->session_id() != caller.session_id) {
      return absl::PermissionDeniedError(
          absl::StrCat("region_id: region ", region_id,
                       " belongs to another session; only its owner may export it"));
    }
    if ((*region)->spec().library_region()) {
      // The client library's own region (block tables) is no transfer endpoint, remote or local.
      return absl::PermissionDeniedError(absl::StrCat(
          "region_id: region ", region_id,
          " is a client library's own region (RegionSpec.library_region); it cannot be exported"));
    }
    return absl::OkStatus();
  }

  static constexpr uint32_t kMaxPollTimeoutMs = 60000;

  const sessions::SessionTable* const sessions_;
  regions::RegionTable* const regions_;
  access::Grants* const grants_;
  transfers::TransferManager* const transfers_;
  transfers::NotificationHub* const notifications_;
  const bool tcp_api_;
  WatcherCounts watchers_;
  // Declared after watchers_: destroyed first (its calls give their places back).
  const std::shared_ptr<WatchPump> pump_;
  ChangeGate* const gate_;  // the server's; outlives the service
  const ExportRegionFn export_region_;
};

class AdminService final : public v1::Admin::Service {
 public:
  AdminService(const ServerOptions& options, const sessions::SessionTable* sessions,
               regions::RegionTable* regions, transfers::TransferManager* transfers)
      : tcp_api_(options.tcp_serves_api),
        options_(options),
        sessions_(sessions),
        regions_(regions),
        transfers_(transfers),
        started_us_(absl::ToUnixMicros(absl::Now())) {}

  grpc::Status GetTopology(grpc::ServerContext* context, const v1::GetTopologyRequest*,
                           v1::GetTopologyResponse* response) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    (void)caller;
    *response = options_.topology;
    return grpc::Status::OK;
  }

  // The operator sees every region; anyone else only its own session's (their handles and
  // shm names are the owner's business).
  grpc::Status ListRegions(grpc::ServerContext* context, const v1::ListRegionsRequest*,
                           v1::ListRegionsResponse* response) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    const bool operator_role = caller.operator_role();
    for (auto& info : regions_->List()) {
      if (!operator_role && (caller.session_id == 0 || info.session_id() != caller.session_id)) {
        continue;
      }
      *response->add_regions() = std::move(info);
    }
    return grpc::Status::OK;
  }

  // The operator sees every transfer; anyone else those it submitted.
  grpc::Status ListTransfers(grpc::ServerContext* context, const v1::ListTransfersRequest* request,
                             v1::ListTransfersResponse* response) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    transfers::ListFilter filter;
    for (int s : request->states()) filter.states.push_back(static_cast<v1::TransferState>(s));
    filter.limit = request->limit();
    filter.region_id = request->region_id();
    filter.label = request->label();
    filter.idempotency_key = request->idempotency_key();
    auto listed = transfers_->ListChecked(caller, filter);
    if (!listed.ok()) return ToGrpcStatus(listed.status());
    for (auto& status : *listed) *response->add_transfers() = std::move(status);
    return grpc::Status::OK;
  }

  grpc::Status ListPeers(grpc::ServerContext* context, const v1::ListPeersRequest*,
                         v1::ListPeersResponse* response) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    (void)caller;
    if (options_.list_peers) {
      for (auto& peer : options_.list_peers()) *response->add_peers() = std::move(peer);
      return grpc::Status::OK;
    }
    for (const auto& peer : options_.peers) *response->add_peers() = peer;
    return grpc::Status::OK;
  }

  grpc::Status GetStats(grpc::ServerContext* context, const v1::GetStatsRequest*,
                        v1::Stats* response) override {
    KVRAIL_CALLER_OR_RETURN(caller);
    (void)caller;
    *response = options_.stats_base;
    response->set_version(options_.version);
    response->set_node_id(options_.node_id);
    response->set_started_unix_us(started_us_);
    response->set_instance_id(options_.instance_id);
    response->set_lineage_id(options_.lineage_id.empty() ? options_.instance_id
                                                         : options_.lineage_id);
    response->set_regions(regions_->size());
    transfers_->FillStats(response);
    if (options_.directory_status) *response->mutable_directory() = options_.directory_status();
    return grpc::Status::OK;
  }

 private:
  const bool tcp_api_;  // declared first: initialised first
  const ServerOptions options_;
  const sessions::SessionTable* const sessions_;
  regions::RegionTable* const regions_;
  transfers::TransferManager* const transfers_;
  const int64_t started_us_;
};

// Health service name of the peer directory (readiness detail; liveness is "").
constexpr char kDirectoryHealth[] = "kvrail.v1.Directory";

class ServerImpl final : public Server {
 public:
  ServerImpl(std::unique_ptr<ChangeGate> gate, std::unique_ptr<TransferService> transfer,
             std::unique_ptr<AdminService> admin)
      : gate_(std::move(gate)), transfer_(std::move(transfer)), admin_(std::move(admin)) {}

  absl::Status Build(const ServerOptions& options) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    for (const std::string& address : options.listen) {
      const bool unix_socket = address.rfind("unix:", 0) == 0;
      // TCP: the peers' mTLS credentials when given (DaemonConfig.peer_tls).
      builder.AddListeningPort(address,
                               unix_socket || options.tcp_credentials == nullptr
                                   ? grpc::InsecureServerCredentials()
                                   : options.tcp_credentials,
                               unix_socket ? nullptr : &tcp_port_);
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
      if (options.directory_status) {
        health->SetServingStatus(kDirectoryHealth,
                                 options.directory_status().state() == v1::DIRECTORY_STATE_OK);
      }
    }
    return absl::OkStatus();
  }

  void SetDirectoryServing(bool ok) override {
    if (auto* health = server_->GetHealthCheckService()) {
      health->SetServingStatus(kDirectoryHealth, ok);
    }
  }

  void SetNotServing() override {
    if (auto* health = server_->GetHealthCheckService()) {
      health->SetServingStatus("kvrail.v1.Transfer", false);
    }
  }

  void Shutdown(absl::Duration deadline) override {
    server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline));
  }

  int tcp_port() const override { return tcp_port_; }

  void HoldChanges() override { gate_->Hold(); }
  void ResumeChanges() override { gate_->Resume(); }
  void ForwardChanges(const std::string& successor) override { gate_->Forward(successor); }

 private:
  const std::unique_ptr<ChangeGate> gate_;  // declared first: outlives the services
  std::unique_ptr<TransferService> transfer_;
  std::unique_ptr<AdminService> admin_;
  std::unique_ptr<grpc::Server> server_;
  int tcp_port_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      const sessions::SessionTable* sessions,
                                                      regions::RegionTable* regions,
                                                      access::Grants* grants,
                                                      transfers::TransferManager* transfers) {
  auto gate = std::make_unique<ChangeGate>();
  auto transfer = std::make_unique<TransferService>(
      sessions, regions, grants, transfers, options.notifications, options.tcp_serves_api,
      options.max_watchers_per_session, options.max_watchers_per_uid, gate.get(),
      options.export_region);
  auto server = std::make_unique<ServerImpl>(
      std::move(gate), std::move(transfer),
      std::make_unique<AdminService>(options, sessions, regions, transfers));
  absl::Status status = server->Build(options);
  if (!status.ok()) return status;
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace kvrail::server

// Client's session part (client_impl.h lists the parts): the session connection, opened, watched
// for the daemon's close, lost and reset, and Connect.
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "client/client_impl.h"
#include "client/completion_table.h"
#include "client/kvrail_client.h"
#include "client/submission_queue.h"
#include "grpcpp/grpcpp.h"
#include "proto/kvrail/v1/admin.grpc.pb.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "wire/session_wire.h"

namespace kvrail::client {
namespace {

// Responses such as ListTransfers with many block ids can exceed gRPC's 4 MiB default.
constexpr int kMaxMessageBytes = 256 << 20;

ParsedTarget ParseTarget(const std::string& target) {
  ParsedTarget parsed;
  if (absl::StartsWith(target, "unix:")) {
    parsed.unix_path = target.substr(5);
    // gRPC accepts "unix:///abs/path"; reduce it to the path for the session socket.
    if (absl::StartsWith(parsed.unix_path, "//")) parsed.unix_path = parsed.unix_path.substr(2);
  } else if (target.find('/') != std::string::npos || target.find(':') == std::string::npos) {
    parsed.unix_path = target;
  } else {
    parsed.grpc_target = target;
    return parsed;
  }
  parsed.grpc_target = "unix:" + parsed.unix_path;
  return parsed;
}

// The line of daemons a session belongs to: Stats.lineage_id, kept across hot restarts
// (instance_id from daemons without it). The session greeting names the same.
const std::string& LineageOf(const v1::Stats& stats) {
  return stats.lineage_id().empty() ? stats.instance_id() : stats.lineage_id();
}

// Who the errors name: "kvraild on unix socket PATH" or "kvraild at HOST:PORT".
std::string Where(const ParsedTarget& parsed) {
  return parsed.unix_path.empty() ? absl::StrCat("kvraild at ", parsed.grpc_target)
                                  : absl::StrCat("kvraild on unix socket ", parsed.unix_path);
}

constexpr char kHint[] = " (is kvraild running? pass --socket or set KVRAIL_SOCKET)";

// UNAVAILABLE when `unix_path` names no socket (a stopped kvraild removes its own); OK for TCP.
absl::Status CheckSocket(const std::string& unix_path, const std::string& where) {
  if (unix_path.empty()) return absl::OkStatus();
  struct stat st;
  if (::stat(unix_path.c_str(), &st) != 0) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat(where, " is not reachable: ", strerror(err), kHint));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::UnavailableError(
        absl::StrCat(where, " is not reachable: ", unix_path, " is not a socket"));
  }
  return absl::OkStatus();
}

}  // namespace

// An infinite `timeout` sets none.
void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return;
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

absl::Status ErrnoError(absl::string_view what) {
  const int err = errno;
  return absl::Status(absl::ErrnoToStatusCode(err), absl::StrCat(what, ": ", strerror(err)));
}

// --- Client::Impl: the session ---------------------------------------------------------------

Client::Impl::Impl(const ClientOptions& options, ParsedTarget parsed,
                   std::shared_ptr<grpc::Channel> channel, absl::Duration probe_timeout)
    : target_(options.target),
      grpc_target_(std::move(parsed.grpc_target)),
      unix_path_(std::move(parsed.unix_path)),
      where_(Where({grpc_target_, unix_path_})),
      options_(options),
      probe_timeout_(probe_timeout),
      channel_(std::move(channel)),
      transfer_(v1::Transfer::NewStub(channel_)),
      admin_(v1::Admin::NewStub(channel_)),
      session_submit_(options.submit_via_session) {}

Client::Impl::~Impl() {
  absl::MutexLock lock(&session_mu_);
  StopMonitorLocked();
}

void Client::Impl::OpenCompletionQueueLocked() {
  if (!options_.completion_queue) return;
  absl::StatusOr<std::unique_ptr<CompletionTable>> table =
      CompletionTable::Create(options_.completion_queue_entries, options_.completion_spin);
  // Without a queue (an older daemon, no memfd) everything goes the old way.
  if (!table.ok() || !session_->SendCompletionQueue((*table)->memfd(), (*table)->eventfd()).ok()) {
    return;
  }
  completions_.store(table->get());
  tables_.push_back(*std::move(table));
}

void Client::Impl::AbandonCompletions() {
  if (CompletionTable* table = completions_.exchange(nullptr)) table->Abandon();
  submissions_.store(nullptr);
}

void Client::Impl::OpenSubmissionQueueLocked() {
  if (!options_.submission_queue || !session_submit_.load()) return;
  absl::StatusOr<std::unique_ptr<SubmissionQueue>> queue =
      SubmissionQueue::Create(options_.submission_queue_slots, options_.submission_spin);
  // Without one (an older daemon, a daemon that takes none) submits go by packets.
  if (!queue.ok() || !session_
                          ->SendSubmissionQueue((*queue)->sq_memfd(), (*queue)->sq_eventfd(),
                                                (*queue)->ack_memfd(), (*queue)->ack_eventfd())
                          .ok()) {
    return;
  }
  submissions_.store(queue->get());
  queues_.push_back(*std::move(queue));
}

std::unique_ptr<wire::SessionConnection> Client::Impl::TakeWaitConnection() {
  {
    absl::MutexLock lock(&wait_mu_);
    if (!idle_waits_.empty()) {
      auto conn = std::move(idle_waits_.back());
      idle_waits_.pop_back();
      return conn;
    }
  }
  auto opened = wire::SessionConnection::Open(wire::SessionSocketPath(unix_path_));
  if (!opened.ok()) return nullptr;
  (*opened)->SetAnswerSpin(options_.answer_spin);
  return *std::move(opened);
}

void Client::Impl::ReturnWaitConnection(std::unique_ptr<wire::SessionConnection> conn) {
  absl::MutexLock lock(&wait_mu_);
  if (idle_waits_.size() < 8) idle_waits_.push_back(std::move(conn));
}

absl::StatusOr<std::shared_ptr<wire::SessionConnection>> Client::Impl::Session() {
  KVRAIL_RETURN_IF_ERROR(Lost());
  std::string lost_why;
  {
    absl::MutexLock lock(&session_mu_);
    if (session_ != nullptr) {
      // With the monitor watching for the daemon's close (it marks the session lost, checked
      // above) the poll syscall is not repeated on every call; without it, it is.
      if (monitor_.joinable() || !session_->PeerClosed()) return session_;
      lost_why = absl::StrCat("kvraild closed session ", session_->session_id(),
                              " (it stopped or restarted)");
    } else {
      if (unix_path_.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("host buffers are shared over kvraild's unix session socket; target ",
                         target_, " is TCP (connect with the unix socket path)"));
      }
      KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<wire::SessionConnection> opened,
                              wire::SessionConnection::Open(wire::SessionSocketPath(unix_path_)));
      const std::string known = instance_id();
      if (known.empty() || opened->instance_id().empty() || opened->instance_id() == known) {
        opened->SetAnswerSpin(options_.answer_spin);
        session_ = std::move(opened);
        StartMonitorLocked();
        OpenCompletionQueueLocked();
        OpenSubmissionQueueLocked();
        return session_;
      }
      lost_why = absl::StrCat("kvraild restarted (instance ", known, " when connected, now ",
                              opened->instance_id(), ")");
    }
  }
  MarkLost(lost_why);
  return Lost();
}

void Client::Impl::Bind(grpc::ClientContext* context) {
  if (!Lost().ok()) return;  // a lost session's secret means nothing to the new daemon
  absl::MutexLock lock(&session_mu_);
  if (session_ != nullptr && !session_->secret().empty()) {
    context->AddMetadata(wire::kSessionMetadataKey,
                         wire::SessionMetadataValue(session_->session_id(), session_->secret()));
  }
}

std::string Client::Impl::Credential() {
  if (!Lost().ok()) return "";
  absl::MutexLock lock(&session_mu_);
  if (session_ == nullptr || session_->secret().empty()) return "";
  return wire::SessionMetadataValue(session_->session_id(), session_->secret());
}

uint64_t Client::Impl::OpenSessionId() {
  absl::MutexLock lock(&session_mu_);
  return session_ != nullptr && !session_->PeerClosed() ? session_->session_id() : 0;
}

absl::Status Client::Impl::Lost() const {
  absl::MutexLock lock(&lost_mu_);
  return lost_;
}

std::string Client::Impl::instance_id() const {
  absl::MutexLock lock(&lost_mu_);
  return instance_id_;
}

void Client::Impl::MarkLost(const std::string& why) {
  std::function<void(const absl::Status&)> callback;
  absl::Status lost;
  {
    absl::MutexLock lock(&lost_mu_);
    if (!lost_.ok()) return;
    lost_ = absl::FailedPreconditionError(absl::StrCat(
        "session lost: ", why,
        "; the regions this client registered are gone (reset the session and register them "
        "again)"));
    lost = lost_;
    callback = on_lost_;
    AbandonCompletions();
  }
  if (callback) callback(lost);
}

absl::Status Client::Impl::Checked(absl::Status status) {
  if (status.ok()) return status;
  if (absl::Status lost = Lost(); !lost.ok()) return lost;
  // A stale id is NOT_FOUND, a daemon between lives UNAVAILABLE, the old session's
  // credentials on a new daemon UNAUTHENTICATED.
  if (status.code() != absl::StatusCode::kNotFound &&
      status.code() != absl::StatusCode::kUnavailable &&
      status.code() != absl::StatusCode::kUnauthenticated) {
    return status;
  }
  const std::string known = instance_id();
  if (known.empty()) return status;
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(2));
  v1::Stats stats;
  if (!admin_->GetStats(&context, v1::GetStatsRequest(), &stats).ok() || LineageOf(stats).empty() ||
      LineageOf(stats) == known) {
    return status;
  }
  MarkLost(absl::StrCat("kvraild restarted (instance ", known, " when connected, now ",
                        LineageOf(stats), ")"));
  return Lost();
}

absl::StatusOr<v1::Stats> Client::Impl::Probe() {
  KVRAIL_RETURN_IF_ERROR(CheckSocket(unix_path_, where_));
  grpc::experimental::ChannelResetConnectionBackoff(channel_.get());
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  SetDeadline(&context, probe_timeout_);
  v1::Stats stats;
  const grpc::Status status = admin_->GetStats(&context, v1::GetStatsRequest(), &stats);
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat(where_, " is not answering: ", status.error_message(), kHint));
  }
  return stats;
}

void Client::Impl::StartMonitorLocked() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;  // no monitor: the next call still finds out
  monitor_wake_read_ = UniqueFd(fds[0]);
  monitor_wake_write_ = UniqueFd(fds[1]);
  monitor_ = std::thread([this, conn = session_, wake = monitor_wake_read_.get()] {
    absl::StatusOr<bool> closed = conn->WaitForClose(wake);
    if (closed.ok() && *closed) {
      MarkLost(absl::StrCat("kvraild closed session ", conn->session_id(),
                            " (it stopped or restarted)"));
    }
  });
}

void Client::Impl::StopMonitorLocked() {
  if (!monitor_.joinable()) return;
  const char byte = 1;
  (void)!::write(monitor_wake_write_.get(), &byte, 1);
  if (monitor_.get_id() == std::this_thread::get_id()) {
    monitor_.detach();  // reset from the loss callback: the thread only returns from here
  } else {
    monitor_.join();
  }
  monitor_wake_read_ = UniqueFd();
  monitor_wake_write_ = UniqueFd();
}

// --- Client: connecting, the session --------------------------------------------------------

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

const std::string& Client::target() const { return impl_->target_; }
const std::string& Client::grpc_target() const { return impl_->grpc_target_; }
const std::string& Client::unix_socket_path() const { return impl_->unix_path_; }

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        absl::Duration probe_timeout) {
  ClientOptions options = ClientOptions::FromEnvironment();
  options.target = target;
  return Connect(options, probe_timeout);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options,
                                                        absl::Duration probe_timeout) {
  if (options.target.empty()) return absl::InvalidArgumentError("empty kvraild target");
  ParsedTarget parsed = ParseTarget(options.target);
  const std::string where = Where(parsed);
  KVRAIL_RETURN_IF_ERROR(CheckSocket(parsed.unix_path, where));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // A lost connection is tried again within 100 ms (gRPC's default waits a second, failing
  // every call meanwhile): a hot restart's successor serves the path at once.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Calls that change nothing are tried again on UNAVAILABLE: a connection idle since a hot
  // restart is found dead only when a call is written to it ("Broken pipe"), and gRPC does not
  // retry that itself. Calls that change state are not retried here (they may have arrived).
  args.SetServiceConfigJSON(R"({"methodConfig": [{
      "name": [{"service": "kvrail.v1.Admin"},
               {"service": "kvrail.v1.Transfer", "method": "GetTransfer"},
               {"service": "kvrail.v1.Transfer", "method": "WaitTransfer"}],
      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.05s", "maxBackoff": "0.5s",
                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})");
  auto channel =
      grpc::CreateCustomChannel(parsed.grpc_target, grpc::InsecureChannelCredentials(), args);
  auto impl = std::make_unique<Impl>(options, std::move(parsed), std::move(channel), probe_timeout);

  // Fail fast (no wait_for_ready): a refused connection is reported at once with gRPC's reason
  // ("Connection refused") rather than as a bare deadline.
  grpc::ClientContext context;
  SetDeadline(&context, probe_timeout);
  v1::Stats stats;
  const grpc::Status status = impl->admin_->GetStats(&context, v1::GetStatsRequest(), &stats);
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat(where, " is not answering: ", status.error_message(), kHint));
  }
  {
    absl::MutexLock lock(&impl->lost_mu_);
    impl->instance_id_ = LineageOf(stats);
  }
  // On a unix socket the session opens now (unless the caller wants none yet): every later call
  // carries its identity. A daemon without a session socket leaves the client anonymous.
  if (!impl->unix_path_.empty() && options.open_session) (void)impl->Session();
  std::unique_ptr<Client> client(new Client(std::move(impl)));
  // The block-table region is made now, not in the first large Submit (its creation and
  // registration would be ~0.3-0.9 ms of the first transfer). A failure here only means Submit
  // tries again when it needs the region.
  if (client->impl_->OpenSessionId() != 0 && options.eager_block_table) {
    absl::MutexLock lock(&client->impl_->table_mu_);
    (void)client->PrepareTableBuffer(kBlockTableBufferBytes);
  }
  // The done words too (a registration like the block tables'), off the first GPU transfer;
  // a client that wants no region made before it submits (the CLI, probes) gets them at its
  // first submit.
  if (options.gpu_done_word && options.eager_block_table) {
    if (CompletionTable* completions = client->impl_->completions_.load()) {
      (void)client->EnableDoneWords(completions);
    }
  }
  return client;
}

bool Client::session_lost() const { return !impl_->Lost().ok(); }
std::string Client::instance_id() const { return impl_->instance_id(); }

void Client::OnSessionLost(std::function<void(const absl::Status&)> callback) {
  absl::MutexLock lock(&impl_->lost_mu_);
  impl_->on_lost_ = std::move(callback);
}

absl::Status Client::ResetSession() {
  KVRAIL_ASSIGN_OR_RETURN(const v1::Stats stats, impl_->Probe());
  {
    absl::MutexLock lock(&impl_->session_mu_);
    impl_->StopMonitorLocked();
    impl_->session_.reset();
    impl_->AbandonCompletions();
  }
  {
    absl::MutexLock lock(&impl_->wait_mu_);
    impl_->idle_waits_.clear();
  }
  {
    absl::MutexLock lock(&impl_->table_mu_);
    impl_->table_buffer_.reset();
    impl_->table_region_ = 0;
  }
  absl::MutexLock lock(&impl_->lost_mu_);
  impl_->lost_ = absl::OkStatus();
  impl_->instance_id_ = LineageOf(stats);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Client::SessionId() {
  KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<wire::SessionConnection> session, impl_->Session());
  return session->session_id();
}

absl::StatusOr<std::string> Client::ShareFd(int fd) {
  KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<wire::SessionConnection> session, impl_->Session());
  return session->SendFd(fd);
}

}  // namespace kvrail::client

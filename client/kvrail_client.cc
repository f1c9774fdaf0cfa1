#include "client/kvrail_client.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/grpc_status.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "client/completion_table.h"
#include "client/submission_queue.h"
#include "grpcpp/grpcpp.h"
#include "proto/kvrail/v1/admin.grpc.pb.h"
#include "proto/kvrail/v1/spec_copy.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "wire/session_wire.h"

namespace kvrail::client {
namespace {

// Short unary calls (everything but Wait and Watch) give up after this long, so a wedged daemon
// cannot hang a caller forever.
constexpr absl::Duration kUnaryDeadline = absl::Seconds(30);
// Extra time given to WaitTransfer beyond its own timeout before the client's deadline fires.
constexpr absl::Duration kWaitSlack = absl::Seconds(10);
// Responses such as ListTransfers with many block ids can exceed gRPC's 4 MiB default.
constexpr int kMaxMessageBytes = 256 << 20;

// An infinite `timeout` sets none.
void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return;
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

absl::Status ErrnoError(absl::string_view what) {
  const int err = errno;
  return absl::Status(absl::ErrnoToStatusCode(err), absl::StrCat(what, ": ", strerror(err)));
}

// How a Connect target maps to gRPC: unix socket paths (anything with a '/' or without a ':')
// become "unix:PATH"; "unix:PATH" is kept; everything else is host:port.
struct ParsedTarget {
  std::string grpc_target;
  std::string unix_path;  // empty for TCP
};

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

// --- HostBuffer ----------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<HostBuffer>> HostBuffer::Create(size_t bytes,
                                                               const std::string& name) {
  if (bytes == 0) return absl::InvalidArgumentError("host buffer size must be > 0");
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoError("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoError(absl::StrCat("ftruncate(memfd, ", bytes, ")"));
  }
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (data == MAP_FAILED) return ErrnoError(absl::StrCat("mmap(memfd, ", bytes, ")"));
  return std::unique_ptr<HostBuffer>(
      new HostBuffer(fd.Release(), static_cast<uint8_t*>(data), bytes));
}

HostBuffer::~HostBuffer() {
  ::munmap(data_, size_);
  ::close(fd_);
}

// --- Client --------------------------------------------------------------------------------------

// Thread contract: every member may be used from any thread; the session, the wait connections,
// the block-table region and the loss state each have their own mutex (below), the rest is set
// once in the constructor.
class Client::Impl {
 public:
  Impl(const ClientOptions& options, ParsedTarget parsed, std::shared_ptr<grpc::Channel> channel,
       absl::Duration probe_timeout)
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

  const std::string target_;
  const std::string grpc_target_;
  const std::string unix_path_;
  const std::string where_;  // "kvraild on unix socket PATH" (Where)
  const ClientOptions options_;
  const absl::Duration probe_timeout_;  // Connect's, for ResetSession's probe too
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Transfer::Stub> transfer_;
  std::unique_ptr<v1::Admin::Stub> admin_;

  // Shared: a caller holds its own reference while it uses the connection, so ResetSession
  // dropping the session never frees it under a call.
  absl::Mutex session_mu_;
  std::shared_ptr<wire::SessionConnection> session_ ABSL_GUARDED_BY(session_mu_);

  // Large block tables go to the daemon through this host region instead of the gRPC message
  // (TransferEndpoint.block_table). Held for the whole Submit that fills it: the daemon has
  // copied the ids when SubmitTransfer returns.
  absl::Mutex table_mu_;
  std::unique_ptr<HostBuffer> table_buffer_ ABSL_GUARDED_BY(table_mu_);
  uint64_t table_region_ ABSL_GUARDED_BY(table_mu_) = 0;

  // Submits go over the session socket (one round trip) unless this is off: a TCP target, an
  // older daemon that does not know SUBMIT, or ClientOptions::submit_via_session false.
  std::atomic<bool> session_submit_;

  // The session's completion queue (client/completion_table.h), mapped when the session opens;
  // null without one. Tables of lost sessions stay alive (abandoned) with the client, so a
  // pointer loaded here never dangles.
  std::atomic<CompletionTable*> completions_{nullptr};
  std::vector<std::unique_ptr<CompletionTable>> tables_ ABSL_GUARDED_BY(session_mu_);

  void OpenCompletionQueueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(session_mu_) {
    if (!options_.completion_queue) return;
    absl::StatusOr<std::unique_ptr<CompletionTable>> table =
        CompletionTable::Create(options_.completion_queue_entries, options_.completion_spin);
    // Without a queue (an older daemon, no memfd) everything goes the old way.
    if (!table.ok() ||
        !session_->SendCompletionQueue((*table)->memfd(), (*table)->eventfd()).ok()) {
      return;
    }
    completions_.store(table->get());
    tables_.push_back(*std::move(table));
  }
  // The done words (ClientOptions::gpu_done_word): the first kDoneWordsBytes of the block-table
  // region, published here by PrepareTableBuffer (0: no region now), and the completion table
  // they were last handed to. Block-table buffers replaced while words of theirs may still be
  // watched are kept with the client (`retired_tables_`), so a watched word never dangles.
  absl::Mutex done_mu_;
  uint64_t* done_words_ ABSL_GUARDED_BY(done_mu_) = nullptr;
  uint64_t done_region_ ABSL_GUARDED_BY(done_mu_) = 0;
  CompletionTable* done_for_ ABSL_GUARDED_BY(done_mu_) = nullptr;
  std::vector<std::unique_ptr<HostBuffer>> retired_tables_ ABSL_GUARDED_BY(done_mu_);

  // The table buffer goes (replaced or yielded): its words stop being handed out.
  void RetireTableBufferLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_mu_) {
    absl::MutexLock lock(&done_mu_);
    if (table_buffer_ != nullptr) retired_tables_.push_back(std::move(table_buffer_));
    done_words_ = nullptr;
    done_region_ = 0;
    if (done_for_ != nullptr) done_for_->EnableDoneWords(nullptr, 0, 0);
    done_for_ = nullptr;
  }

  void AbandonCompletions() {
    if (CompletionTable* table = completions_.exchange(nullptr)) table->Abandon();
    submissions_.store(nullptr);
  }

  // The session's submission queue (client/submission_queue.h), mapped when the session opens;
  // null without one. As with the completion tables, queues of lost sessions stay alive with the
  // client.
  std::atomic<SubmissionQueue*> submissions_{nullptr};
  std::vector<std::unique_ptr<SubmissionQueue>> queues_ ABSL_GUARDED_BY(session_mu_);

  void OpenSubmissionQueueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(session_mu_) {
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

  // Connections that carry WAITs (a WAIT holds its connection until the transfer ends, so each
  // concurrent Wait has its own); idle ones are kept for the next.
  absl::Mutex wait_mu_;
  std::vector<std::unique_ptr<wire::SessionConnection>> idle_waits_ ABSL_GUARDED_BY(wait_mu_);

  std::unique_ptr<wire::SessionConnection> TakeWaitConnection() {
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

  void ReturnWaitConnection(std::unique_ptr<wire::SessionConnection> conn) {
    absl::MutexLock lock(&wait_mu_);
    if (idle_waits_.size() < 8) idle_waits_.push_back(std::move(conn));
  }

  ~Impl() {
    absl::MutexLock lock(&session_mu_);
    StopMonitorLocked();
  }

  // The session connection, opened on first use; the caller's reference keeps it alive for as
  // long as the caller uses it.
  absl::StatusOr<std::shared_ptr<wire::SessionConnection>> Session() {
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

  // Ties a call to this client's session (kvrail-session metadata) when one is open: the
  // daemon then knows the caller (docs/security.md). Calls without it are anonymous.
  void Bind(grpc::ClientContext* context) {
    if (!Lost().ok()) return;  // a lost session's secret means nothing to the new daemon
    absl::MutexLock lock(&session_mu_);
    if (session_ != nullptr && !session_->secret().empty()) {
      context->AddMetadata(wire::kSessionMetadataKey,
                           wire::SessionMetadataValue(session_->session_id(), session_->secret()));
    }
  }

  // The session's credential (SessionMetadataValue) for WAITs on spare connections; "" without
  // one.
  std::string Credential() {
    if (!Lost().ok()) return "";
    absl::MutexLock lock(&session_mu_);
    if (session_ == nullptr || session_->secret().empty()) return "";
    return wire::SessionMetadataValue(session_->session_id(), session_->secret());
  }

  // The session (if open) without opening one.
  uint64_t OpenSessionId() {
    absl::MutexLock lock(&session_mu_);
    return session_ != nullptr && !session_->PeerClosed() ? session_->session_id() : 0;
  }

  // --- Session lost (kvrail_client.h says when) ---
  absl::Status Lost() const {
    absl::MutexLock lock(&lost_mu_);
    return lost_;
  }
  std::string instance_id() const {
    absl::MutexLock lock(&lost_mu_);
    return instance_id_;
  }
  // Records the loss (the first one counts) and runs the callback outside every lock.
  void MarkLost(const std::string& why) {
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
  // A failed call's status, or the session-lost status when the failure is the daemon having
  // restarted (a stale id is NOT_FOUND, a daemon between lives UNAVAILABLE).
  absl::Status Checked(absl::Status status) {
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
    if (!admin_->GetStats(&context, v1::GetStatsRequest(), &stats).ok() ||
        LineageOf(stats).empty() || LineageOf(stats) == known) {
      return status;
    }
    MarkLost(absl::StrCat("kvraild restarted (instance ", known, " when connected, now ",
                          LineageOf(stats), ")"));
    return Lost();
  }
  template <typename T>
  absl::StatusOr<T> Checked(absl::StatusOr<T> value) {
    if (value.ok()) return value;
    return Checked(value.status());
  }

  // Every unary RPC of the client goes through here: tied to the session (Bind), bounded by
  // `deadline` (infinite: none), and its failure passed through Checked, so every call reports a
  // lost session the same way (kvrail_client.h, "Session lost").
  template <typename Stub, typename Request, typename Response>
  absl::StatusOr<Response> Unary(Stub& stub,
                                 grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                              Response*),
                                 const Request& request, absl::Duration deadline = kUnaryDeadline) {
    grpc::ClientContext context;
    Bind(&context);
    SetDeadline(&context, deadline);
    Response response;
    KVRAIL_RETURN_IF_ERROR(Checked(FromGrpcStatus((stub.*method)(&context, request, &response))));
    return response;
  }

  // The daemon's Stats for ResetSession. Calls made while the daemon was away leave the channel
  // in reconnect back-off, where a call fails at once with UNAVAILABLE although the daemon may
  // be back: so the back-off is reset and the probe waits for a connection (up to
  // probe_timeout_). A unix socket that is not there fails at once.
  absl::StatusOr<v1::Stats> Probe() {
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

  // Watches session_ for the daemon closing it. Requires session_mu_ and session_ set.
  void StartMonitorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(session_mu_) {
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
  void StopMonitorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(session_mu_) {
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

  mutable absl::Mutex lost_mu_;
  std::string instance_id_ ABSL_GUARDED_BY(lost_mu_);
  absl::Status lost_ ABSL_GUARDED_BY(lost_mu_);  // OK while the session stands
  std::function<void(const absl::Status&)> on_lost_ ABSL_GUARDED_BY(lost_mu_);
  std::thread monitor_ ABSL_GUARDED_BY(session_mu_);
  UniqueFd monitor_wake_read_ ABSL_GUARDED_BY(session_mu_);
  UniqueFd monitor_wake_write_ ABSL_GUARDED_BY(session_mu_);
};

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

absl::StatusOr<std::unique_ptr<HostBuffer>> Client::CreateHostBuffer(size_t bytes) {
  return HostBuffer::Create(bytes, "kvrail-host-buffer");
}

absl::StatusOr<uint64_t> Client::SessionId() {
  KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<wire::SessionConnection> session, impl_->Session());
  return session->session_id();
}

absl::StatusOr<std::string> Client::ShareFd(int fd) {
  KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<wire::SessionConnection> session, impl_->Session());
  return session->SendFd(fd);
}

absl::StatusOr<v1::RegionInfo> Client::RegisterHostBuffer(const HostBuffer& buffer,
                                                          v1::RegionSpec spec) {
  const uint64_t offset = spec.share().offset();
  if (offset >= buffer.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.share.offset ", offset, " is beyond the host buffer (", buffer.size(), " bytes)"));
  }
  if (spec.memory_kind() == v1::MEMORY_KIND_UNSPECIFIED) {
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  }
  if (spec.memory_kind() != v1::MEMORY_KIND_HOST) {
    return absl::InvalidArgumentError("spec.memory_kind: a host buffer is MEMORY_KIND_HOST");
  }
  if (spec.size_bytes() == 0) spec.set_size_bytes(buffer.size() - offset);
  if (spec.layout_case() == v1::RegionSpec::LAYOUT_NOT_SET) spec.mutable_bytes();

  for (int attempt = 0;; ++attempt) {
    KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<wire::SessionConnection> session,
                            impl_->Session());
    KVRAIL_ASSIGN_OR_RETURN(std::string token, session->SendFd(buffer.fd()));
    v1::RegionSpec shared = spec;
    shared.mutable_share()->set_fd_token(token);  // single-use: a retry passes the fd again
    absl::StatusOr<v1::RegionInfo> info = RegisterRegion(std::move(shared), session->session_id());
    if (info.ok() || attempt > 0 || !YieldTableRegion(info.status())) return info;
  }
}

bool Client::YieldTableRegion(const absl::Status& failed) {
  if (failed.code() != absl::StatusCode::kResourceExhausted ||
      !absl::StrContains(failed.message(), "max_regions_per_")) {
    return false;
  }
  // Held: a Submit is using the region, or the failed registration was the region's own.
  if (!impl_->table_mu_.TryLock()) return false;
  const uint64_t region = impl_->table_region_;
  impl_->table_region_ = 0;
  impl_->RetireTableBufferLocked();
  impl_->table_mu_.Unlock();
  return region != 0 && UnregisterRegion(region).ok();
}

absl::StatusOr<v1::RegionInfo> Client::RegisterHostLayers(const std::vector<HostLayer>& layers,
                                                          v1::RegionSpec spec) {
  if (layers.empty()) return absl::InvalidArgumentError("layers: empty");
  if (spec.memory_kind() == v1::MEMORY_KIND_UNSPECIFIED) {
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  }
  if (spec.size_bytes() == 0 && spec.has_paged_kv()) {
    v1::PagedKvLayout one_layer = spec.paged_kv();
    one_layer.set_num_layers(1);
    KVRAIL_ASSIGN_OR_RETURN(const uint64_t bytes, PagedLayoutBytes(one_layer));
    spec.set_size_bytes(bytes);
  }
  spec.clear_share();
  spec.clear_layer_shares();
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].buffer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("layers[", i, "].buffer: NULL"));
    }
  }
  for (int attempt = 0;; ++attempt) {
    KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<wire::SessionConnection> session,
                            impl_->Session());
    v1::RegionSpec shared = spec;
    for (size_t i = 0; i < layers.size(); ++i) {
      KVRAIL_ASSIGN_OR_RETURN(std::string token, session->SendFd(layers[i].buffer->fd()));
      v1::RegionShare* share = shared.add_layer_shares();
      share->set_fd_token(token);
      share->set_offset(layers[i].offset);
    }
    absl::StatusOr<v1::RegionInfo> info = RegisterRegion(std::move(shared), session->session_id());
    if (info.ok() || attempt > 0 || !YieldTableRegion(info.status())) return info;
  }
}

absl::StatusOr<v1::RegionInfo> Client::RegisterHostFd(int fd, uint64_t offset, uint64_t bytes,
                                                      v1::RegionSpec spec) {
  if (fd < 0) return absl::InvalidArgumentError(absl::StrCat("fd: ", fd, " is not a descriptor"));
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(absl::StrCat("fd: fstat(", fd, ")"));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd: ", fd, " is not a regular file (a memfd or a /dev/shm object is shared by fd)"));
  }
  if (bytes == 0) return absl::InvalidArgumentError("bytes: must be > 0");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (offset >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offset: ", offset, " is at or beyond the end of fd ", fd, " (", size, " bytes)"));
  }
  if (bytes > size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes: [", offset, ", ", offset + bytes, ") does not fit fd ", fd, " (", size, " bytes)"));
  }
  if (spec.memory_kind() == v1::MEMORY_KIND_UNSPECIFIED) {
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  }
  if (spec.memory_kind() != v1::MEMORY_KIND_HOST) {
    return absl::InvalidArgumentError("spec.memory_kind: memory shared by fd is MEMORY_KIND_HOST");
  }
  spec.set_size_bytes(bytes);
  if (spec.layout_case() == v1::RegionSpec::LAYOUT_NOT_SET) spec.mutable_bytes();
  spec.clear_layer_shares();
  for (int attempt = 0;; ++attempt) {
    KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<wire::SessionConnection> session,
                            impl_->Session());
    KVRAIL_ASSIGN_OR_RETURN(std::string token, session->SendFd(fd));
    v1::RegionSpec shared = spec;
    shared.mutable_share()->set_fd_token(token);  // single-use: a retry passes the fd again
    shared.mutable_share()->set_offset(offset);
    absl::StatusOr<v1::RegionInfo> info = RegisterRegion(std::move(shared), session->session_id());
    if (info.ok() || attempt > 0 || !YieldTableRegion(info.status())) return info;
  }
}

absl::StatusOr<v1::RegionInfo> Client::RegisterRegion(v1::RegionSpec spec, uint64_t session_id) {
  if (spec.share().via_case() == v1::RegionShare::kShmName) {
    if (spec.memory_kind() == v1::MEMORY_KIND_UNSPECIFIED) {
      spec.set_memory_kind(v1::MEMORY_KIND_HOST);
    }
    // The object is opened here, with this process's rights, and its fd passed over the session
    // socket: kvraild opens nothing by name for the library (docs/security.md, "Memory").
    const std::string name = spec.share().shm_name();
    UniqueFd fd(::shm_open(name.c_str(), (spec.writable() ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0));
    if (!fd.valid()) return ErrnoError(absl::StrCat("spec.share.shm_name: shm_open(", name, ")"));
    if (spec.size_bytes() == 0) {
      struct stat st;
      if (::fstat(fd.get(), &st) != 0) return ErrnoError("fstat(shm)");
      const uint64_t size = static_cast<uint64_t>(st.st_size);
      if (spec.share().offset() >= size) {
        return absl::InvalidArgumentError(absl::StrCat("spec.share.offset ", spec.share().offset(),
                                                       " is beyond shm object (", size, " bytes)"));
      }
      spec.set_size_bytes(size - spec.share().offset());
    }
    // Without a session (a TCP target) the name goes as it is: kvraild then refuses it unless
    // the caller's uid owns the object, which it cannot know over TCP.
    absl::StatusOr<std::shared_ptr<wire::SessionConnection>> session = impl_->Session();
    if (session.ok()) {
      KVRAIL_ASSIGN_OR_RETURN(std::string token, (*session)->SendFd(fd.get()));
      spec.mutable_share()->set_fd_token(token);  // keeps share.offset
      session_id = (*session)->session_id();
    }
  }
  v1::RegisterRegionRequest request;
  *request.mutable_spec() = std::move(spec);
  request.set_session_id(session_id);
  KVRAIL_ASSIGN_OR_RETURN(
      v1::RegisterRegionResponse response,
      impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::RegisterRegion, request));
  return std::move(*response.mutable_region());
}

absl::Status Client::UnregisterRegion(uint64_t region_id) {
  v1::UnregisterRegionRequest request;
  request.set_region_id(region_id);
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::UnregisterRegion, request).status();
}

namespace {

// Large block tables travel as little-endian uint32s (TransferEndpoint.block_ids_le32): encoding
// and decoding them is a memcpy, not a varint per id (~1.9 ms saved for 100k + 100k ids).
constexpr int kCompactBlockTableFrom = 1024;

void CompactBlockTable(v1::TransferEndpoint* ep) {
  if (ep->block_ids_size() < kCompactBlockTableFrom || !ep->block_ids_le32().empty()) return;
  std::string* bytes = ep->mutable_block_ids_le32();
  bytes->resize(4 * static_cast<size_t>(ep->block_ids_size()));
  std::memcpy(bytes->data(), ep->block_ids().data(), bytes->size());  // little-endian hosts
  ep->clear_block_ids();
}

// Tables of this many ids or more (either side) go through shared memory on unix sockets.
constexpr size_t kSharedBlockTableFrom = 8192;

size_t TableIds(const v1::TransferEndpoint& ep) {
  return ep.block_ids_size() > 0 ? static_cast<size_t>(ep.block_ids_size())
                                 : ep.block_ids_le32().size() / 4;
}

// Writes `from`'s ids (either encoding) at base + offset as little-endian uint32s and points
// `to` (the same endpoint without its table) at them.
void PutTable(const v1::TransferEndpoint& from, v1::TransferEndpoint* to, uint8_t* base,
              uint64_t offset, uint64_t region) {
  const size_t n = TableIds(from);
  if (n == 0) return;  // no table on this side (a bytes region, or none given)
  if (from.block_ids_size() > 0) {
    std::memcpy(base + offset, from.block_ids().data(), 4 * n);  // little-endian hosts
  } else {
    std::memcpy(base + offset, from.block_ids_le32().data(), 4 * n);
  }
  v1::BlockTableRef* ref = to->mutable_block_table();
  ref->set_region_id(region);
  ref->set_offset_bytes(offset);
  ref->set_count(static_cast<uint32_t>(n));
  // Errors found after the answer (the daemon's deferred id checks) name the caller's field too.
  ref->set_named_as(from.block_ids_size() > 0 ? "block_ids" : "block_ids_le32");
}

}  // namespace

bool Client::EnableDoneWords(CompletionTable* completions) {
  {
    absl::MutexLock lock(&impl_->done_mu_);
    if (impl_->done_region_ != 0 && impl_->done_for_ == completions) return true;
  }
  // No block-table region yet (KVRAIL_BLOCK_TABLE_BUFFER=lazy, or it was yielded): made now,
  // unless a Submit holds it (then this transfer goes without a word).
  if (impl_->table_mu_.TryLock()) {
    if (impl_->table_buffer_ == nullptr) (void)PrepareTableBuffer(0);
    impl_->table_mu_.Unlock();
  }
  absl::MutexLock lock(&impl_->done_mu_);
  if (impl_->done_region_ == 0) return false;
  if (impl_->done_for_ != completions) {
    completions->EnableDoneWords(impl_->done_words_, kDoneWords, impl_->done_region_);
    impl_->done_for_ = completions;
  }
  return true;
}

Client::QueuedResults Client::SubmitQueued(absl::Span<v1::SubmitTransferRequest* const> requests,
                                           bool with_done_word) {
  QueuedResults out(requests.size());
  if (impl_->submissions_.load() == nullptr || !impl_->session_submit_.load() ||
      impl_->unix_path_.empty()) {
    return out;
  }
  absl::StatusOr<std::shared_ptr<wire::SessionConnection>> session = impl_->Session();
  SubmissionQueue* queue = impl_->submissions_.load();  // the session's (null once it is lost)
  if (!session.ok() || queue == nullptr) return out;
  absl::InlinedVector<const v1::SubmitTransferRequest*, 4> within;
  absl::InlinedVector<size_t, 4> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i]->spec().dst().node_id().empty()) {
      within.push_back(requests[i]);
      index.push_back(i);
    }
  }
  if (within.empty()) return out;
  // The daemon posts these transfers' ends into the completion queue (when there is one), and
  // each carries a done word as a SUBMIT packet's does (SubmitRequest).
  CompletionTable* completions = impl_->completions_.load();
  const uint64_t mark = completions != nullptr ? completions->OverflowMark() : 0;
  absl::InlinedVector<std::optional<CompletionTable::DoneSlot>, 4> slots(within.size());
  if (with_done_word && completions != nullptr && impl_->options_.gpu_done_word &&
      EnableDoneWords(completions)) {
    for (size_t k = 0; k < within.size(); ++k) {
      v1::SubmitTransferRequest* request = requests[index[k]];
      if (request->spec().has_done_word()) continue;
      slots[k] = completions->TakeDoneSlot();
      if (!slots[k].has_value()) break;
      v1::DoneWord* word = request->mutable_spec()->mutable_done_word();
      word->set_region_id(slots[k]->region_id);
      word->set_byte_offset(uint64_t{8} * slots[k]->index);
      word->set_value(slots[k]->value);
    }
  }
  SubmissionQueue::Results results =
      queue->Submit(within, [conn = *session] { return conn->PeerClosed(); });
  for (size_t k = 0; k < results.size(); ++k) {
    v1::SubmitTransferRequest* request = requests[index[k]];
    if (!results[k].queued || !results[k].response.ok()) {
      if (slots[k].has_value()) {
        // Not taken, or refused: nothing stores the word.
        completions->ReturnDoneSlot(*slots[k]);
        request->mutable_spec()->clear_done_word();
      }
      if (!results[k].queued) continue;
      if (slots[k].has_value() &&
          absl::StrContains(results[k].response.status().message(), "spec.done_word")) {
        // The words' region went meanwhile (yielded to a registration): once more, without.
        out[index[k]] = SubmitRequest(*request, /*with_done_word=*/false);
        continue;
      }
    } else if (completions != nullptr) {
      // A deduplicated submit's transfer carries the first submit's word, not this one.
      const bool watch = slots[k].has_value() && !results[k].response->deduplicated();
      if (slots[k].has_value() && !watch) completions->ReturnDoneSlot(*slots[k]);
      completions->Follow(results[k].response->transfer_id(), mark,
                          watch ? slots[k] : std::optional<CompletionTable::DoneSlot>(),
                          results[k].response->bytes_total());
    }
    out[index[k]] = impl_->Checked(std::move(results[k].response));
  }
  return out;
}

std::pair<uint64_t, uint64_t> Client::SubmissionQueueCounts() {
  uint64_t queued = 0, handed_back = 0;
  absl::MutexLock lock(&impl_->session_mu_);
  for (const auto& queue : impl_->queues_) {
    queued += queue->queued();
    handed_back += queue->handed_back();
  }
  return {queued, handed_back};
}

absl::StatusOr<v1::SubmitTransferResponse> Client::SubmitRequest(v1::SubmitTransferRequest request,
                                                                 bool with_done_word, bool queue) {
  // Through the submission queue when the session has one and the request fits.
  if (queue) {
    if (std::optional<absl::StatusOr<v1::SubmitTransferResponse>> queued =
            std::move(SubmitQueued({&request}, with_done_word)[0]);
        queued.has_value()) {
      return *std::move(queued);
    }
  }
  // Transfers within this node, over the session socket when the daemon has one.
  if (impl_->session_submit_.load() && !impl_->unix_path_.empty() &&
      request.spec().dst().node_id().empty() &&
      request.ByteSizeLong() <= wire::kMaxSessionSubmitBytes) {
    absl::StatusOr<std::shared_ptr<wire::SessionConnection>> session = impl_->Session();
    if (session.ok()) {
      bool sent = false;
      // The daemon posts this transfer's end into the completion queue (when there is one).
      CompletionTable* completions = impl_->completions_.load();
      const uint64_t mark = completions != nullptr ? completions->OverflowMark() : 0;
      // Its done word: the GPU's stream stores it once the bytes landed (TransferSpec.done_word).
      std::optional<CompletionTable::DoneSlot> slot;
      if (with_done_word && completions != nullptr && impl_->options_.gpu_done_word &&
          !request.spec().has_done_word() && EnableDoneWords(completions)) {
        slot = completions->TakeDoneSlot();
        if (slot.has_value()) {
          v1::DoneWord* word = request.mutable_spec()->mutable_done_word();
          word->set_region_id(slot->region_id);
          word->set_byte_offset(uint64_t{8} * slot->index);
          word->set_value(slot->value);
        }
      }
      absl::StatusOr<std::string> answer = (*session)->Exchange(wire::EncodeSubmit(request), &sent);
      if (answer.ok()) {
        absl::StatusOr<v1::SubmitTransferResponse> response = wire::ParseSubmitAnswer(*answer);
        if (response.ok() && completions != nullptr) {
          // A deduplicated submit's transfer carries the first submit's word, not this one.
          const bool watch = slot.has_value() && !response->deduplicated();
          if (slot.has_value() && !watch) completions->ReturnDoneSlot(*slot);
          completions->Follow(response->transfer_id(), mark,
                              watch ? slot : std::optional<CompletionTable::DoneSlot>(),
                              response->bytes_total());
        } else if (slot.has_value()) {
          completions->ReturnDoneSlot(*slot);  // refused: nothing stores the word
          if (absl::StrContains(response.status().message(), "spec.done_word")) {
            // The words' region went meanwhile (yielded to a registration): once more, without.
            request.mutable_spec()->clear_done_word();
            return SubmitRequest(std::move(request), /*with_done_word=*/false, /*queue=*/false);
          }
        }
        if (response.status().code() != absl::StatusCode::kUnimplemented) {
          return impl_->Checked(std::move(response));
        }
        impl_->session_submit_.store(false);  // an older daemon: gRPC from now on
      } else if (sent) {
        // The daemon may have accepted it: never submit twice. Its slot is not given back: the
        // transfer may still store its word there.
        return answer.status();
      }
      if (slot.has_value()) {
        // Not accepted over the session: the gRPC submit below carries no word.
        completions->ReturnDoneSlot(*slot);
        request.mutable_spec()->clear_done_word();
      }
    }
  }
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::SubmitTransfer, request);
}

absl::Status Client::PrepareTableBuffer(uint64_t need) {
  impl_->table_mu_.AssertHeld();
  // The done words come first, the tables after them.
  need += kDoneWordsBytes;
  if (impl_->table_buffer_ != nullptr && impl_->table_buffer_->size() >= need) {
    return absl::OkStatus();
  }
  if (impl_->table_region_ != 0) (void)UnregisterRegion(impl_->table_region_);
  impl_->table_region_ = 0;
  impl_->RetireTableBufferLocked();
  uint64_t size = kBlockTableBufferBytes;
  while (size < need) size *= 2;
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<HostBuffer> buffer,
                          HostBuffer::Create(size, "kvrail-block-tables"));
  // Touch every page now (the daemon maps the same pages): the first Submit then writes into
  // memory that is already there.
  std::memset(buffer->data(), 0, buffer->size());
  v1::RegionSpec region;
  region.set_name(kBlockTableRegionName);
  region.set_library_region(true);  // the daemon's mark of the library's own region (not the name)
  region.set_writable(true);        // the GPU stores the done words (TransferSpec.done_word)
  KVRAIL_ASSIGN_OR_RETURN(const v1::RegionInfo info, RegisterHostBuffer(*buffer, region));
  impl_->table_buffer_ = std::move(buffer);
  impl_->table_region_ = info.region_id();
  absl::MutexLock lock(&impl_->done_mu_);
  impl_->done_words_ = reinterpret_cast<uint64_t*>(impl_->table_buffer_->data());
  impl_->done_region_ = info.region_id();
  return absl::OkStatus();
}

absl::StatusOr<v1::SubmitTransferResponse> Client::Submit(const v1::TransferSpec& given) {
  // A notification names the submitting session, so the daemon does not deliver it back here.
  v1::TransferSpec with_session;
  const bool fill = !given.notification().empty() && given.session_id() == 0;
  if (fill) {
    with_session = given;
    with_session.set_session_id(impl_->OpenSessionId());
  }
  const v1::TransferSpec& spec = fill ? with_session : given;
  const size_t src_ids = TableIds(spec.src()), dst_ids = TableIds(spec.dst());
  const bool in_message =
      !spec.src().has_block_table() && !spec.dst().has_block_table() &&
      (spec.src().block_ids_size() == 0 || spec.src().block_ids_le32().empty()) &&
      (spec.dst().block_ids_size() == 0 || spec.dst().block_ids_le32().empty());
  if (!impl_->unix_path_.empty() && in_message &&
      std::max(src_ids, dst_ids) >= kSharedBlockTableFrom) {
    absl::MutexLock lock(&impl_->table_mu_);
    const uint64_t need = 4 * static_cast<uint64_t>(src_ids + dst_ids);
    const absl::Status ready = PrepareTableBuffer(need);
    if (ready.ok()) {
      // The request carries the spec without its tables (no megabyte copies) plus references.
      v1::SubmitTransferRequest shared;
      *shared.mutable_spec() = v1::WithoutBlockTables(spec);
      uint8_t* base = impl_->table_buffer_->data();
      PutTable(spec.src(), shared.mutable_spec()->mutable_src(), base, kDoneWordsBytes,
               impl_->table_region_);
      PutTable(spec.dst(), shared.mutable_spec()->mutable_dst(), base,
               kDoneWordsBytes + 4 * src_ids, impl_->table_region_);
      absl::StatusOr<v1::SubmitTransferResponse> response = SubmitRequest(std::move(shared));
      // Only a table region that went away (unregistered by someone else) falls back to the
      // message below; every other answer is the transfer's, and the daemon's errors already
      // name the field the caller set (BlockTableRef.named_as).
      if (response.ok() ||
          !absl::StrContains(response.status().message(), ".block_table.region_id")) {
        return response;
      }
      impl_->table_region_ = 0;
      impl_->RetireTableBufferLocked();
    }
  }
  v1::SubmitTransferRequest request;
  *request.mutable_spec() = spec;
  CompactBlockTable(request.mutable_spec()->mutable_src());
  CompactBlockTable(request.mutable_spec()->mutable_dst());
  return SubmitRequest(std::move(request));
}

std::optional<v1::SubmitTransferRequest> Client::PlainRequest(const v1::TransferSpec& spec) {
  const size_t src_ids = TableIds(spec.src()), dst_ids = TableIds(spec.dst());
  if (!impl_->unix_path_.empty() && std::max(src_ids, dst_ids) >= kSharedBlockTableFrom) {
    return std::nullopt;  // Submit decides between the block-table region and the message
  }
  v1::SubmitTransferRequest request;
  *request.mutable_spec() = spec;
  if (!spec.notification().empty() && spec.session_id() == 0) {
    request.mutable_spec()->set_session_id(impl_->OpenSessionId());
  }
  CompactBlockTable(request.mutable_spec()->mutable_src());
  CompactBlockTable(request.mutable_spec()->mutable_dst());
  return request;
}

std::vector<absl::StatusOr<v1::SubmitTransferResponse>> Client::SubmitBatch(
    const std::vector<v1::TransferSpec>& specs) {
  std::vector<std::optional<v1::SubmitTransferRequest>> plain;
  std::vector<v1::SubmitTransferRequest*> batch;
  std::vector<size_t> index;
  plain.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    plain.push_back(PlainRequest(specs[i]));
    if (plain.back().has_value()) {
      batch.push_back(&*plain.back());
      index.push_back(i);
    }
  }
  QueuedResults queued = SubmitQueued(batch);
  std::vector<absl::StatusOr<v1::SubmitTransferResponse>> out(specs.size(),
                                                              absl::UnknownError("not submitted"));
  std::vector<bool> done(specs.size(), false);
  for (size_t k = 0; k < queued.size(); ++k) {
    if (queued[k].has_value()) {
      out[index[k]] = *std::move(queued[k]);
      done[index[k]] = true;
    }
  }
  // The rest one by one, in order: large block tables, transfers to other nodes, no queue, or
  // what the queue had no room for (by packet at once: the queue is full).
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!done[i]) {
      out[i] = plain[i].has_value()
                   ? SubmitRequest(*std::move(plain[i]), /*with_done_word=*/true, /*queue=*/false)
                   : Submit(specs[i]);
    }
  }
  return out;
}

absl::StatusOr<v1::TransferStatus> Client::Get(uint64_t transfer_id) {
  v1::GetTransferRequest request;
  request.set_transfer_id(transfer_id);
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::GetTransfer, request);
}

namespace {

wire::Completion CompletionOf(const v1::TransferStatus& status) {
  wire::Completion c;
  c.flags = wire::kCompletionHasMore;  // the full status is the daemon's
  c.transfer_id = status.transfer_id();
  c.state = static_cast<int32_t>(status.state());
  c.error_code = status.error_code();
  c.bytes_total = status.bytes_total();
  c.bytes_done = status.bytes_done();
  c.finished_unix_us = status.finished_unix_us();
  return c;
}

}  // namespace

absl::StatusOr<v1::TransferStatus> Client::Wait(uint64_t transfer_id, absl::Duration timeout) {
  // A transfer submitted on the session with a completion queue: its end is read locally.
  CompletionTable* completions = impl_->completions_.load();
  if (completions == nullptr || !completions->Follows(transfer_id)) {
    return WaitByCall(transfer_id, timeout);
  }
  const bool bounded = timeout > absl::ZeroDuration() && timeout != absl::InfiniteDuration();
  const CompletionTable::Result seen =
      completions->Wait(transfer_id, bounded ? absl::Now() + timeout : absl::InfiniteFuture());
  switch (seen.outcome) {
    case CompletionTable::Outcome::kDone:
      // Wait's contract is the transfer's whole status (path, engine, link, phases, layers), as
      // WaitTransfer answers it; the queue's entry holds only the state and counts. The transfer
      // has ended, so the call below is answered at once. Callers that need only the end read
      // it locally, without a call: LocalStates (done, poll, batch status) and the eventfd.
      return WaitByCall(transfer_id, timeout);
    case CompletionTable::Outcome::kTimeout:
      return Get(transfer_id);
    case CompletionTable::Outcome::kUnsure:
      break;
  }
  // The queue overflowed (or the session went): the old way, remembered for the next reader.
  absl::StatusOr<v1::TransferStatus> status = WaitByCall(transfer_id, timeout);
  if (status.ok() && IsFinal(status->state())) completions->Resolve(CompletionOf(*status));
  return status;
}

absl::StatusOr<v1::TransferStatus> Client::WaitEnd(uint64_t transfer_id, absl::Duration timeout) {
  CompletionTable* completions = impl_->completions_.load();
  if (completions == nullptr || !completions->Follows(transfer_id)) {
    return Wait(transfer_id, timeout);
  }
  const bool bounded = timeout > absl::ZeroDuration() && timeout != absl::InfiniteDuration();
  const CompletionTable::Result seen =
      completions->Wait(transfer_id, bounded ? absl::Now() + timeout : absl::InfiniteFuture());
  if (seen.outcome == CompletionTable::Outcome::kTimeout) return Get(transfer_id);
  if (seen.outcome == CompletionTable::Outcome::kDone &&
      ((seen.completion.flags & wire::kCompletionHasMore) == 0 ||
       (seen.completion.flags & CompletionTable::kSeenInWord) != 0)) {
    v1::TransferStatus status;
    status.set_transfer_id(seen.completion.transfer_id);
    status.set_state(static_cast<v1::TransferState>(seen.completion.state));
    status.set_error_code(seen.completion.error_code);
    status.set_bytes_total(seen.completion.bytes_total);
    status.set_bytes_done(seen.completion.bytes_done);
    status.set_finished_unix_us(seen.completion.finished_unix_us);
    return status;
  }
  // Missed by the queue, or more than the entry holds: the whole status (at once when ended).
  return Wait(transfer_id, timeout);
}

void Client::LocalStates(const uint64_t* ids, size_t count, int32_t* states) {
  CompletionTable* completions = impl_->completions_.load();
  for (size_t i = 0; i < count; ++i) states[i] = v1::TRANSFER_STATE_UNSPECIFIED;
  if (completions != nullptr) completions->States(ids, count, states);
}

uint64_t Client::DoneWordHits() {
  absl::MutexLock lock(&impl_->session_mu_);
  uint64_t hits = 0;
  for (const auto& table : impl_->tables_) hits += table->word_hits();
  return hits;
}

int Client::CompletionFd() {
  CompletionTable* completions = impl_->completions_.load();
  return completions != nullptr ? completions->eventfd() : -1;
}

size_t Client::TakeCompletions(uint64_t* ids, size_t max) {
  CompletionTable* completions = impl_->completions_.load();
  return completions != nullptr ? completions->TakeFresh(ids, max) : 0;
}

bool Client::FollowsCompletion(uint64_t transfer_id) {
  CompletionTable* completions = impl_->completions_.load();
  return completions != nullptr && completions->Follows(transfer_id);
}

void Client::ArmCompletions(bool armed) {
  if (CompletionTable* completions = impl_->completions_.load()) {
    completions->SetArmed(armed);
    completions->Drain();
  }
}

absl::StatusOr<v1::TransferStatus> Client::WaitByCall(uint64_t transfer_id,
                                                      absl::Duration timeout) {
  // A WAIT on a session connection: the final status, the daemon's error, the current status when
  // a bounded wait times out; anything else (no session, an older daemon, a broken connection)
  // asks over gRPC below, where waiting again is harmless.
  if (impl_->session_submit_.load() && !impl_->unix_path_.empty()) {
    const bool bounded = timeout > absl::ZeroDuration() && timeout != absl::InfiniteDuration();
    if (auto conn = impl_->TakeWaitConnection(); conn != nullptr) {
      conn->SetAnswerTimeout(bounded ? timeout : absl::InfiniteDuration());
      bool sent = false;
      // As the main session: only a transfer's submitter may wait for it.
      absl::StatusOr<std::string> answer =
          conn->Exchange(wire::EncodeWait(transfer_id, impl_->Credential()), &sent);
      if (!answer.ok()) {
        // A DONE may still come on this connection: it is not reused.
        if (bounded && answer.status().code() == absl::StatusCode::kDeadlineExceeded) {
          return Get(transfer_id);
        }
      } else {
        // DONE, or the daemon's REJECTED: the connection is free again. An unparsable DONE asks
        // over gRPC below; any other answer (or REJECTED UNIMPLEMENTED) is an older daemon.
        absl::StatusOr<v1::TransferStatus> done = wire::ParseDoneAnswer(*answer);
        const bool rejected = wire::ParseRejected(*answer).has_value();
        if (done.ok() || (rejected && done.status().code() != absl::StatusCode::kUnimplemented)) {
          impl_->ReturnWaitConnection(std::move(conn));
          return impl_->Checked(std::move(done));
        }
        if (done.status().code() == absl::StatusCode::kUnimplemented) {
          impl_->session_submit_.store(false);  // an older daemon: gRPC from now on
        }
      }
    }
  }
  v1::WaitTransferRequest request;
  request.set_transfer_id(transfer_id);
  absl::Duration deadline = absl::InfiniteDuration();
  if (timeout > absl::ZeroDuration() && timeout != absl::InfiniteDuration()) {
    // Round up so that a sub-millisecond timeout does not become "forever" (0).
    request.set_timeout_ms(static_cast<uint64_t>(
        absl::ToInt64Milliseconds(timeout + absl::Milliseconds(1) - absl::Nanoseconds(1))));
    deadline = timeout + kWaitSlack;
  }
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::WaitTransfer, request, deadline);
}

absl::StatusOr<v1::TransferStatus> Client::Cancel(uint64_t transfer_id) {
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

absl::StatusOr<v1::SubmitTransferResponse> Client::PostPrepared(
    const v1::PostTransferRequest& request) {
  // Through the submission queue when the session has one and the post fits an entry (no socket
  // round trip), else over the session socket (one round trip, answered as a SUBMIT); either way
  // its end is posted into the completion queue.
  if (impl_->session_submit_.load() && !impl_->unix_path_.empty() &&
      request.ByteSizeLong() <= wire::kMaxSessionSubmitBytes) {
    absl::StatusOr<std::shared_ptr<wire::SessionConnection>> session = impl_->Session();
    if (session.ok()) {
      CompletionTable* completions = impl_->completions_.load();
      const uint64_t mark = completions != nullptr ? completions->OverflowMark() : 0;
      if (SubmissionQueue* queue = impl_->submissions_.load(); queue != nullptr) {
        SubmissionQueue::Result queued =
            queue->Post(request, [conn = *session] { return conn->PeerClosed(); });
        if (queued.queued) {
          if (queued.response.ok() && completions != nullptr) {
            completions->Follow(queued.response->transfer_id(), mark, std::nullopt,
                                queued.response->bytes_total());
          }
          return impl_->Checked(std::move(queued.response));
        }
      }
      bool sent = false;
      absl::StatusOr<std::string> answer = (*session)->Exchange(wire::EncodePost(request), &sent);
      if (!answer.ok()) {
        if (sent) return answer.status();  // the daemon may have taken it: never post twice
      } else {
        absl::StatusOr<v1::SubmitTransferResponse> response = wire::ParseSubmitAnswer(*answer);
        if (response.ok() && completions != nullptr) {
          completions->Follow(response->transfer_id(), mark, std::nullopt, response->bytes_total());
        }
        if (response.status().code() != absl::StatusCode::kUnimplemented) {
          return impl_->Checked(std::move(response));
        }
      }
    }
  }
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::PostTransfer, request);
}

absl::Status Client::ReleasePrepared(uint64_t prepared_id) {
  v1::ReleasePreparedRequest request;
  request.set_prepared_id(prepared_id);
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::ReleasePrepared, request).status();
}

}  // namespace kvrail::client

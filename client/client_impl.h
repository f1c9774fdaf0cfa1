// Client::Impl, the state behind kvrail_client.h, shared by the library's parts (internal to
// //client:client: users include kvrail_client.h only):
//   client_session.cc  the session connection, its loss and reset, Connect
//   client_calls.cc    the unary and streaming calls
//   client_regions.cc  host buffers, region registration, the block-table region
//   client_submit.cc   Submit, SubmitBatch, the submission queue, prepared posts
//   client_wait.cc     Wait and the completion queue

#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/grpc_status.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "client/completion_table.h"
#include "client/kvrail_client.h"
#include "client/submission_queue.h"
#include "grpcpp/grpcpp.h"
#include "proto/kvrail/v1/admin.grpc.pb.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "wire/session_wire.h"

namespace kvrail::client {

// Short unary calls (everything but Wait and Watch) give up after this long, so a wedged daemon
// cannot hang a caller forever.
inline constexpr absl::Duration kUnaryDeadline = absl::Seconds(30);

// An infinite `timeout` sets none.
void SetDeadline(grpc::ClientContext* context, absl::Duration timeout);

absl::Status ErrnoError(absl::string_view what);

// How a Connect target maps to gRPC: unix socket paths (anything with a '/' or without a ':')
// become "unix:PATH"; "unix:PATH" is kept; everything else is host:port.
struct ParsedTarget {
  std::string grpc_target;
  std::string unix_path;  // empty for TCP
};

// Thread contract: every member may be used from any thread; the session, the wait connections,
// the block-table region and the loss state each have their own mutex (below), the rest is set
// once in the constructor.
class Client::Impl {
 public:
  Impl(const ClientOptions& options, ParsedTarget parsed, std::shared_ptr<grpc::Channel> channel,
       absl::Duration probe_timeout);
  ~Impl();

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
  // Cancels go over the session socket (one round trip, no gRPC thread on either side) unless
  // the daemon does not know CANCEL (an older one): gRPC from then on.
  std::atomic<bool> session_cancel_{true};

  // The session's completion queue (client/completion_table.h), mapped when the session opens;
  // null without one. Tables of lost sessions stay alive (abandoned) with the client, so a
  // pointer loaded here never dangles.
  std::atomic<CompletionTable*> completions_{nullptr};
  std::vector<std::unique_ptr<CompletionTable>> tables_ ABSL_GUARDED_BY(session_mu_);

  void OpenCompletionQueueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(session_mu_);

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
  void RetireTableBufferLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_mu_);

  void AbandonCompletions();

  // The session's submission queue (client/submission_queue.h), mapped when the session opens;
  // null without one. As with the completion tables, queues of lost sessions stay alive with the
  // client.
  std::atomic<SubmissionQueue*> submissions_{nullptr};
  std::vector<std::unique_ptr<SubmissionQueue>> queues_ ABSL_GUARDED_BY(session_mu_);

  void OpenSubmissionQueueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(session_mu_);

  // Connections that carry WAITs (a WAIT holds its connection until the transfer ends, so each
  // concurrent Wait has its own); idle ones are kept for the next.
  absl::Mutex wait_mu_;
  std::vector<std::unique_ptr<wire::SessionConnection>> idle_waits_ ABSL_GUARDED_BY(wait_mu_);

  std::unique_ptr<wire::SessionConnection> TakeWaitConnection();
  void ReturnWaitConnection(std::unique_ptr<wire::SessionConnection> conn);

  // The session connection, opened on first use; the caller's reference keeps it alive for as
  // long as the caller uses it.
  absl::StatusOr<std::shared_ptr<wire::SessionConnection>> Session();

  // Ties a call to this client's session (kvrail-session metadata) when one is open: the
  // daemon then knows the caller (docs/security.md). Calls without it are anonymous.
  void Bind(grpc::ClientContext* context);

  // The session's credential (SessionMetadataValue) for WAITs on spare connections; "" without
  // one.
  std::string Credential();

  // The session (if open) without opening one.
  uint64_t OpenSessionId();

  // --- Session lost (kvrail_client.h says when) ---
  absl::Status Lost() const;
  std::string instance_id() const;
  // Records the loss (the first one counts) and runs the callback outside every lock.
  void MarkLost(const std::string& why);
  // A failed call's status, or the session-lost status when the failure is the daemon having
  // restarted (a stale id is NOT_FOUND, a daemon between lives UNAVAILABLE).
  absl::Status Checked(absl::Status status);
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
  absl::StatusOr<v1::Stats> Probe();

  // Watches session_ for the daemon closing it. Requires session_mu_ and session_ set.
  void StartMonitorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(session_mu_);
  void StopMonitorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(session_mu_);

  mutable absl::Mutex lost_mu_;
  std::string instance_id_ ABSL_GUARDED_BY(lost_mu_);
  absl::Status lost_ ABSL_GUARDED_BY(lost_mu_);  // OK while the session stands
  std::function<void(const absl::Status&)> on_lost_ ABSL_GUARDED_BY(lost_mu_);
  std::thread monitor_ ABSL_GUARDED_BY(session_mu_);
  UniqueFd monitor_wake_read_ ABSL_GUARDED_BY(session_mu_);
  UniqueFd monitor_wake_write_ ABSL_GUARDED_BY(session_mu_);
};

}  // namespace kvrail::client

// The session server's packets (session_server_impl.h lists its parts): one packet of a session
// read, then served on the poll thread or by its admission worker: FD, WAIT, CQ, SUBMIT, POST.
#include <sys/socket.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/logging.h"
#include "base/unique_fd.h"
#include "daemon/session/admission.h"
#include "daemon/session/session_server.h"
#include "daemon/session/session_server_impl.h"
#include "daemon/session/session_sinks.h"
#include "spdlog/spdlog.h"
#include "wire/session_wire.h"
#include "wire/shm_ring.h"

namespace kvrail::session {

void SessionServerImpl::Serve(int fd) {
  auto it = sessions_.find(fd);
  if (it == sessions_.end()) return;  // dropped earlier in this round
  const std::shared_ptr<Connection> conn = it->second;
  absl::StatusOr<wire::Received> received = wire::ReceiveMessage(fd, &packet_, MSG_DONTWAIT);
  if (!received.ok()) {
    switch (received.status().code()) {
      case absl::StatusCode::kDeadlineExceeded:  // nothing to read after all
        return;
      case absl::StatusCode::kUnavailable:  // closed, reset or broken
        KVRAIL_DEBUG("session {} closed: {}", conn->id, std::string(received.status().message()));
        Drop(it);
        return;
      default:
        conn->Send(wire::EncodeError(received.status().message()));
        return;
    }
  }
  // Every descriptor received is owned by `received` and closed unless handed on below.
  const wire::Request request = wire::ParseRequest(received->payload);
  if (request.kind == wire::RequestKind::kSubmissionQueue) {
    // Served here (it changes the epoll set, the poll thread's), after the answers queued
    // before it: a session with packets still queued is asked to send it again later.
    conn->Send(
        admission_ != nullptr && !admission_->Idle(conn->id)
            ? wire::EncodeRejected(absl::UnavailableError(
                  "SQ: the session has packets queued for admission; send SQ again"))
            : MapSubmissionQueue(fd, conn.get(), std::move(received->fds), received->truncated));
    return;
  }
  // A small SUBMIT (AdmitsInline) of a session with nothing queued is admitted here: the
  // hand-off to a worker would cost it as much as its admission. So is a small POST (its ids
  // in the packet; nothing but they are checked).
  if (admission_ != nullptr && request.kind == wire::RequestKind::kPost && options_.post &&
      received->fds.empty() && !received->truncated &&
      request.body.size() <= kMaxInlineSubmitBytes && admission_->Idle(conn->id)) {
    conn->Send(Post(request.body, conn));
    return;
  }
  if (admission_ != nullptr && request.kind == wire::RequestKind::kSubmit && options_.submit &&
      received->fds.empty() && !received->truncated &&
      request.body.size() <= kMaxInlineSubmitBytes && admission_->Idle(conn->id)) {
    absl::StatusOr<v1::SubmitTransferRequest> parsed = wire::ParseSubmitBody(request.body);
    if (parsed.ok() && AdmitsInline(parsed->spec(), options_.max_inline_submit_ids)) {
      conn->Send(SubmitParsed(*std::move(parsed), conn));
      return;
    }
  }
  // A SUBMIT is admitted by a worker; a packet behind one still queued or running follows it
  // there, so the session's answers keep the order of its packets. So is a CANCEL: ending a
  // transfer releases its plan and answers its waiters, and however long that takes (a
  // 2^20-block transfer's cancel took 30-275 us of wall time on the build machine, once over
  // 1 ms) it must not hold up the packets of other sessions. Other packets are served here (FD,
  // WAIT and CQ cost no more than a lookup). A SUBMIT or POST naming more than kBulkIds ids
  // goes to a bulk worker.
  if (admission_ != nullptr &&
      (request.kind == wire::RequestKind::kSubmit || request.kind == wire::RequestKind::kPost ||
       request.kind == wire::RequestKind::kCancel || !admission_->Idle(conn->id))) {
    auto packet = std::make_unique<Packet>();
    packet->kind = request.kind;
    packet->body = std::string(request.body);
    packet->fds = std::move(received->fds);
    packet->truncated = received->truncated;
    const TaskClass task_class =
        !admission_->has_bulk()                      ? TaskClass::kOrdinary
        : request.kind == wire::RequestKind::kSubmit ? ClassOfIds(SubmitIdsBound(request.body))
        : request.kind == wire::RequestKind::kPost   ? ClassOfIds(PostIdsBound(request.body))
                                                     : TaskClass::kOrdinary;
    absl::Status queued = admission_->Post(
        conn->id, [this, conn, packet = std::move(packet)]() mutable { Handle(conn, *packet); },
        task_class);
    // Refused at once (ahead of the answers still queued): the client library sends one
    // packet at a time per connection, so only a client that pipelines meets the cap.
    if (!queued.ok()) conn->Send(wire::EncodeRejected(queued));
    return;
  }
  Packet packet;
  packet.kind = request.kind;
  packet.fds = std::move(received->fds);
  packet.truncated = received->truncated;
  Handle(conn, packet, request.body);
}

void SessionServerImpl::Handle(const std::shared_ptr<Connection>& conn, Packet& packet,
                               std::optional<absl::string_view> given_body) {
  const absl::string_view body = given_body.has_value() ? *given_body : packet.body;
  const bool plain = packet.fds.empty() && !packet.truncated;
  switch (packet.kind) {
    case wire::RequestKind::kCompletionQueue:
      conn->Send(MapCompletionQueue(conn.get(), std::move(packet.fds), packet.truncated));
      return;
    case wire::RequestKind::kSubmissionQueue:  // served by the poll thread (Serve)
      return;
    case wire::RequestKind::kSubmit:
      conn->Send(plain ? Submit(body, conn)
                       : wire::EncodeRejected(absl::InvalidArgumentError(absl::StrCat(
                             "SUBMIT: the packet is larger than ", wire::kMaxRequestBytes,
                             " bytes or carries descriptors; use SubmitTransfer"))));
      return;
    case wire::RequestKind::kPost:
      conn->Send(plain ? Post(body, conn)
                       : wire::EncodeRejected(absl::InvalidArgumentError(absl::StrCat(
                             "POST: the packet is larger than ", wire::kMaxRequestBytes,
                             " bytes or carries descriptors; use PostTransfer"))));
      return;
    case wire::RequestKind::kWait:
      Wait(conn, plain, body);
      return;
    case wire::RequestKind::kCancel:
      conn->Send(Cancel(*conn, plain, body));
      return;
    case wire::RequestKind::kFd:
      if (packet.fds.size() == 1) break;
      [[fallthrough]];
    case wire::RequestKind::kOther:
      conn->Send(wire::EncodeError("expected the packet \"FD\" carrying exactly one descriptor"));
      return;
  }
  if (ShortOfFds(packet.fds[0].get(), options_.fd_headroom)) {
    conn->Send(wire::EncodeError(ShortOfFdsError().message()));
    return;  // the descriptor is closed with `packet`
  }
  absl::StatusOr<std::string> token = table_->AddFd(conn->id, std::move(packet.fds[0]));
  conn->Send(token.ok() ? wire::EncodeToken(*token) : wire::EncodeError(token.status().message()));
}

void SessionServerImpl::Wait(const std::shared_ptr<Connection>& conn, bool plain,
                             absl::string_view body) {
  const absl::StatusOr<uint64_t> id = wire::ParseWaitBody(body, plain);
  if (!id.ok()) {
    conn->Send(wire::EncodeRejected(id.status()));
    return;
  }
  if (!options_.wait) {
    conn->Send(wire::EncodeRejected(
        absl::UnimplementedError("WAIT: this daemon answers waits over gRPC only")));
    return;
  }
  // The waiting session: the connection's, or the one the credential names (a client waits
  // on spare connections as its main session).
  absl::StatusOr<sessions::Caller> waiter =
      table_->Authenticate(conn->id, table_->SessionSecret(conn->id));
  if (body.find(' ') != absl::string_view::npos) {
    const auto credential = wire::ParseWaitCredential(body);
    waiter = credential.has_value() ? table_->Authenticate(credential->first, credential->second)
                                    : absl::StatusOr<sessions::Caller>(absl::UnauthenticatedError(
                                          "WAIT: the credential is not \"<session id>.<secret>\""));
  }
  if (!waiter.ok()) {
    conn->Send(wire::EncodeRejected(waiter.status()));
    return;
  }
  // A client waits on one transfer per connection; each WAIT held costs memory until its
  // transfer ends, so they are capped per connection and per uid.
  if (conn->pending_waits.load() >= options_.max_waits_per_connection) {
    conn->Send(wire::EncodeRejected(absl::ResourceExhaustedError(absl::StrCat(
        "max_watchers_per_session: this connection has ", conn->pending_waits.load(),
        " WAITs pending, the most allowed (DaemonConfig.max_watchers_per_session); wait on "
        "one transfer per connection"))));
    return;
  }
  if (absl::Status placed = pending_waits_->Take(conn->uid); !placed.ok()) {
    conn->Send(wire::EncodeRejected(placed));
    return;
  }
  conn->pending_waits.fetch_add(1);
  std::weak_ptr<Connection> weak = conn;
  // Called at most once: when the transfer ends (at once when it has), or never when the
  // registration is refused.
  const absl::Status registered = options_.wait(
      *waiter, *id,
      [weak, uid = conn->uid, counts = pending_waits_](const v1::TransferStatus& status) {
        counts->Give(uid);
        if (auto c = weak.lock()) {
          c->pending_waits.fetch_sub(1);
          c->Send(wire::EncodeDone(status));
        }
      });
  if (!registered.ok()) {
    pending_waits_->Give(conn->uid);
    conn->pending_waits.fetch_sub(1);
    conn->Send(wire::EncodeRejected(registered));
  }
}

std::string SessionServerImpl::Cancel(const Connection& conn, bool plain, absl::string_view body) {
  const absl::StatusOr<uint64_t> id = wire::ParseCancelBody(body, plain);
  if (!id.ok()) return wire::EncodeRejected(id.status());
  if (!options_.cancel) {
    return wire::EncodeRejected(
        absl::UnimplementedError("CANCEL: this daemon cancels over gRPC only"));
  }
  // Only as the connection's own session: a spare connection (whose session owns nothing) can
  // cancel nothing that its main session submitted.
  const absl::StatusOr<sessions::Caller> caller =
      table_->Authenticate(conn.id, table_->SessionSecret(conn.id));
  if (!caller.ok()) return wire::EncodeRejected(caller.status());
  absl::StatusOr<v1::TransferStatus> cancelled = options_.cancel(*caller, *id);
  if (!cancelled.ok()) return wire::EncodeRejected(cancelled.status());
  return wire::EncodeCancelled(*cancelled);
}

std::string SessionServerImpl::MapCompletionQueue(Connection* conn, std::vector<UniqueFd> fds,
                                                  bool truncated) {
  if (fds.size() != 2 || truncated) {
    return wire::EncodeRejected(absl::InvalidArgumentError(
        "CQ: expected the packet \"CQ\" carrying exactly two descriptors (memfd, eventfd)"));
  }
  if (conn->Completions() != nullptr) {
    return wire::EncodeRejected(
        absl::AlreadyExistsError("CQ: this session already has a completion queue"));
  }
  if (!options_.wait) {
    return wire::EncodeRejected(
        absl::UnimplementedError("CQ: this daemon answers waits over gRPC only"));
  }
  for (const UniqueFd& fd : fds) {
    if (ShortOfFds(fd.get(), options_.fd_headroom)) return wire::EncodeRejected(ShortOfFdsError());
  }
  absl::StatusOr<std::unique_ptr<wire::SharedRing>> ring =
      wire::SharedRing::Attach(std::move(fds[0]), std::move(fds[1]), wire::kCompletionEntryBytes);
  if (!ring.ok()) {
    return wire::EncodeRejected(
        absl::InvalidArgumentError(absl::StrCat("CQ: ", ring.status().message())));
  }
  {
    absl::MutexLock lock(&conn->mu);
    conn->completions = std::make_shared<CompletionSink>(std::move(*ring));
  }
  KVRAIL_DEBUG("session {}: completion queue mapped", conn->id);
  return wire::kCompletionQueueAccepted;
}

void SessionServerImpl::PostWhenDone(const Connection& conn,
                                     const std::shared_ptr<CompletionSink>& sink, uint64_t id,
                                     uint64_t tag) {
  absl::StatusOr<sessions::Caller> caller =
      table_->Authenticate(conn.id, table_->SessionSecret(conn.id));
  std::weak_ptr<CompletionSink> weak = sink;
  const auto& follow = options_.follow ? options_.follow : options_.wait;
  const absl::Status registered = caller.ok()
                                      ? follow(*caller, id,
                                               [weak, tag](const v1::TransferStatus& status) {
                                                 if (auto sink = weak.lock())
                                                   sink->Post(status, tag);
                                               })
                                      : caller.status();
  if (!registered.ok()) {
    KVRAIL_DEBUG("session {}: transfer {} not followed by the completion queue: {}", conn.id, id,
                 registered.ToString());
    sink->Missed();
  }
}

std::string SessionServerImpl::Submit(absl::string_view body,
                                      const std::shared_ptr<Connection>& conn) {
  if (!options_.submit) {
    return wire::EncodeRejected(
        absl::UnimplementedError("SUBMIT: this daemon takes transfers over gRPC only"));
  }
  absl::StatusOr<v1::SubmitTransferRequest> parsed = wire::ParseSubmitBody(body);
  if (!parsed.ok()) return wire::EncodeRejected(parsed.status());
  return SubmitParsed(*std::move(parsed), conn);
}

std::string SessionServerImpl::SubmitParsed(v1::SubmitTransferRequest request,
                                            const std::shared_ptr<Connection>& conn) {
  absl::StatusOr<v1::SubmitTransferResponse> accepted = Admit(request, conn, 0);
  return accepted.ok() ? wire::EncodeSubmitted(*accepted) : wire::EncodeRejected(accepted.status());
}

std::string SessionServerImpl::Post(absl::string_view body,
                                    const std::shared_ptr<Connection>& conn) {
  if (!options_.post) {
    return wire::EncodeRejected(
        absl::UnimplementedError("POST: this daemon takes prepared transfers over gRPC only"));
  }
  absl::StatusOr<v1::PostTransferRequest> parsed = wire::ParsePostBody(body);
  if (!parsed.ok()) return wire::EncodeRejected(parsed.status());
  absl::StatusOr<v1::SubmitTransferResponse> accepted = AdmitPost(*parsed, conn, 0);
  return accepted.ok() ? wire::EncodeSubmitted(*accepted) : wire::EncodeRejected(accepted.status());
}

absl::StatusOr<v1::SubmitTransferResponse> SessionServerImpl::AdmitPost(
    const v1::PostTransferRequest& post, const std::shared_ptr<Connection>& conn, uint64_t tag) {
  if (!options_.post) {
    return absl::UnimplementedError("POST: this daemon takes prepared transfers over gRPC only");
  }
  sessions::Caller caller;
  caller.session_id = conn->id;
  absl::StatusOr<v1::SubmitTransferResponse> accepted = options_.post(caller, post);
  if (!accepted.ok()) {
    spdlog::info("post rejected (session): {}", accepted.status().ToString());
    return accepted.status();
  }
  if (auto sink = conn->Completions()) PostWhenDone(*conn, sink, accepted->transfer_id(), tag);
  return accepted;
}

absl::StatusOr<v1::SubmitTransferResponse> SessionServerImpl::Admit(
    v1::SubmitTransferRequest& request, const std::shared_ptr<Connection>& conn, uint64_t tag) {
  request.mutable_spec()->set_session_id(conn->id);
  absl::StatusOr<v1::SubmitTransferResponse> accepted = options_.submit(request.spec());
  if (!accepted.ok()) {
    spdlog::info("transfer rejected (session submit): {}", accepted.status().ToString());
    return accepted.status();
  }
  if (auto sink = conn->Completions()) PostWhenDone(*conn, sink, accepted->transfer_id(), tag);
  return accepted;
}

}  // namespace kvrail::session

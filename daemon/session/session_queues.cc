// The session server's submission queues (session_server_impl.h lists its parts): "SQ" mapped
// and watched, and the entries the poll thread takes admitted and acknowledged as SUBMITs are.
#include <sys/epoll.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/unique_fd.h"
#include "daemon/session/admission.h"
#include "daemon/session/session_server.h"
#include "daemon/session/session_server_impl.h"
#include "daemon/session/submission_intake.h"
#include "spdlog/spdlog.h"
#include "wire/session_wire.h"
#include "wire/submission_queue.h"

namespace kvrail::session {

std::string SessionServerImpl::MapSubmissionQueue(int fd, Connection* conn,
                                                  std::vector<UniqueFd> fds, bool truncated) {
  if (!options_.submission_queue || !options_.submit) {
    return wire::EncodeRejected(absl::UnimplementedError(
        "SQ: this daemon takes no submission queues (DaemonConfig.session_submission_queue)"));
  }
  if (fds.size() != 4 || truncated) {
    return wire::EncodeRejected(absl::InvalidArgumentError(
        "SQ: expected the packet \"SQ\" carrying exactly four descriptors (sq memfd, sq "
        "eventfd, ack memfd, ack eventfd)"));
  }
  if (conn->intake != nullptr) {
    return wire::EncodeRejected(
        absl::AlreadyExistsError("SQ: this session already has a submission queue"));
  }
  for (const UniqueFd& passed : fds) {
    if (ShortOfFds(passed.get(), options_.fd_headroom)) {
      return wire::EncodeRejected(ShortOfFdsError());
    }
  }
  absl::StatusOr<std::unique_ptr<SubmissionIntake>> intake =
      SubmissionIntake::Attach(std::move(fds));
  if (!intake.ok()) return wire::EncodeRejected(intake.status());
  if (absl::Status watched = WatchSubmissions(fd, conn, *std::move(intake)); !watched.ok()) {
    return wire::EncodeRejected(watched);
  }
  KVRAIL_DEBUG("session {}: submission queue mapped", conn->id);
  return wire::kSubmissionQueueAccepted;
}

absl::Status SessionServerImpl::WatchSubmissions(int fd, Connection* conn,
                                                 std::unique_ptr<SubmissionIntake> intake) {
  if (!Watch(intake->sq_eventfd(), kSubmissionTag | static_cast<uint64_t>(fd))) {
    return absl::ResourceExhaustedError(
        absl::StrCat("SQ: the daemon cannot watch the queue: ", std::strerror(errno)));
  }
  conn->intake = std::move(intake);
  // Entries published before it was watched (a hot restart's) are read at the next look.
  queues_.Add(fd, conn->intake);
  return absl::OkStatus();
}

bool SessionServerImpl::LookAtQueues(bool may_spin) {
  return queues_.Look(
      kMaxEntriesPerLook, may_spin,
      [this](int fd, std::vector<SubmissionIntake::Entry> entries) {
        auto it = sessions_.find(fd);
        if (it != sessions_.end()) AdmitEntries(it->second, std::move(entries));
      },
      [this](int fd, const absl::Status& status) {
        auto it = sessions_.find(fd);
        if (it == sessions_.end()) return;
        spdlog::warn("session {}: submission queue broken ({}); its entries are no longer read",
                     it->second->id, status.ToString());
        ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second->intake->sq_eventfd(), nullptr);
      });
}

void SessionServerImpl::AdmitEntries(const std::shared_ptr<Connection>& conn,
                                     std::vector<SubmissionIntake::Entry> entries) {
  std::shared_ptr<SubmissionIntake> intake = conn->intake;
  size_t payload = 0;
  for (const SubmissionIntake::Entry& entry : entries) payload += entry.payload_bytes;
  if (admission_ == nullptr ||
      (entries.size() <= kMaxInlineEntries && payload <= kMaxInlineSubmitBytes &&
       options_.max_inline_submit_ids > 0 && admission_->Idle(conn->id))) {
    std::vector<ParsedEntry> parsed;
    parsed.reserve(entries.size());
    bool inline_ok = true;
    for (const SubmissionIntake::Entry& entry : entries) {
      parsed.push_back(ParseEntry(entry));
      inline_ok = inline_ok && AdmitsInlineEntry(parsed.back());
    }
    if (admission_ == nullptr || inline_ok) {
      for (size_t i = 0; i < entries.size(); ++i) {
        AdmitEntry(entries[i].tag, std::move(parsed[i]), conn, *intake);
      }
      return;
    }
  }
  // The batch goes to a bulk worker when one of its requests names more than kBulkIds ids.
  TaskClass task_class = TaskClass::kOrdinary;
  for (const SubmissionIntake::Entry& entry : entries) {
    if (!admission_->has_bulk()) break;
    if (!entry.refused.ok()) continue;
    const uint64_t ids = entry.kind == wire::kPostKind ? PostIdsBound(entry.payload())
                                                       : SubmitIdsBound(entry.payload());
    if (ClassOfIds(ids) == TaskClass::kBulk) task_class = TaskClass::kBulk;
  }
  auto taken = std::make_shared<std::vector<SubmissionIntake::Entry>>(std::move(entries));
  auto admit_all = [this, conn, intake, taken]() {
    for (const SubmissionIntake::Entry& entry : *taken) {
      AdmitEntry(entry.tag, ParseEntry(entry), conn, *intake);
    }
  };
  absl::Status queued = admission_->Post(conn->id, std::move(admit_all), task_class);
  if (!queued.ok()) {
    // Refused at once (the session's admission queue is full): every entry is answered.
    for (const SubmissionIntake::Entry& entry : *taken) {
      wire::SubmitAck ack;
      ack.tag = entry.tag;
      ack.code = static_cast<int32_t>(queued.code());
      ack.message = std::string(queued.message());
      intake->PostAck(ack);
    }
  }
}

SessionServerImpl::ParsedEntry SessionServerImpl::ParseEntry(const SubmissionIntake::Entry& entry) {
  ParsedEntry p;
  if (!entry.refused.ok()) {
    p.request = entry.refused;
    return p;
  }
  const absl::string_view bytes = entry.payload();
  if (entry.kind == wire::kPostKind) {
    v1::PostTransferRequest post;
    if (post.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      p.post = std::move(post);
    } else {
      p.request =
          absl::InvalidArgumentError("sq.entry.payload: not a serialized PostTransferRequest");
    }
    return p;
  }
  v1::SubmitTransferRequest request;
  if (request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    p.request = std::move(request);
  } else {
    p.request =
        absl::InvalidArgumentError("sq.entry.payload: not a serialized SubmitTransferRequest");
  }
  return p;
}

bool SessionServerImpl::AdmitsInlineEntry(const ParsedEntry& p) const {
  if (p.post.has_value()) {
    return static_cast<size_t>(p.post->src_block_ids_size()) + p.post->dst_block_ids_size() <=
           options_.max_inline_submit_ids;
  }
  return !p.request.ok() || AdmitsInline(p.request->spec(), options_.max_inline_submit_ids);
}

void SessionServerImpl::AdmitEntry(uint64_t tag, ParsedEntry p,
                                   const std::shared_ptr<Connection>& conn,
                                   SubmissionIntake& intake) {
  wire::SubmitAck ack;
  ack.tag = tag;
  absl::StatusOr<v1::SubmitTransferResponse> accepted =
      p.post.has_value() ? AdmitPost(*p.post, conn, tag)
      : p.request.ok()   ? Admit(*p.request, conn, tag)
                         : absl::StatusOr<v1::SubmitTransferResponse>(p.request.status());
  if (accepted.ok()) {
    ack.transfer_id = accepted->transfer_id();
    ack.bytes_total = accepted->bytes_total();
    ack.tiles_total = accepted->tiles_total();
    ack.flags = accepted->deduplicated() ? wire::kSubmitAckDeduplicated : 0;
  } else {
    ack.code = static_cast<int32_t>(accepted.status().code());
    ack.message = std::string(accepted.status().message());
  }
  intake.PostAck(ack);
  // `p` (the parsed request, its spec's ids) is freed here, after the acknowledgement.
}

}  // namespace kvrail::session

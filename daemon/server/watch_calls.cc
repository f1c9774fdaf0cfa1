#include "daemon/server/watch_calls.h"

#include <deque>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/grpc_status.h"

namespace kvrail::server {

absl::StatusOr<WatcherCounts::Slot> WatcherCounts::Take(const sessions::Caller& caller) {
  absl::MutexLock lock(&mu_);
  uint32_t& in_session = per_session_[caller.session_id];
  if (in_session >= max_per_session_) {
    const uint32_t n = in_session;
    if (n == 0) per_session_.erase(caller.session_id);
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_watchers_per_session: ",
        caller.session_id == 0 ? std::string("the anonymous callers have ")
                               : absl::StrCat("session ", caller.session_id, " has "),
        n, " waits and watches open, the most allowed (DaemonConfig.max_watchers_per_session)"));
  }
  if (caller.uid >= 0) {
    auto it = per_uid_.find(caller.uid);
    if (it != per_uid_.end() && it->second >= max_per_uid_) {
      if (in_session == 0) per_session_.erase(caller.session_id);
      return absl::ResourceExhaustedError(
          absl::StrCat("max_watchers_per_uid: uid ", caller.uid, " has ", it->second,
                       " waits and watches open in its sessions, the most allowed "
                       "(DaemonConfig.max_watchers_per_uid)"));
    }
    ++per_uid_[caller.uid];
  }
  ++in_session;
  return Slot(this, caller.session_id, caller.uid);
}

uint32_t WatcherCounts::OpenOfUid(int64_t uid) const {
  absl::MutexLock lock(&mu_);
  auto it = per_uid_.find(uid);
  return it == per_uid_.end() ? 0 : it->second;
}

void WatcherCounts::Give(uint64_t session, int64_t uid) {
  absl::MutexLock lock(&mu_);
  auto it = per_session_.find(session);
  if (it != per_session_.end() && --it->second == 0) per_session_.erase(it);
  if (uid < 0) return;
  auto u = per_uid_.find(uid);
  if (u != per_uid_.end() && --u->second == 0) per_uid_.erase(u);
}

WatchPump::WatchPump(absl::Duration tick) : tick_(tick), thread_([this] { Loop(); }) {}

WatchPump::~WatchPump() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void WatchPump::Add(std::shared_ptr<PumpedCall> call) {
  absl::MutexLock lock(&mu_);
  added_.push_back(std::move(call));
  open_.fetch_add(1);
}

void WatchPump::Wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
}

void WatchPump::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return woken_ || stop_ || !added_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&due), tick_);
      if (stop_) return;
      woken_ = false;
      for (auto& call : added_) calls_.push_back(std::move(call));
      added_.clear();
    }
    size_t kept = 0;
    for (size_t i = 0; i < calls_.size(); ++i) {
      if (calls_[i]->Poll()) calls_[kept++] = std::move(calls_[i]);
    }
    const size_t dropped = calls_.size() - kept;
    calls_.resize(kept);
    if (dropped > 0) open_.fetch_sub(dropped);
  }
}

namespace {

// A unary call's answer through gRPC: the context's default reactor.
class GrpcAnswer final : public UnaryAnswer {
 public:
  explicit GrpcAnswer(grpc::CallbackServerContext* context)
      : context_(context), reactor_(context->DefaultReactor()) {}
  grpc::ServerUnaryReactor* reactor() const { return reactor_; }
  bool IsCancelled() const override { return context_->IsCancelled(); }
  void Finish(const grpc::Status& status) override { reactor_->Finish(status); }

 private:
  grpc::CallbackServerContext* const context_;
  grpc::ServerUnaryReactor* const reactor_;
};

// WaitTransfer's call. The WhenEnded callback (on the thread that ends the transfer, under its
// record's lock) only stores the status and wakes the pump; the pump answers.
class WaitCall final : public PumpedCall {
 public:
  WaitCall(std::unique_ptr<UnaryAnswer> answer, const sessions::Caller& caller, uint64_t id,
           absl::Time until, v1::TransferStatus* response, WatcherCounts::Slot slot,
           const transfers::TransferManager* transfers)
      : answer_(std::move(answer)),
        caller_(caller),
        id_(id),
        until_(until),
        response_(response),
        slot_(std::move(slot)),
        transfers_(transfers) {}

  void Ended(const v1::TransferStatus& status) {
    absl::MutexLock lock(&mu_);
    ended_ = status;
  }
  // WhenEnded refused (the transfer has too many waiters): the pump looks at its state instead.
  void PollState() { poll_state_ = true; }

  bool Poll() override {
    std::optional<v1::TransferStatus> ended;
    {
      absl::MutexLock lock(&mu_);
      ended = std::move(ended_);
      ended_.reset();
    }
    absl::StatusOr<v1::TransferStatus> status;
    if (ended.has_value()) {
      status = *std::move(ended);
    } else {
      if (poll_state_) {
        status = transfers_->Get(caller_, id_);
        if (status.ok() && status->state() >= v1::TRANSFER_STATE_SUCCEEDED) ended.emplace();
      }
      if (!ended.has_value() && absl::Now() < until_ && !answer_->IsCancelled()) return true;
      if (!poll_state_) status = transfers_->Get(caller_, id_);
    }
    if (status.ok()) *response_ = *std::move(status);
    // The slot first: once answered, the client may call again at once.
    slot_.reset();
    // After Finish the context and response belong to gRPC again: nothing here touches them.
    answer_->Finish(status.ok() ? grpc::Status::OK : ToGrpcStatus(status.status()));
    return false;
  }

 private:
  const std::unique_ptr<UnaryAnswer> answer_;
  const sessions::Caller caller_;
  const uint64_t id_;
  const absl::Time until_;
  v1::TransferStatus* const response_;
  WatcherCounts::Slot slot_;
  const transfers::TransferManager* const transfers_;
  bool poll_state_ = false;  // set before the call reaches the pump
  absl::Mutex mu_;
  std::optional<v1::TransferStatus> ended_ ABSL_GUARDED_BY(mu_);
};

// PollNotifications' wait: each poll takes what is queued without blocking; the first
// notification, the session's end, the timeout or the client's leaving answers.
class PollCall final : public PumpedCall {
 public:
  PollCall(std::unique_ptr<UnaryAnswer> answer, uint64_t session_id, uint32_t max, absl::Time until,
           v1::NotificationPollResponse* response, WatcherCounts::Slot slot,
           transfers::NotificationHub* hub)
      : answer_(std::move(answer)),
        session_id_(session_id),
        max_(max),
        until_(until),
        response_(response),
        slot_(std::move(slot)),
        hub_(hub) {}

  bool Poll() override {
    absl::StatusOr<std::vector<v1::Notification>> taken =
        hub_->Take(session_id_, max_, absl::ZeroDuration());
    if (taken.ok() && taken->empty() && absl::Now() < until_ && !answer_->IsCancelled()) {
      return true;
    }
    if (taken.ok()) {
      for (v1::Notification& n : *taken) *response_->add_notifications() = std::move(n);
    }
    // The slot first: once answered, the client may call again at once.
    slot_.reset();
    // After Finish the context and response belong to gRPC again: nothing here touches them.
    answer_->Finish(taken.ok() ? grpc::Status::OK : ToGrpcStatus(taken.status()));
    return false;
  }

 private:
  const std::unique_ptr<UnaryAnswer> answer_;
  const uint64_t session_id_;
  const uint32_t max_;
  const absl::Time until_;
  v1::NotificationPollResponse* const response_;
  WatcherCounts::Slot slot_;
  transfers::NotificationHub* const hub_;
};

// A server stream fed by the pump: Produce appends what is new (only while nothing is being
// written, so a slow reader holds one message, not a queue), writes go one at a time, and the
// stream finishes when Produce says it is over, fails, or the client goes. StartWrite and Finish
// are called without the call's lock (gRPC may run a reaction inline). Lives until OnDone and
// until the pump drops it (shared ownership).
template <typename T>
class StreamCall : public grpc::ServerWriteReactor<T>, public PumpedCall {
 public:
  explicit StreamCall(WatcherCounts::Slot slot) : slot_(std::move(slot)) {}

  // Hands the call to `pump`; `self` is gRPC's share until OnDone.
  void Begin(std::shared_ptr<StreamCall> self, WatchPump* pump) {
    {
      absl::MutexLock lock(&mu_);
      self_ = self;
    }
    pump->Add(std::move(self));
  }

  bool Poll() final {
    {
      absl::MutexLock lock(&mu_);
      if (done_) return false;
      if (finished_ || writing_ || !queue_.empty() || cancelled_) return true;
    }
    std::vector<T> fresh;
    bool over = false;
    const absl::Status produced = Produce(&fresh, &over);
    {
      absl::MutexLock lock(&mu_);
      for (T& message : fresh) queue_.push_back(std::move(message));
      if (!produced.ok()) {
        end_ = ToGrpcStatus(produced);
        over = true;
      }
      over_ = over_ || over;
    }
    Advance();
    return true;
  }

  void OnWriteDone(bool ok) final {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (ok) {
        queue_.pop_front();
      } else {
        cancelled_ = true;  // the stream broke: the client went
      }
    }
    Advance();
  }

  void OnCancel() final {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }
    Advance();
  }

  void OnDone() final {
    std::shared_ptr<StreamCall> self;
    WatcherCounts::Slot slot;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      self = std::move(self_);
      slot = std::move(slot_);  // (given back before the finish already)
    }
    // The pump drops its share at its next poll; `self` may be the last one here.
  }

 protected:
  // Appends what is new; sets *over when the stream is complete. An error finishes the stream
  // with it. Called on the pump's thread only.
  virtual absl::Status Produce(std::vector<T>* out, bool* over) = 0;

 private:
  // Starts the next write or the finish, if due; gives back the slot before the finish (once
  // the client has the final status it may open another call at once).
  void Advance() {
    const T* write = nullptr;
    std::optional<grpc::Status> finish;
    WatcherCounts::Slot slot;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_) return;
      if (cancelled_) {
        finish = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      } else if (!queue_.empty()) {
        writing_ = true;
        write = &queue_.front();  // a deque keeps its elements in place as others are added
      } else if (over_) {
        finish = end_;
      } else {
        return;
      }
      if (finish.has_value()) {
        finished_ = true;
        slot = std::move(slot_);
      }
    }
    if (write != nullptr) this->StartWrite(write);
    if (finish.has_value()) {
      slot.reset();
      this->Finish(*finish);
    }
  }

  absl::Mutex mu_;
  WatcherCounts::Slot slot_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<StreamCall> self_ ABSL_GUARDED_BY(mu_);  // gRPC's share, until OnDone
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool over_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_ ABSL_GUARDED_BY(mu_) = grpc::Status::OK;
};

class WatchCall final : public StreamCall<v1::TransferEvent> {
 public:
  WatchCall(const sessions::Caller& caller, uint64_t id, absl::Duration min_interval,
            WatcherCounts::Slot slot, const transfers::TransferManager* transfers)
      : StreamCall(std::move(slot)),
        caller_(caller),
        id_(id),
        min_interval_(min_interval),
        transfers_(transfers) {}

 private:
  absl::Status Produce(std::vector<v1::TransferEvent>* out, bool* over) override {
    const absl::Status stepped = transfers_->WatchStep(caller_, id_, min_interval_, &cursor_, out);
    *over = cursor_.over;
    return stepped;
  }
  const sessions::Caller caller_;
  const uint64_t id_;
  const absl::Duration min_interval_;
  const transfers::TransferManager* const transfers_;
  transfers::WatchCursor cursor_;  // the pump thread's
};

class NotificationCall final : public StreamCall<v1::Notification> {
 public:
  NotificationCall(uint64_t session_id, WatcherCounts::Slot slot, transfers::NotificationHub* hub)
      : StreamCall(std::move(slot)), session_id_(session_id), hub_(hub) {}

 private:
  absl::Status Produce(std::vector<v1::Notification>* out, bool* over) override {
    absl::StatusOr<std::vector<v1::Notification>> taken =
        hub_->Take(session_id_, 0, absl::ZeroDuration());
    if (!taken.ok()) {
      // The session ended while watched: the stream ends OK; not open at the start: NOT_FOUND.
      *over = true;
      return first_ ? taken.status() : absl::OkStatus();
    }
    first_ = false;
    for (v1::Notification& n : *taken) out->push_back(std::move(n));
    return absl::OkStatus();
  }
  const uint64_t session_id_;
  transfers::NotificationHub* const hub_;
  bool first_ = true;  // the pump thread's
};

}  // namespace

grpc::ServerUnaryReactor* StartWait(grpc::CallbackServerContext* context,
                                    const sessions::Caller& caller, uint64_t id,
                                    absl::Duration timeout, v1::TransferStatus* response,
                                    WatcherCounts::Slot slot,
                                    const transfers::TransferManager* transfers,
                                    const std::shared_ptr<WatchPump>& pump) {
  auto answer = std::make_unique<GrpcAnswer>(context);
  grpc::ServerUnaryReactor* reactor = answer->reactor();
  StartWaitCall(std::move(answer), caller, id, timeout, response, std::move(slot), transfers, pump);
  return reactor;
}

void StartWaitCall(std::unique_ptr<UnaryAnswer> answer, const sessions::Caller& caller, uint64_t id,
                   absl::Duration timeout, v1::TransferStatus* response, WatcherCounts::Slot slot,
                   const transfers::TransferManager* transfers,
                   const std::shared_ptr<WatchPump>& pump) {
  const absl::Time until =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  auto call = std::make_shared<WaitCall>(std::move(answer), caller, id, until, response,
                                         std::move(slot), transfers);
  std::weak_ptr<WaitCall> weak_call = call;
  std::weak_ptr<WatchPump> weak_pump = pump;
  const absl::Status followed =
      transfers->WhenEnded(caller, id, [weak_call, weak_pump](const v1::TransferStatus& status) {
        if (auto c = weak_call.lock()) c->Ended(status);
        if (auto p = weak_pump.lock()) p->Wake();
      });
  if (!followed.ok()) call->PollState();
  pump->Add(std::move(call));
}

grpc::ServerUnaryReactor* StartPoll(grpc::CallbackServerContext* context, uint64_t session_id,
                                    uint32_t max, absl::Duration timeout,
                                    v1::NotificationPollResponse* response,
                                    WatcherCounts::Slot slot, transfers::NotificationHub* hub,
                                    const std::shared_ptr<WatchPump>& pump) {
  auto answer = std::make_unique<GrpcAnswer>(context);
  grpc::ServerUnaryReactor* reactor = answer->reactor();
  StartPollCall(std::move(answer), session_id, max, timeout, response, std::move(slot), hub, pump);
  return reactor;
}

void StartPollCall(std::unique_ptr<UnaryAnswer> answer, uint64_t session_id, uint32_t max,
                   absl::Duration timeout, v1::NotificationPollResponse* response,
                   WatcherCounts::Slot slot, transfers::NotificationHub* hub,
                   const std::shared_ptr<WatchPump>& pump) {
  pump->Add(std::make_shared<PollCall>(std::move(answer), session_id, max, absl::Now() + timeout,
                                       response, std::move(slot), hub));
}

grpc::ServerWriteReactor<v1::TransferEvent>* StartWatch(grpc::CallbackServerContext* /*context*/,
                                                        const sessions::Caller& caller, uint64_t id,
                                                        absl::Duration min_interval,
                                                        WatcherCounts::Slot slot,
                                                        const transfers::TransferManager* transfers,
                                                        const std::shared_ptr<WatchPump>& pump) {
  auto call = std::make_shared<WatchCall>(caller, id, min_interval, std::move(slot), transfers);
  grpc::ServerWriteReactor<v1::TransferEvent>* reactor = call.get();
  call->Begin(call, pump.get());
  return reactor;
}

grpc::ServerWriteReactor<v1::Notification>* StartNotificationWatch(
    grpc::CallbackServerContext* /*context*/, uint64_t session_id, WatcherCounts::Slot slot,
    transfers::NotificationHub* hub, const std::shared_ptr<WatchPump>& pump) {
  auto call = std::make_shared<NotificationCall>(session_id, std::move(slot), hub);
  grpc::ServerWriteReactor<v1::Notification>* reactor = call.get();
  call->Begin(call, pump.get());
  return reactor;
}

}  // namespace kvrail::server

// Waits and watches served on gRPC's callback API: WaitTransfer, WatchTransfer,
// WatchNotifications and a PollNotifications that waits hold no thread while they wait. Each open
// call is a reactor polled by one pump thread (every tick, and at once when a transfer a Wait waits
// for ends), so a daemon with thousands of open watches runs a fixed number of threads; the calls
// that do answer at once (status, submit, lists) keep gRPC's synchronous pool to themselves. Open
// calls are capped per session and per uid (WatcherCounts): the excess is refused
// RESOURCE_EXHAUSTED naming the cap. Internal to the server module.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/sessions/sessions.h"
#include "daemon/transfers/transfers.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::server {

// Waits and watches open at once per session (the anonymous callers share one count) and per
// uid (a session's SO_PEERCRED uid; anonymous callers have none and are counted as session 0
// only). Thread-safe.
class WatcherCounts {
 public:
  WatcherCounts(uint32_t max_per_session, uint32_t max_per_uid)
      : max_per_session_(max_per_session), max_per_uid_(max_per_uid) {}
  // One place, given back on destruction (or reset).
  class Slot {
   public:
    Slot() = default;
    Slot(WatcherCounts* owner, uint64_t session, int64_t uid)
        : owner_(owner), session_(session), uid_(uid) {}
    Slot(Slot&& other) noexcept
        : owner_(std::exchange(other.owner_, nullptr)),
          session_(other.session_),
          uid_(other.uid_) {}
    Slot& operator=(Slot&& other) noexcept {
      reset();
      owner_ = std::exchange(other.owner_, nullptr);
      session_ = other.session_;
      uid_ = other.uid_;
      return *this;
    }
    ~Slot() { reset(); }
    void reset() {
      if (owner_ != nullptr) std::exchange(owner_, nullptr)->Give(session_, uid_);
    }

   private:
    WatcherCounts* owner_ = nullptr;
    uint64_t session_ = 0;
    int64_t uid_ = -1;
  };
  // RESOURCE_EXHAUSTED naming max_watchers_per_session or max_watchers_per_uid at a cap.
  absl::StatusOr<Slot> Take(const sessions::Caller& caller);
  // Open calls of `uid` (tests, stats).
  uint32_t OpenOfUid(int64_t uid) const;

 private:
  void Give(uint64_t session, int64_t uid);
  const uint32_t max_per_session_;
  const uint32_t max_per_uid_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, uint32_t> per_session_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, uint32_t> per_uid_ ABSL_GUARDED_BY(mu_);
};

// A call the pump drives.
class PumpedCall {
 public:
  virtual ~PumpedCall() = default;
  // Does what is due without blocking (on the pump's thread); false once the call is over and
  // the pump may drop it.
  virtual bool Poll() = 0;
};

// One thread polling every open call each `tick`, and at once after Wake. Thread-safe; destroy
// after the grpc::Server (its shutdown waits for the calls, which need the pump to finish).
class WatchPump {
 public:
  explicit WatchPump(absl::Duration tick);
  ~WatchPump();
  void Add(std::shared_ptr<PumpedCall> call);
  // Polls every call soon (a transfer ended).
  void Wake();
  size_t open() const { return open_.load(); }

 private:
  void Loop();
  const absl::Duration tick_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<PumpedCall>> added_ ABSL_GUARDED_BY(mu_);
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<size_t> open_{0};
  std::vector<std::shared_ptr<PumpedCall>> calls_;  // the pump thread's
  std::thread thread_;
};

// The answering side of a unary wait: gRPC's context and default reactor in the daemon (StartWait,
// StartPoll), a fake in tests. Called on the pump's thread only.
class UnaryAnswer {
 public:
  virtual ~UnaryAnswer() = default;
  // Whether the client went.
  virtual bool IsCancelled() const = 0;
  // Sends the answer (the response is filled in before); after it the response is gRPC's. The
  // call gives back its WatcherCounts slot before this: a client that calls again as soon as it
  // has its answer is never refused at the cap for the call that answered it.
  virtual void Finish(const grpc::Status& status) = 0;
};

// WaitTransfer: answers when transfer `id` ends (TransferManager::WhenEnded), after `timeout`
// (infinite: none) with its current status, or when the client goes. The manager checks
// `caller` on every look at the transfer; the call holds `slot` until the answer.
grpc::ServerUnaryReactor* StartWait(grpc::CallbackServerContext* context,
                                    const sessions::Caller& caller, uint64_t id,
                                    absl::Duration timeout, v1::TransferStatus* response,
                                    WatcherCounts::Slot slot,
                                    const transfers::TransferManager* transfers,
                                    const std::shared_ptr<WatchPump>& pump);
// StartWait with its answering side given.
void StartWaitCall(std::unique_ptr<UnaryAnswer> answer, const sessions::Caller& caller, uint64_t id,
                   absl::Duration timeout, v1::TransferStatus* response, WatcherCounts::Slot slot,
                   const transfers::TransferManager* transfers,
                   const std::shared_ptr<WatchPump>& pump);

// WatchTransfer: the snapshot, then every event until the final state (TransferManager::
// WatchStep, which checks `caller`), one write at a time; ends when the client goes. The stream
// calls give back `slot` before they finish (as UnaryAnswer::Finish says).
grpc::ServerWriteReactor<v1::TransferEvent>* StartWatch(grpc::CallbackServerContext* context,
                                                        const sessions::Caller& caller, uint64_t id,
                                                        absl::Duration min_interval,
                                                        WatcherCounts::Slot slot,
                                                        const transfers::TransferManager* transfers,
                                                        const std::shared_ptr<WatchPump>& pump);

// WatchNotifications: the session's notifications as they are queued; ends OK when the session
// ends (NOT_FOUND when it was not open at the start).
grpc::ServerWriteReactor<v1::Notification>* StartNotificationWatch(
    grpc::CallbackServerContext* context, uint64_t session_id, WatcherCounts::Slot slot,
    transfers::NotificationHub* hub, const std::shared_ptr<WatchPump>& pump);

// PollNotifications that found nothing queued and may wait: answers with up to `max` (0: 256)
// of the session's notifications once one is queued (seen at the pump's next tick), empty after
// `timeout` or when the client goes, NOT_FOUND when the session ends. Holds `slot` until then.
grpc::ServerUnaryReactor* StartPoll(grpc::CallbackServerContext* context, uint64_t session_id,
                                    uint32_t max, absl::Duration timeout,
                                    v1::NotificationPollResponse* response,
                                    WatcherCounts::Slot slot, transfers::NotificationHub* hub,
                                    const std::shared_ptr<WatchPump>& pump);
// StartPoll with its answering side given.
void StartPollCall(std::unique_ptr<UnaryAnswer> answer, uint64_t session_id, uint32_t max,
                   absl::Duration timeout, v1::NotificationPollResponse* response,
                   WatcherCounts::Slot slot, transfers::NotificationHub* hub,
                   const std::shared_ptr<WatchPump>& pump);

// A streaming call refused before it began.
template <typename T>
grpc::ServerWriteReactor<T>* RefusedStream(const grpc::Status& status) {
  class Refused final : public grpc::ServerWriteReactor<T> {
   public:
    explicit Refused(const grpc::Status& status) { this->Finish(status); }
    void OnDone() override { delete this; }
  };
  return new Refused(status);
}

}  // namespace kvrail::server

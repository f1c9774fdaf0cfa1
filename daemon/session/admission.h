// Internal to the session server: admission of SUBMITs off the poll thread. Each session has a
// queue of work (its SUBMITs, and the packets it sent after a SUBMIT still queued, so that its
// answers keep the order of its packets); a fixed pool of workers runs the queues of different
// sessions in parallel, one task of a session at a time and in the order posted. A large
// submit of one tenant (planning a million tiles) then holds one worker, not the poll thread
// that every other session's packets go through.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::session {

// Whether a SUBMIT of `spec` is cheap enough to admit on the poll thread: its block ids travel in
// the packet (no shared block table, which may hold 2^24 of them) and number at most `max_ids`
// on both sides together. Such an admission costs about what handing it to a worker does, so the
// poll thread keeps it (max_ids 0: none). Pure.
bool AdmitsInline(const v1::TransferSpec& spec, uint64_t max_ids);

// Thread contract: Open, Post, Idle, Close and AwaitIdle are called by one thread (the poll
// thread: the only producer, which is what makes Idle's answer stable until its next Post); tasks
// and Close's `then` run on the pool's workers (or on the caller of Close, see there). Destroying
// the pool (from the producer's thread, after it stopped posting) lets each running task finish,
// drops the tasks still queued unrun, and joins the workers. Every shared field is guarded by
// mu_.
class AdmissionPool {
 public:
  using Task = absl::AnyInvocable<void() &&>;

  // `workers` >= 1 threads; a session holds at most `max_queued` tasks not yet started.
  AdmissionPool(size_t workers, size_t max_queued);
  ~AdmissionPool();
  AdmissionPool(const AdmissionPool&) = delete;
  AdmissionPool& operator=(const AdmissionPool&) = delete;

  // Starts session `id`'s queue (empty, open).
  void Open(uint64_t id);
  // Queues `task` after session `id`'s earlier tasks. RESOURCE_EXHAUSTED naming the cap when
  // `max_queued` tasks of the session are waiting already (the task is not queued; the caller
  // answers the packet); FAILED_PRECONDITION when the session is unknown or closed.
  absl::Status Post(uint64_t id, Task task);
  // Whether session `id` has no task queued or running: every answer of its earlier tasks has
  // been sent, so the producer may serve its next packet itself and keep the order.
  bool Idle(uint64_t id) const;
  // Session `id` has closed: its queued tasks are dropped unrun (destroyed on this thread) and
  // their number returned. `then` runs once no task of the session runs any more: at once on this
  // thread when none does, else on the worker right after its task returns.
  size_t Close(uint64_t id, std::function<void()> then);

  // Returns once no task is queued or running (the producer has stopped posting: a hot
  // restart's pause, daemon/handover). Tasks queued then run first, none is dropped.
  void AwaitIdle() const;

  // Tasks of every session waiting to start, and tasks running (for tests and stats).
  size_t queued() const;
  size_t running() const;
  // The most tasks waiting in one session's queue (at most max_queued; metrics).
  size_t deepest() const;

 private:
  struct Queue {
    std::deque<Task> tasks;
    bool running = false;  // a worker runs one of its tasks
    bool closed = false;
    std::function<void()> then;  // set by Close while a task runs
  };

  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);      // stopping, or a session ready
  bool NothingLeft() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // no task queued or running
  void Work();

  const size_t max_queued_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Queue> queues_ ABSL_GUARDED_BY(mu_);
  // Sessions with tasks queued and none running, oldest first: a worker takes one task of the
  // first and, if more are queued, puts the session back at the end (sessions take turns).
  std::deque<uint64_t> ready_ ABSL_GUARDED_BY(mu_);
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvrail::session

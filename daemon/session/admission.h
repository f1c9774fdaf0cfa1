// Internal to the session server: admission of SUBMITs off the poll thread. Each session has a
// queue of work (its SUBMITs, and the packets it sent after a SUBMIT still queued, so that its
// answers keep the order of its packets); a fixed pool of workers runs the queues of different
// sessions in parallel, one task of a session at a time and in the order posted. A large
// submit of one tenant (planning a million tiles) then holds one worker, not the poll thread
// that every other session's packets go through; and, run by a bulk worker in the background
// (SCHED_IDLE), it takes the CPU only when the other tenants' threads leave it, until its
// deadline: a bulk task still running then finishes at normal priority (the starvation guard).
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::session {

// Whether a SUBMIT of `spec` is cheap enough to admit on the poll thread: its block ids travel in
// the packet (no shared block table, which may hold 2^24 of them) and number at most `max_ids`
// on both sides together. Such an admission costs about what handing it to a worker does, so the
// poll thread keeps it (max_ids 0: none). Pure.
bool AdmitsInline(const v1::TransferSpec& spec, uint64_t max_ids);

// Which workers run a task.
enum class TaskClass {
  kOrdinary,  // an ordinary worker (normal priority)
  kBulk,      // a bulk worker (SCHED_IDLE), when the pool has any; else an ordinary one
};

// A request naming more block ids than this (both sides together, a shared block table's count
// included) is admitted as kBulk. Checking and planning 65,536 ids takes ~0.1 ms on the build
// machine (2 x 2^22 ids took 11-12 ms), under the 4 KiB transfer's unloaded p99 there (~0.2
// ms): a request below it cannot double another tenant's p99 at any priority, while the
// million-id requests that can are far above it.
inline constexpr uint64_t kBulkIds = uint64_t{1} << 16;

// An upper bound on the block ids a serialized SubmitTransferRequest names, read from its wire
// format without parsing the ids: a shared block table's `count`, block_ids_le32's bytes / 4,
// block_ids' bytes (a packed id takes at least one byte). O(fields), not O(ids), so the poll
// thread can classify a request of any size. Bytes that are no SubmitTransferRequest yield what
// was counted before them (the worker answers the parse error). Pure.
uint64_t SubmitIdsBound(absl::string_view serialized);
// The same for a serialized PostTransferRequest (src/dst_block_ids: bytes; their _le32: bytes / 4).
uint64_t PostIdsBound(absl::string_view serialized);

// kBulk when `ids` > kBulkIds. Pure.
TaskClass ClassOfIds(uint64_t ids);

// Whether a thread of this process may leave SCHED_IDLE once in it (CAP_SYS_NICE, or an
// RLIMIT_NICE that reaches the thread's nice value): a short-lived thread enters the policy and
// tries to leave it. The bulk class's starvation guard needs it. A probe (starts a thread).
bool CanLeaveBackground();

// The bulk workers a pool starts: `configured`, unless they are to be guarded (`deadline` > 0)
// and this process cannot lift a thread out of SCHED_IDLE (`can_leave` false): then none, and
// `why` says so and how to grant it. Unguarded (`deadline` 0), `configured` as asked. Pure.
struct BulkPlan {
  size_t workers = 0;
  std::string why;  // empty unless the configured workers are not started
};
BulkPlan PlanBulkWorkers(size_t configured, absl::Duration deadline, bool can_leave);

// Thread contract: Open, Post, Idle, Close and AwaitIdle are called by one thread (the poll
// thread: the only producer, which is what makes Idle's answer stable until its next Post); tasks
// and Close's `then` run on the pool's workers (or on the caller of Close, see there). A task
// posted as kBulk runs on a bulk worker and a kOrdinary one on an ordinary worker, never the
// other way (with no bulk workers every task is ordinary); a session's tasks still run one at a
// time in the order posted, whatever their class: a bulk task at a session's head waits for a
// bulk worker, and ordinary workers pass that session over meanwhile. Bulk workers put
// themselves in SCHED_IDLE once, as they start (Linux lets any thread enter it, and only one
// with CAP_SYS_NICE or RLIMIT_NICE's leave come back). With a `bulk_deadline`, a guard thread
// lifts a bulk worker whose task has run that long back to SCHED_OTHER (a SCHED_IDLE thread
// gets ~0.3% of a core while ordinary threads keep every core busy: a plan of 30 ms could take
// seconds, and a lock it holds would stall its waiters as long); the worker returns to
// SCHED_IDLE itself once the task ends, so every bulk task starts in the background. The guard
// lifts a worker only while its task runs (both under mu_). Destroying the pool (from the
// producer's thread, after it stopped posting) lets each running task finish, drops the tasks
// still queued unrun, and joins the workers and the guard. Every shared field is guarded by mu_.
class AdmissionPool {
 public:
  using Task = absl::AnyInvocable<void() &&>;

  // `workers` >= 1 ordinary threads and `bulk_workers` bulk ones (see kBulkPolicy); a session
  // holds at most `max_queued` tasks not yet started. A bulk task running `bulk_deadline` is
  // lifted to normal priority (zero: never; see PlanBulkWorkers for where that is possible).
  AdmissionPool(size_t workers, size_t max_queued, size_t bulk_workers = 0,
                absl::Duration bulk_deadline = absl::ZeroDuration());
  ~AdmissionPool();
  AdmissionPool(const AdmissionPool&) = delete;
  AdmissionPool& operator=(const AdmissionPool&) = delete;

  // Starts session `id`'s queue (empty, open).
  void Open(uint64_t id);
  // Queues `task` after session `id`'s earlier tasks. RESOURCE_EXHAUSTED naming the cap when
  // `max_queued` tasks of the session are waiting already (the task is not queued; the caller
  // answers the packet); FAILED_PRECONDITION when the session is unknown or closed.
  absl::Status Post(uint64_t id, Task task, TaskClass task_class = TaskClass::kOrdinary);
  // Whether session `id` has no task queued or running: every answer of its earlier tasks has
  // been sent, so the producer may serve its next packet itself and keep the order.
  bool Idle(uint64_t id) const;
  // Whether the pool has bulk workers: without them every task runs as kOrdinary, so the
  // producer need not classify its requests (SubmitIdsBound) at all.
  bool has_bulk() const { return has_bulk_; }
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
  // Bulk tasks the guard lifted to normal priority at their deadline, so far (metrics).
  uint64_t promoted() const;

  // A bulk worker's scheduling policy: SCHED_IDLE (CFS weight 3 against a nice-0 thread's 1024,
  // and preempted by any other thread that wakes). Of those measured beside a 2^22-id SUBMIT
  // (SCHED_IDLE, nice +10, nice +19, SCHED_BATCH; docs/benchmarks.md, "Session admission off
  // the poll thread"), the only one that kept the other tenant's 4 KiB p99 within 2x of its
  // unloaded value in every try of that comparison; the large admission still progresses, up to
  // ~3x slower on a busy machine, and on a saturated one the guard bounds its time in the
  // background. If the kernel refuses the policy, the worker sets nice 19 instead.
  static constexpr int kBulkPolicy = SCHED_IDLE;

 private:
  struct Pending {
    Task task;
    TaskClass task_class;
  };
  // A bulk worker as the guard sees it.
  struct BulkSlot {
    pid_t tid = 0;          // the worker's thread (set as it starts)
    bool running = false;   // a task of it runs
    bool promoted = false;  // the guard lifted it out of SCHED_IDLE during this task
    absl::Time started;     // when the running task started
  };
  struct Queue {
    std::deque<Pending> tasks;
    bool running = false;  // a worker runs one of its tasks
    bool closed = false;
    std::function<void()> then;  // set by Close while a task runs
  };

  // Stopping, or a session ready whose next task is of the class.
  bool HasOrdinaryWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasBulkWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool NothingLeft() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // no task queued or running
  // Stopping, or a bulk task started since the guard last looked.
  bool GuardHasNews() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts session `id` (tasks queued, none running) in the ready list of its next task's class.
  void MakeReady(uint64_t id, const Queue& queue) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `slot`: the worker's index in bulk_slots_ (bulk workers only).
  void Work(TaskClass worker_class, size_t slot);
  // The starvation guard's loop (bulk workers with a deadline only).
  void Guard();

  const size_t max_queued_;
  const bool has_bulk_;                 // bulk workers exist (else every task is ordinary)
  const absl::Duration bulk_deadline_;  // zero: no guard
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Queue> queues_ ABSL_GUARDED_BY(mu_);
  // Sessions with tasks queued and none running, oldest first, by the class of their next task
  // (index: TaskClass): a worker takes one task of the first of its class's list and, if more
  // are queued, puts the session back at the end of the list of its next task's class (sessions
  // take turns). A session may also sit in a list stale (closed, reopened): it is passed over.
  std::deque<uint64_t> ready_[2] ABSL_GUARDED_BY(mu_);
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<BulkSlot> bulk_slots_ ABSL_GUARDED_BY(mu_);
  uint64_t bulk_started_ ABSL_GUARDED_BY(mu_) = 0;  // bulk tasks started so far
  uint64_t guard_seen_ ABSL_GUARDED_BY(mu_) = 0;    // bulk_started_ when the guard last looked
  uint64_t promoted_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> workers_;  // the guard's thread too, when there is one
};

}  // namespace kvrail::session

#include "daemon/session/admission.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/io/coded_stream.h"

namespace kvrail::session {
namespace {

// Field numbers (proto/kvrail/v1/transfer.proto).
constexpr uint32_t kRequestSpec = 1;                  // SubmitTransferRequest.spec
constexpr uint32_t kSpecSrc = 1, kSpecDst = 2;        // TransferSpec.src, .dst
constexpr uint32_t kBlockIds = 2, kBlockIdsLe32 = 7;  // TransferEndpoint
constexpr uint32_t kBlockTable = 8;                   // TransferEndpoint.block_table
constexpr uint32_t kTableCount = 3;                   // BlockTableRef.count
constexpr uint32_t kPostIds[] = {2, 3};               // PostTransferRequest.src/dst_block_ids
constexpr uint32_t kPostIdsLe32[] = {5, 6};           // and their _le32

// Calls `each(number, type, bytes, value)` for every field of `in` (protobuf's wire format:
// `bytes` set for a length-delimited field, `value` for a varint), up to malformed bytes or a
// group (neither is in these messages).
template <typename F>
void ForEachField(absl::string_view in, F each) {
  if (in.size() > static_cast<size_t>(std::numeric_limits<int>::max())) return;
  google::protobuf::io::CodedInputStream input(reinterpret_cast<const uint8_t*>(in.data()),
                                               static_cast<int>(in.size()));
  for (uint32_t tag = input.ReadTag(); tag != 0; tag = input.ReadTag()) {
    const uint32_t number = tag >> 3, type = tag & 7;
    absl::string_view bytes;
    uint64_t value = 0;
    switch (type) {
      case 0:  // varint
        if (!input.ReadVarint64(&value)) return;
        break;
      case 1:  // fixed64
      case 5:  // fixed32
        if (!input.Skip(type == 1 ? 8 : 4)) return;
        break;
      case 2: {  // length-delimited
        uint32_t length = 0;
        if (!input.ReadVarint32(&length)) return;
        const size_t at = static_cast<size_t>(input.CurrentPosition());
        if (length > in.size() - at) return;
        bytes = in.substr(at, length);
        if (!input.Skip(static_cast<int>(length))) return;
        break;
      }
      default:
        return;
    }
    each(number, type, bytes, value);
  }
}

uint64_t EndpointIdsBound(absl::string_view endpoint) {
  uint64_t ids = 0;
  ForEachField(endpoint, [&](uint32_t number, uint32_t type, absl::string_view bytes, uint64_t) {
    if (number == kBlockIds) {
      ids += type == 2 ? bytes.size() : 1;  // packed: at least a byte an id; else one id
    } else if (number == kBlockIdsLe32 && type == 2) {
      ids += bytes.size() / 4;
    } else if (number == kBlockTable && type == 2) {
      ForEachField(bytes, [&](uint32_t n, uint32_t t, absl::string_view, uint64_t v) {
        if (n == kTableCount && t == 0) ids += static_cast<uint32_t>(v);
      });
    }
  });
  return ids;
}

pid_t ThisThread() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// Puts the calling thread in SCHED_IDLE (the policy is per thread on Linux: pid 0 is the
// caller). Any thread may enter it; leaving needs RLIMIT_NICE's leave (none for an unprivileged
// daemon), so it is done once, for the thread's life. Should the kernel refuse, the thread's
// nice value goes to 19 instead (the nearest a thread can get), and failing that it keeps its
// priority: its tasks still run, only not in the background.
void ToBackground() {
  sched_param param{};
  if (::sched_setscheduler(0, AdmissionPool::kBulkPolicy, &param) == 0) return;
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(ThisThread()), 19);
}

}  // namespace

bool CanLeaveBackground() {
  bool can = false;
  std::thread probe([&can] {
    sched_param param{};
    if (::sched_setscheduler(0, SCHED_IDLE, &param) != 0) return;
    can = ::sched_setscheduler(0, SCHED_OTHER, &param) == 0;
  });
  probe.join();
  return can;
}

BulkPlan PlanBulkWorkers(size_t configured, absl::Duration deadline, bool can_leave) {
  BulkPlan plan;
  if (configured == 0 || deadline <= absl::ZeroDuration() || can_leave) {
    plan.workers = configured;
    return plan;
  }
  plan.why = absl::StrCat(
      "session_admission_bulk_workers: ", configured,
      " not started: the bulk class's guard (session_admission_bulk_deadline_ms: ",
      absl::ToInt64Milliseconds(deadline),
      ") must lift a thread out of SCHED_IDLE, which this process may not do (no CAP_SYS_NICE, "
      "RLIMIT_NICE below 20); large SUBMITs are admitted at normal priority. Grant it "
      "(systemd: LimitNICE=+0; a container: --cap-add SYS_NICE), or set "
      "session_admission_bulk_deadline_ms: 0 to run the class unguarded");
  return plan;
}

bool AdmitsInline(const v1::TransferSpec& spec, uint64_t max_ids) {
  if (max_ids == 0 || spec.src().has_block_table() || spec.dst().has_block_table()) return false;
  uint64_t ids = 0;
  for (const v1::TransferEndpoint* side : {&spec.src(), &spec.dst()}) {
    ids += static_cast<uint64_t>(side->block_ids_size()) + side->block_ids_le32().size() / 4;
  }
  return ids <= max_ids;
}

uint64_t SubmitIdsBound(absl::string_view serialized) {
  uint64_t ids = 0;
  ForEachField(serialized, [&](uint32_t number, uint32_t type, absl::string_view spec, uint64_t) {
    if (number != kRequestSpec || type != 2) return;
    ForEachField(spec, [&](uint32_t n, uint32_t t, absl::string_view endpoint, uint64_t) {
      if ((n == kSpecSrc || n == kSpecDst) && t == 2) ids += EndpointIdsBound(endpoint);
    });
  });
  return ids;
}

uint64_t PostIdsBound(absl::string_view serialized) {
  uint64_t ids = 0;
  ForEachField(serialized, [&](uint32_t number, uint32_t type, absl::string_view bytes, uint64_t) {
    for (uint32_t field : kPostIds) {
      if (number == field) ids += type == 2 ? bytes.size() : 1;
    }
    for (uint32_t field : kPostIdsLe32) {
      if (number == field && type == 2) ids += bytes.size() / 4;
    }
  });
  return ids;
}

TaskClass ClassOfIds(uint64_t ids) {
  return ids > kBulkIds ? TaskClass::kBulk : TaskClass::kOrdinary;
}

AdmissionPool::AdmissionPool(size_t workers, size_t max_queued, size_t bulk_workers,
                             absl::Duration bulk_deadline)
    : max_queued_(max_queued), has_bulk_(bulk_workers > 0), bulk_deadline_(bulk_deadline) {
  {
    absl::MutexLock lock(&mu_);
    bulk_slots_.resize(bulk_workers);
  }
  workers_.reserve(workers + bulk_workers + 1);
  for (size_t i = 0; i < workers; ++i) {
    workers_.emplace_back([this] { Work(TaskClass::kOrdinary, 0); });
  }
  for (size_t i = 0; i < bulk_workers; ++i) {
    workers_.emplace_back([this, i] {
      ToBackground();
      {
        absl::MutexLock lock(&mu_);
        bulk_slots_[i].tid = ThisThread();
      }
      Work(TaskClass::kBulk, i);
    });
  }
  if (bulk_workers > 0 && bulk_deadline_ > absl::ZeroDuration()) {
    workers_.emplace_back([this] { Guard(); });
  }
}

AdmissionPool::~AdmissionPool() {
  std::deque<Task> dropped;  // destroyed outside the lock
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (auto& [id, queue] : queues_) {
      for (Pending& pending : queue.tasks) dropped.push_back(std::move(pending.task));
      queue.tasks.clear();
    }
    queued_ = 0;
    for (std::deque<uint64_t>& ready : ready_) ready.clear();
  }
  for (std::thread& worker : workers_) worker.join();
}

void AdmissionPool::Open(uint64_t id) {
  absl::MutexLock lock(&mu_);
  queues_[id] = Queue();
}

absl::Status AdmissionPool::Post(uint64_t id, Task task, TaskClass task_class) {
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(id);
  if (it == queues_.end() || it->second.closed || stop_) {
    return absl::FailedPreconditionError(absl::StrCat("session ", id, " is closed"));
  }
  Queue& queue = it->second;
  if (queue.tasks.size() >= max_queued_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "admission queue: this session has ", queue.tasks.size(),
        " packets queued for admission behind a SUBMIT, the most allowed; wait for their "
        "answers before sending more"));
  }
  const bool first = queue.tasks.empty() && !queue.running;
  queue.tasks.push_back({std::move(task), has_bulk_ ? task_class : TaskClass::kOrdinary});
  ++queued_;
  // A session is ready when it has tasks and none runs: the first task makes it so.
  if (first) MakeReady(id, queue);
  return absl::OkStatus();
}

bool AdmissionPool::Idle(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(id);
  return it == queues_.end() || (it->second.tasks.empty() && !it->second.running);
}

size_t AdmissionPool::Close(uint64_t id, std::function<void()> then) {
  std::deque<Pending> dropped;  // destroyed outside the lock (they own descriptors, connections)
  bool now = true;
  {
    absl::MutexLock lock(&mu_);
    auto it = queues_.find(id);
    if (it != queues_.end()) {
      Queue& queue = it->second;
      dropped.swap(queue.tasks);
      queued_ -= dropped.size();
      // A session in a ready list with no tasks left is skipped by the worker that meets it.
      if (queue.running) {
        queue.closed = true;
        queue.then = std::move(then);
        now = false;
      } else {
        queues_.erase(it);
      }
    }
  }
  if (now && then) then();
  return dropped.size();
}

void AdmissionPool::AwaitIdle() const {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &AdmissionPool::NothingLeft));
}

size_t AdmissionPool::queued() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}

size_t AdmissionPool::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

uint64_t AdmissionPool::promoted() const {
  absl::MutexLock lock(&mu_);
  return promoted_;
}

size_t AdmissionPool::deepest() const {
  absl::MutexLock lock(&mu_);
  size_t most = 0;
  for (const auto& [id, queue] : queues_) most = std::max(most, queue.tasks.size());
  return most;
}

bool AdmissionPool::HasOrdinaryWork() const {
  return stop_ || !ready_[static_cast<int>(TaskClass::kOrdinary)].empty();
}

bool AdmissionPool::HasBulkWork() const {
  return stop_ || !ready_[static_cast<int>(TaskClass::kBulk)].empty();
}

void AdmissionPool::MakeReady(uint64_t id, const Queue& queue) {
  ready_[static_cast<int>(queue.tasks.front().task_class)].push_back(id);
}

bool AdmissionPool::NothingLeft() const { return queued_ == 0 && running_ == 0; }

bool AdmissionPool::GuardHasNews() const { return stop_ || bulk_started_ != guard_seen_; }

void AdmissionPool::Guard() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    guard_seen_ = bulk_started_;
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    for (BulkSlot& slot : bulk_slots_) {
      if (!slot.running || slot.promoted) continue;
      const absl::Time due = slot.started + bulk_deadline_;
      if (due > now) {
        next = std::min(next, due);
        continue;
      }
      // Under mu_ while the task runs: the worker returns to SCHED_IDLE only after it has
      // marked the task ended, so a lift never outlives its task. Marked even when refused
      // (a policy or limit changed since the probe): it is not retried every round.
      sched_param param{};
      slot.promoted = true;
      if (::sched_setscheduler(slot.tid, SCHED_OTHER, &param) == 0) ++promoted_;
    }
    mu_.AwaitWithDeadline(absl::Condition(this, &AdmissionPool::GuardHasNews), next);
  }
}

void AdmissionPool::Work(TaskClass worker_class, size_t slot) {
  const absl::Condition has_work(this, worker_class == TaskClass::kBulk
                                           ? &AdmissionPool::HasBulkWork
                                           : &AdmissionPool::HasOrdinaryWork);
  const int mine = static_cast<int>(worker_class);
  for (;;) {
    uint64_t id = 0;
    Task task;
    {
      absl::MutexLock lock(&mu_);
      // Waits for a session whose next task is of this worker's class; a session met with none
      // left (closed, or stopped), one running, or one whose next task is of the other class
      // (a stale entry: it sits in that class's list too) is passed over.
      for (;;) {
        mu_.Await(has_work);
        if (stop_) return;
        id = ready_[mine].front();
        ready_[mine].pop_front();
        auto it = queues_.find(id);
        if (it == queues_.end() || it->second.tasks.empty() || it->second.running ||
            it->second.tasks.front().task_class != worker_class) {
          continue;
        }
        task = std::move(it->second.tasks.front().task);
        it->second.tasks.pop_front();
        it->second.running = true;
        --queued_;
        ++running_;
        if (worker_class == TaskClass::kBulk) {
          BulkSlot& mine_slot = bulk_slots_[slot];
          mine_slot.running = true;
          mine_slot.promoted = false;
          mine_slot.started = absl::Now();
          ++bulk_started_;
        }
        break;
      }
    }
    std::move(task)();
    task = nullptr;  // what it owned goes before the session's next task may run
    std::function<void()> then;
    bool lifted = false;
    {
      absl::MutexLock lock(&mu_);
      if (worker_class == TaskClass::kBulk) {
        bulk_slots_[slot].running = false;
        lifted = bulk_slots_[slot].promoted;
      }
      auto it = queues_.find(id);
      if (it != queues_.end()) {
        Queue& queue = it->second;
        queue.running = false;
        if (queue.closed) {
          then = std::move(queue.then);
          queues_.erase(it);
        } else if (!queue.tasks.empty()) {
          MakeReady(id, queue);  // its next task after the other sessions' turns
        }
      }
      if (!then) --running_;
    }
    if (lifted) ToBackground();  // the next bulk task starts in the background again
    if (then) {
      then();  // counted as running until it returns (AwaitIdle waits for it too)
      absl::MutexLock lock(&mu_);
      --running_;
    }
  }
}

}  // namespace kvrail::session

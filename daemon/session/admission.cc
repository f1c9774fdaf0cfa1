#include "daemon/session/admission.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvrail::session {

bool AdmitsInline(const v1::TransferSpec& spec, uint64_t max_ids) {
  if (max_ids == 0 || spec.src().has_block_table() || spec.dst().has_block_table()) return false;
  uint64_t ids = 0;
  for (const v1::TransferEndpoint* side : {&spec.src(), &spec.dst()}) {
    ids += static_cast<uint64_t>(side->block_ids_size()) + side->block_ids_le32().size() / 4;
  }
  return ids <= max_ids;
}

AdmissionPool::AdmissionPool(size_t workers, size_t max_queued) : max_queued_(max_queued) {
  workers_.reserve(workers);
  for (size_t i = 0; i < workers; ++i) workers_.emplace_back([this] { Work(); });
}

AdmissionPool::~AdmissionPool() {
  std::deque<Task> dropped;  // destroyed outside the lock
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (auto& [id, queue] : queues_) {
      for (Task& task : queue.tasks) dropped.push_back(std::move(task));
      queue.tasks.clear();
    }
    queued_ = 0;
    ready_.clear();
  }
  for (std::thread& worker : workers_) worker.join();
}

void AdmissionPool::Open(uint64_t id) {
  absl::MutexLock lock(&mu_);
  queues_[id] = Queue();
}

absl::Status AdmissionPool::Post(uint64_t id, Task task) {
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
  // A session is in ready_ when it has tasks and none runs: the first task makes it so.
  if (queue.tasks.empty() && !queue.running) ready_.push_back(id);
  queue.tasks.push_back(std::move(task));
  ++queued_;
  return absl::OkStatus();
}

bool AdmissionPool::Idle(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(id);
  return it == queues_.end() || (it->second.tasks.empty() && !it->second.running);
}

size_t AdmissionPool::Close(uint64_t id, std::function<void()> then) {
  std::deque<Task> dropped;  // destroyed outside the lock (they own descriptors, connections)
  bool now = true;
  {
    absl::MutexLock lock(&mu_);
    auto it = queues_.find(id);
    if (it != queues_.end()) {
      Queue& queue = it->second;
      dropped.swap(queue.tasks);
      queued_ -= dropped.size();
      // A session in ready_ with no tasks left is skipped by the worker that meets it.
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

size_t AdmissionPool::deepest() const {
  absl::MutexLock lock(&mu_);
  size_t most = 0;
  for (const auto& [id, queue] : queues_) most = std::max(most, queue.tasks.size());
  return most;
}

bool AdmissionPool::HasWork() const { return stop_ || !ready_.empty(); }

bool AdmissionPool::NothingLeft() const { return queued_ == 0 && running_ == 0; }

void AdmissionPool::Work() {
  for (;;) {
    uint64_t id = 0;
    Task task;
    {
      absl::MutexLock lock(&mu_);
      // Waits for a session with a task to run; a session met with none left (closed, or
      // stopped) is passed over.
      for (;;) {
        mu_.Await(absl::Condition(this, &AdmissionPool::HasWork));
        if (stop_) return;
        id = ready_.front();
        ready_.pop_front();
        auto it = queues_.find(id);
        if (it == queues_.end() || it->second.tasks.empty() || it->second.running) continue;
        task = std::move(it->second.tasks.front());
        it->second.tasks.pop_front();
        it->second.running = true;
        --queued_;
        ++running_;
        break;
      }
    }
    std::move(task)();
    task = nullptr;  // what it owned goes before the session's next task may run
    std::function<void()> then;
    {
      absl::MutexLock lock(&mu_);
      auto it = queues_.find(id);
      if (it != queues_.end()) {
        Queue& queue = it->second;
        queue.running = false;
        if (queue.closed) {
          then = std::move(queue.then);
          queues_.erase(it);
        } else if (!queue.tasks.empty()) {
          ready_.push_back(id);  // its next task after the other sessions' turns
        }
      }
      if (!then) --running_;
    }
    if (then) {
      then();  // counted as running until it returns (AwaitIdle waits for it too)
      absl::MutexLock lock(&mu_);
      --running_;
    }
  }
}

}  // namespace kvrail::session

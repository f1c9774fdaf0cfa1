#include "daemon/engine/cuda/gpu_gate.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/dcheck.h"
#include "base/status.h"

namespace kvrail::engine::cuda_detail {

GpuGate::GpuGate(GpuOps* ops, const Clock* clock, GateOptions options)
    : ops_(ops),
      clock_(clock),
      options_(std::move(options)),
      slots_(options_.max_jobs, options_.queue_limit) {
  Beat();
}

GpuGate::~GpuGate() {
  {
    absl::MutexLock lock(&mu_);
    watch_stop_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  // The page stays for the process's life: a stream still parked on one of its words must
  // never see it freed (freeing pinned memory would also wait for that stream).
  absl::MutexLock lock(&mu_);
  (void)page_.release();
}

absl::Status GpuGate::Make() {
  std::vector<Pair> pairs;
  for (int i = 0; i < options_.max_jobs; ++i) {
    Pair p;
    KVRAIL_ASSIGN_OR_RETURN(p.copy, ops_->CreateStream());
    KVRAIL_ASSIGN_OR_RETURN(p.abort, ops_->CreateStream());
    pairs.push_back(std::move(p));
  }
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<HostMemory> page,
                          ops_->AllocHost(8 * kGateWordPairs, /*mapped=*/true));
  absl::MutexLock lock(&mu_);
  pairs_ = std::move(pairs);
  for (int i = 0; i < static_cast<int>(pairs_.size()); ++i) free_pairs_.push_back(i);
  for (int i = 0; i < kGateWordPairs; ++i) free_slots_.push_back(i);
  page_ = std::move(page);
  return absl::OkStatus();
}

void GpuGate::Start() {
  watchdog_ = std::thread([this] {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(&watch_stop_), kGateWatchTick);
        if (watch_stop_) return;
      }
      WatchOnce();
    }
  });
}

bool GpuGate::ready() const {
  absl::MutexLock lock(&mu_);
  return page_ != nullptr && ops_->WordOpsAvailable();
}

uint64_t GpuGate::releases() const {
  absl::MutexLock lock(&mu_);
  return releases_;
}

bool GpuGate::Admit(const std::shared_ptr<Job>& job, Job::ReadyGate gate,
                    scheduler::GateInputs in) {
  in.enabled = true;
  in.ready = ready();
  absl::MutexLock lock(&mu_);
  const scheduler::GateChoice choice = slots_.Admit(job.get(), in);
  last_choice_ = choice.reason;
  if (choice.stream_wait) admitted_[job.get()] = AdmittedGate{job, std::move(gate)};
  if (!choice.stream_wait) job->OnEngineNote(choice.reason);
  return choice.stream_wait;
}

std::optional<Job::ReadyGate> GpuGate::Admitted(const Job* job) const {
  absl::MutexLock lock(&mu_);
  auto it = admitted_.find(job);
  if (it == admitted_.end()) return std::nullopt;
  return it->second.gate;
}

bool GpuGate::IsAdmitted(const Job* job) const {
  absl::MutexLock lock(&mu_);
  return admitted_.count(job) > 0;
}

void GpuGate::Forget(const Job* job) {
  absl::MutexLock lock(&mu_);
  auto it = admitted_.find(job);
  if (it == admitted_.end()) return;
  slots_.Release(job);
  // Its flag words' reference goes at Reap, outside every lock (Forget runs under the
  // dispatcher's queue lock).
  forgotten_.push_back(std::move(it->second));
  admitted_.erase(it);
}

void GpuGate::SweepAdmitted() {
  // Entries of jobs gone are dropped after the lock (their flag words' references with them).
  std::vector<AdmittedGate> gone;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = admitted_.begin(); it != admitted_.end();) {
      if (it->second.job.expired()) {  // admitted, never started (its transfer ended first)
        slots_.Release(it->first);
        gone.push_back(std::move(it->second));
        it = admitted_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

absl::Status GpuGate::Arm(GateLease& lease, const std::shared_ptr<Job>& job,
                          const Job::ReadyGate& gate, GpuPlan& plan) {
  auto c = std::make_shared<GateControl>();
  c->job = job;
  c->gate = gate;
  GpuStream* abort_stream = nullptr;
  uint64_t abort_device = 0;
  {
    absl::MutexLock lock(&mu_);
    if (free_pairs_.empty()) {
      return absl::ResourceExhaustedError(absl::StrCat(gate.field, ": no stream pair free on GPU",
                                                       ops_->device(), " for the GPU stream wait (",
                                                       pairs_.size(), " made at start)"));
    }
    lease.pair = free_pairs_.front();
    free_pairs_.pop_front();
    lease.stream = pairs_[lease.pair].copy.get();
    abort_stream = pairs_[lease.pair].abort.get();
    if (free_slots_.empty() || page_ == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(gate.field, ": no abort word free on GPU",
                                                       ops_->device(), " for the GPU stream wait"));
    }
    c->slot = free_slots_.front();
    free_slots_.pop_front();
    c->epoch = ++epoch_;
    if (c->epoch == 0) c->epoch = ++epoch_;
    c->abort_word = static_cast<uint32_t*>(page_->host()) + 2 * c->slot;
    abort_device = page_->device() + 8ull * c->slot;
  }
  c->done_word = c->abort_word + 1;
  lease.control = c;  // the slot goes back with it (Retire), armed or not
  // The job's batches and its abort stream start after the plan's upload.
  KVRAIL_ASSIGN_OR_RETURN(lease.uploaded, ops_->CreateEvent());
  KVRAIL_RETURN_IF_ERROR(ops_->Record(*lease.uploaded, ops_->main_stream()));
  KVRAIL_RETURN_IF_ERROR(ops_->StreamWaitEvent(*lease.stream, *lease.uploaded));
  KVRAIL_ASSIGN_OR_RETURN(lease.abort_done, ops_->CreateEvent());
  KVRAIL_RETURN_IF_ERROR(ops_->StreamWaitEvent(*abort_stream, *lease.uploaded));
  absl::Status waits = ops_->WaitWord(*abort_stream, abort_device, c->epoch);
  if (!waits.ok()) {
    return absl::Status(waits.code(), absl::StrCat(gate.field, ": arming the abort stream on GPU",
                                                   ops_->device(), ": ", waits.message()));
  }
  // From here on the abort stream waits: any failure below lets it pass at once (its tile count
  // zeroing is harmless for a job whose set-up failed: none of its kernels runs).
  absl::Status armed = [&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(ops_->DisarmPlan(plan, *abort_stream));
    KVRAIL_RETURN_IF_ERROR(ops_->WriteWord(*abort_stream, abort_device + 4, c->epoch));
    return ops_->Record(*lease.abort_done, *abort_stream);
  }();
  if (!armed.ok()) {
    __atomic_store_n(c->abort_word, c->epoch, __ATOMIC_RELEASE);
    return absl::Status(armed.code(), absl::StrCat(gate.field, ": arming the abort stream on GPU",
                                                   ops_->device(), ": ", armed.message()));
  }
  c->armed.store(true, std::memory_order_release);
  absl::MutexLock lock(&mu_);
  controls_.push_back(std::move(c));
  return absl::OkStatus();
}

void GpuGate::Retire(GateLease& lease) {
  // The stream pair goes back first (a set-up that failed before arming holds one too); its
  // streams are idle or pass at once: every gated batch of the job completed, and the abort
  // stream's wait passes at the abort word stored below (or at arming's failure).
  if (lease.control != nullptr) {
    GateControl& c = *lease.control;
    {
      absl::MutexLock lock(&c.mu);
      c.FireLocked();
      c.retired = true;
    }
    if (lease.abort_done != nullptr && c.armed.load(std::memory_order_acquire)) {
      (void)ops_->StreamWaitEvent(ops_->main_stream(), *lease.abort_done);
    }
  }
  absl::MutexLock lock(&mu_);
  if (lease.pair >= 0) {
    free_pairs_.push_back(lease.pair);
    lease.pair = -1;
    lease.stream = nullptr;
  }
  if (lease.control == nullptr) return;
  controls_.erase(std::remove(controls_.begin(), controls_.end(), lease.control), controls_.end());
  if (lease.control->slot >= 0) free_slots_.push_back(lease.control->slot);
  retired_.push_back(std::move(lease.control));
}

void GpuGate::Reap() {
  std::vector<std::shared_ptr<GateControl>> last;
  std::vector<AdmittedGate> forgotten;
  {
    absl::MutexLock lock(&mu_);
    forgotten.swap(forgotten_);
    // A retired control is in no watched list, so no new reference to it appears: one whose
    // count is 1 is held here alone.
    for (auto it = retired_.begin(); it != retired_.end();) {
      if (it->use_count() == 1) {
        last.push_back(std::move(*it));
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // `last` and `forgotten` go here, outside every lock, on the dispatcher thread.
}

void GpuGate::WatchOnce() {
  std::vector<std::shared_ptr<GateControl>> controls;
  {
    absl::MutexLock lock(&mu_);
    controls = controls_;
  }
  if (controls.empty()) return;
  const absl::Time now = clock_->Now();
  const std::optional<std::pair<absl::Duration, std::string>> sync =
      options_.blocked_sync ? options_.blocked_sync(now) : std::nullopt;
  const absl::Duration silent = now - absl::FromUnixNanos(beat_ns_.load(std::memory_order_relaxed));
  for (const auto& c : controls) WatchOne(*c, now, sync, silent);
}

void GpuGate::WatchOne(GateControl& c, absl::Time now,
                       const std::optional<std::pair<absl::Duration, std::string>>& sync,
                       absl::Duration silent) {
  {
    absl::MutexLock lock(&c.mu);
    if (c.released || c.retired) return;
  }
  scheduler::GateWatchInputs in;
  absl::Status ended;
  if (stopping_.load()) {
    ended = absl::UnavailableError("the daemon's CUDA engine stopped");
    in.producer_gone = true;
  } else {
    bool gone = false;
    ended = c.job->ended(&gone);
    in.producer_gone = gone;
  }
  in.ended = !ended.ok();
  if (in.ended) {
    absl::MutexLock lock(&c.mu);
    if (!c.ended_seen.has_value()) c.ended_seen = now;
    in.since_end = now - *c.ended_seen;
  }
  in.grace = kGateReleaseGrace;
  // Launches mark the layers of their own plan, so never past the gate's words; the clamp keeps
  // a release build within them if that breaks.
  const uint32_t launched_end = c.launched_end.load();
  KVRAIL_DCHECK(launched_end <= c.gate.count, "gate: waits launched past the gate's layer words");
  const uint32_t launched = std::min(launched_end, c.gate.count);
  for (uint32_t i = 0; i < launched && !in.waits_pending; ++i) {
    in.waits_pending =
        !Reached(__atomic_load_n(&c.gate.host_words[i], __ATOMIC_ACQUIRE), c.gate.value);
  }
  if (sync.has_value()) {
    in.sync_blocked_for = sync->first;
    in.sync_what = sync->second;
  }
  in.dispatcher_silent_for = silent;
  in.bound = absl::Milliseconds(options_.sync_bound_ms);
  const scheduler::GateReleaseDecision decision = scheduler::DecideGateRelease(in);
  if (!decision.release()) return;
  const absl::Status why =
      decision.cause == scheduler::GateReleaseCause::kEnded ? ended : decision.why;
  uint32_t raised = 0;
  if (!Release(c, why, &raised)) return;  // the disarm did not show yet: next tick
  {
    absl::MutexLock lock(&mu_);
    ++releases_;
    if (decision.cause != scheduler::GateReleaseCause::kEnded) ++bound_releases_;
  }
  spdlog::warn(
      "cuda:{} a gated job's waits released by the daemon ({} of its {} ready words "
      "({}) raised): {}",
      ops_->device(), raised, c.gate.count, c.gate.field, why.ToString());
}

bool GpuGate::Release(GateControl& c, const absl::Status& why, uint32_t* raised) {
  absl::MutexLock lock(&c.mu);
  if (c.released) return true;
  if (!c.aborted) {
    c.aborted = true;
    c.end = why;
  }
  if (c.armed.load(std::memory_order_acquire)) {
    c.FireLocked();
    // The disarm shows in the done word; until then the producer's words stay as they are (a
    // raised word would let a still-armed kernel copy). The next tick looks again: nothing here
    // waits, so no lock is held while the GPU works.
    if (!Reached(__atomic_load_n(c.done_word, __ATOMIC_ACQUIRE), c.epoch)) return false;
    for (uint32_t i = 0; i < c.gate.count; ++i) {
      uint32_t* word = &c.gate.host_words[i];
      uint32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
      while (std::optional<uint32_t> store = scheduler::ReleaseStore(seen, c.gate.value)) {
        if (__atomic_compare_exchange_n(word, &seen, *store, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
          ++*raised;
          break;
        }
      }
    }
  }
  // Not armed: its set-up has not finished, so nothing of it waits on the GPU (and the launch
  // sees `aborted` before it enqueues a wait).
  c.released = true;
  return true;
}

std::string GpuGate::Text() const {
  if (!options_.enabled) return "";
  absl::MutexLock lock(&mu_);
  return absl::StrCat(
      "; stream wait: ", slots_.held(), " of ", options_.max_jobs, " jobs waiting on the GPU",
      options_.queue_limit.empty() ? std::string() : absl::StrCat(" (", options_.queue_limit, ")"),
      ", ", releases_, " released by the daemon (", bound_releases_,
      " for a call blocked behind a wait, bound ", options_.sync_bound_ms,
      " ms); last choice: ", last_choice_.empty() ? "none" : last_choice_);
}

}  // namespace kvrail::engine::cuda_detail

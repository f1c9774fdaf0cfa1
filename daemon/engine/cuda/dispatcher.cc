// Dispatcher: the loop, job set-up and the sweep (see dispatcher.h).
#include "daemon/engine/cuda/dispatcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/spin_pause.h"
#include "base/status.h"
#include "kernels/plan_image.h"

namespace kvrail::engine::cuda_detail {

Dispatcher::Dispatcher(GpuOps* ops, const Clock* clock, const CudaEngineOptions& options,
                       int critical_ctas, DispatchQueues* queues, GpuGate* gate, WorkerStats* stats)
    : ops_(ops),
      clock_(clock),
      options_(options),
      critical_ctas_(critical_ctas),
      queues_(queues),
      gate_(gate),
      stats_(stats),
      stager_(ops),
      warm_(ops,
            options.warm_plans
                ? WarmPlans::Limits{static_cast<size_t>(std::max(0, options.warm_plan_entries)),
                                    static_cast<size_t>(options.warm_plan_bytes)}
                : WarmPlans::Limits{}),
      tuners_(options),
      idle_budget_(options.dispatcher_spin_budget, kIdleSpinBudgetWindow, clock->Now()),
      wake_(options.wake) {}

Dispatcher::~Dispatcher() {
  for (auto& entry : states_) Drop(std::move(entry.second));
  states_.clear();
  warm_.Clear();
  gate_->Reap();
}

void Dispatcher::Serve() {
  if (options_.predictive_wake) {
    // The timed sleep before a predicted job must not end 50 us late (the default timer slack):
    // that would spend the plan's margin.
    if (absl::Status slack = SetThreadTimerSlack(absl::Microseconds(1)); !slack.ok()) {
      spdlog::warn("cuda dispatcher: predictive wake keeps the default timer slack: {}",
                   slack.ToString());
    }
  }
  while (Turn(/*block=*/true)) {
  }
  Finish();
}

bool Dispatcher::Turn(bool block) {
  gate_->Beat();
  if (block && in_flight_.empty() && gated_pending_ == 0 && options_.dispatcher_spin_us > 0) {
    SpinForWork();
  }
  if (in_flight_.empty()) {
    Sweep();
    if (block) {
      // Gated batches complete on their own streams: every kGateWordPoll the dispatcher looks
      // whether a producer's word has come (PollGated).
      std::optional<absl::Duration> timeout;
      if (gated_pending_ > 0) {
        timeout = kGateWordPoll;
      } else if (options_.predictive_wake && !AwaitPredicted()) {
        return false;
      }
      if (!queues_->AwaitWork(timeout)) return false;
    } else if (queues_->stopped()) {
      return false;
    }
  }
  std::optional<Taken> next;
  if (in_flight_.size() < kMaxInFlight) {
    next = queues_->Take([this](const Job& j) { return gate_->IsAdmitted(&j); },
                         [this](const Job& j) -> uint64_t {
                           const auto it = states_.find(&j);
                           return it == states_.end() ? 0 : it->second->progress.last_batch_bytes;
                         });
  }
  if (next.has_value()) {
    // The job's arrival: its enqueue (a batch of a job already running counts as it).
    if (options_.predictive_wake) wake_.Arrived(clock_->Now() - next->since_enqueue);
    JobState& state = StateFor(next->job);
    Batch b = Launch(state, *next);
    if (state.gate.has_value()) {
      state.gated.push_back(std::move(b));
      ++gated_pending_;
    } else {
      in_flight_.push_back(std::move(b));
    }
  }
  if (gated_pending_ > 0) PollGated();
  if (!in_flight_.empty() && (!next.has_value() || in_flight_.size() >= kMaxInFlight)) {
    JobState* done = in_flight_.front().state;
    Complete(in_flight_.front());
    in_flight_.pop_front();
    // A job that has ended gives back its plan buffer and pinned tables now, not when the GPU
    // next goes idle: under steady load that may be never, and every new plan would pin fresh
    // table memory.
    DropIfFinished(done);
  }
  return true;
}

void Dispatcher::Finish() {
  // Stopping with gated copies still waiting (their jobs not ended, e.g. the engine destroyed
  // without a drain): the watchdog releases them as for a gone producer, so no stream of the
  // daemon stays blocked on a word nobody will write; bounded (real time: the process stops).
  gate_->Stopping();
  const absl::Time give_up = absl::Now() + absl::Seconds(2);
  while (gated_pending_ > 0 && absl::Now() < give_up) {
    gate_->Beat();
    PollGated();
    if (gated_pending_ > 0) absl::SleepFor(absl::Microseconds(100));
  }
  // No abort stream stays blocked on its word once the engine is gone.
  for (auto& entry : states_) gate_->Retire(entry.second->lease);
  gate_->Reap();
}

void Dispatcher::Sweep() {
  gate_->SweepAdmitted();
  if (states_.empty()) return;
  std::vector<const Job*> jobs;
  jobs.reserve(states_.size());
  for (const auto& entry : states_) jobs.push_back(entry.first);
  const std::vector<const Job*> idle = queues_->SelectIdle(jobs, [this](const Job* j) {
    const JobState& s = *states_.at(j);
    if (s.in_flight > 0 || s.job->MayGetMoreTiles()) return false;
    gate_->Forget(j);
    return true;
  });
  for (const Job* j : idle) {
    auto it = states_.find(j);
    std::unique_ptr<JobState> state = std::move(it->second);
    states_.erase(it);
    Drop(std::move(state));
  }
  stats_->HeldStates(states_.size());
}

void Dispatcher::DropIfFinished(JobState* s) {
  const Job* job = s->job.get();
  const std::vector<const Job*> idle = queues_->SelectIdle({job}, [&](const Job*) {
    if (s->in_flight > 0 || s->job->MayGetMoreTiles()) return false;
    gate_->Forget(job);
    return true;
  });
  if (!idle.empty()) {
    auto it = states_.find(job);
    std::unique_ptr<JobState> state = std::move(it->second);
    states_.erase(it);
    Drop(std::move(state));
  }
  stats_->HeldStates(states_.size());
}

void Dispatcher::Drop(std::unique_ptr<JobState> state) {
  if (state == nullptr) return;
  // The abort stream fires and the main stream waits for it before the plan's stream-ordered
  // free; pinned tables go once their upload has passed. No lock is held here: the state's
  // references (the job, its regions, its flag words) go last, on this thread.
  gate_->Retire(state->lease);
  if (state->uploaded != nullptr && state->src_tables != nullptr) {
    bool sticky = false;
    (void)ops_->Wait(*state->uploaded, &sticky);
  }
  // Every batch of the job has completed (or its streams were waited for): its plan buffer is
  // kept for the next job of its shape, behind an event after everything enqueued so far.
  if (state->warm.has_value() && state->plan != nullptr && stats_->broken().ok()) {
    warm_.Give(*std::move(state->warm), std::move(state->plan));
    stats_->WarmPlansKept(warm_.entries(), warm_.bytes());
  }
  state.reset();
  gate_->Reap();
}

scheduler::ModeInputs Dispatcher::ModeInputsFor(const Job& job, bool peer_unreachable) const {
  scheduler::ModeInputs in;
  in.max_ctas = options_.max_ctas;
  in.mean_run_bytes = scheduler::MeanRunBytes(job.plan());
  in.copy_engine_min_run = options_.copy_engine_min_run_bytes;
  in.peer_unreachable = peer_unreachable;
  in.copy_only_kernel_ctas = options_.copy_only_kernel_ctas;
  in.copy_only_kernel_below_run = options_.copy_only_kernel_below_run_bytes;
  return in;
}

JobState& Dispatcher::StateFor(const std::shared_ptr<Job>& job) {
  auto it = states_.find(job.get());
  if (it != states_.end()) return *it->second;
  auto state = std::make_unique<JobState>();
  state->job = job;
  const absl::Time t0 = clock_->Now();
  if (stats_->first_job_pending()) stats_->FirstSetUpAt(t0);
  state->setup = stats_->broken().ok() ? SetUp(*state) : stats_->broken();
  // Formatted only when asked for (Describe): this runs once per job on the dispatcher.
  stats_->SetUp(SetUpSample{clock_->Now() - t0,
                            4 * (job->plan().src_blocks().size() + job->plan().dst_blocks().size()),
                            job->plan().src_blocks().pinned()});
  JobState& ref = *state;
  states_.emplace(job.get(), std::move(state));
  stats_->HeldStates(states_.size());
  return ref;
}

absl::Status Dispatcher::SetUp(JobState& s) {
  const Job& job = *s.job;
  const int device = ops_->device();
  DeviceSides* const sides = job.device_sides();
  if (sides == nullptr) {
    return absl::FailedPreconditionError(
        "the job has no device sides (host memory only): the CUDA engine cannot run it");
  }
  const Placement src = sides->src(), dst = sides->dst();
  const absl::Time t0 = clock_->Now();
  KVRAIL_ASSIGN_OR_RETURN(s.src, sides->DeviceAddress(Job::Side::kSrc, device));
  KVRAIL_ASSIGN_OR_RETURN(s.dst, sides->DeviceAddress(Job::Side::kDst, device));
  s.progress.setup_addresses = clock_->Now() - t0;
  if (job.plan().src_per_layer() || job.plan().dst_per_layer()) {
    KVRAIL_ASSIGN_OR_RETURN(auto src_layers, sides->DeviceLayerBases(Job::Side::kSrc, device));
    KVRAIL_ASSIGN_OR_RETURN(auto dst_layers, sides->DeviceLayerBases(Job::Side::kDst, device));
    s.device_plan = job.plan().WithLayerBases(std::move(src_layers), std::move(dst_layers));
    // Run offsets of a per-layer side are whole addresses (kernels::SideBase is 0).
    if (job.plan().src_per_layer()) s.src = nullptr;
    if (job.plan().dst_per_layer()) s.dst = nullptr;
  }
  bool peer_unreachable = false;
  if (src.cuda && dst.cuda && src.device != dst.device) {
    const int other = src.device == device ? dst.device : src.device;
    peer_unreachable = !ops_->EnablePeerAccess(other).ok();
  }
  scheduler::ModeInputs in = ModeInputsFor(job, peer_unreachable);
  // Copy-engine runs between two GPUs cost what the warm-up measured for the pair; same-GPU
  // plans their own measured cost; host sides the default.
  if (src.cuda && dst.cuda) {
    const int other = src.device == device ? dst.device : src.device;
    if (tuners_.copy_costs().measured(device, other)) {
      in.copy_engine_seconds_per_run = tuners_.copy_costs().SecondsPerRun(device, other);
    }
  }
  const scheduler::ModeChoice choice = scheduler::ChoosePlanMode(in);
  PlanRun& run = s.run;
  run.mode = choice.mode;
  run.max_ctas = choice.max_ctas;
  run.tuner_key = scheduler::CtaTunerKey(in.mean_run_bytes, dst.cuda, dst.device == device);
  // The copy-only mode's small kernels learn their own knee, within their own budget.
  if (choice.copy_only_kernel) run.tuner_key += kCopyOnlyTunerKeys;
  run.copy_only_kernel = choice.copy_only_kernel;
  // Kernel and copy engines together: ordinary kernel plans only (the copy-engine-only mode's
  // small kernels spare the SMs on purpose; digest jobs hash what their kernel moved).
  run.may_split = run.mode == scheduler::Mode::kKernel && !choice.copy_only_kernel &&
                  !job.wants_digest() && options_.copy_split_max_percent > 0;
  std::optional<Job::ReadyGate> gate = gate_->Admitted(&job);
  if (gate.has_value()) {
    if (run.mode != scheduler::Mode::kKernel) {
      return absl::FailedPreconditionError(
          absl::StrCat(gate->field, ": the plan runs on the copy engines on GPU", device, " (",
                       choice.reason, "), which cannot wait for the flags on the GPU"));
    }
    run.may_split = false;  // the copy part would run on the copy stream, not behind the wait
  }
  run.copy_gbps_prior = choice.copy_engine_gbps > 0
                            ? choice.copy_engine_gbps
                            : scheduler::EstimateCopyEngineGbps(in.mean_run_bytes);
  if (!choice.reason.empty()) {
    s.job->OnEngineNote(choice.reason);
    stats_->ModeNote(choice.copy_only_kernel, choice.reason);
    // The log: once per plan whose choice is worth an operator's attention (rare by design:
    // only the copy-engine-only mode and unreachable peers produce one).
    spdlog::info("cuda:{} transfer plan: {}", device, choice.reason);
  }
  const absl::Time t_upload = clock_->Now();
  s.progress.setup_mode = t_upload - t0 - s.progress.setup_addresses;
  // A digest job needs the uploaded plan in copy-engine mode too (its hash kernels).
  if (run.mode == scheduler::Mode::kKernel || job.wants_digest()) {
    // A gated job's plan is its own: the gate's abort zeroes its tile count on the GPU.
    KVRAIL_RETURN_IF_ERROR(UploadPlan(s, /*keep=*/!gate.has_value()));
  }
  if (job.wants_digest()) {
    KVRAIL_ASSIGN_OR_RETURN(s.digests,
                            ops_->CreateDigests(job.plan().num_tiles(), ops_->main_stream()));
  }
  if (gate.has_value()) {
    KVRAIL_RETURN_IF_ERROR(gate_->Arm(s.lease, s.job, *gate, *s.plan));
    s.gate = std::move(gate);
    s.job->OnEngineNote(absl::StrCat("layers wait for ", s.gate->field,
                                     " on the GPU (cuStreamWaitValue32 on the job's stream)"));
  }
  s.progress.setup_upload = clock_->Now() - t_upload;
  // The GPU-written completion: not for a gated job (a released layer's kernel runs empty, yet
  // its stream goes on) nor a digest job (its digests are compared on the CPU after the copy).
  if (options_.done_words && !gate.has_value() && !job.wants_digest()) {
    s.done_word = sides->done_word(device);
    if (s.done_word.has_value() && (s.done_word->device_word == 0 || s.done_word->value == 0 ||
                                    s.done_word->device_word % 8 != 0)) {
      s.done_word.reset();
    }
  }
  sides->OnEngineUsed(scheduler::ModeEngineName(run.mode));
  return absl::OkStatus();
}

absl::Status Dispatcher::UploadPlan(JobState& s, bool keep) {
  const planner::Plan& plan = s.RunPlan();
  const kernels::PlanImageLayout layout = kernels::LayoutPlanImage(plan.header());
  std::string key;
  if (keep && warm_.enabled()) {
    key = kernels::PlanShapeKey(plan.header(), reinterpret_cast<uint64_t>(s.src),
                                reinterpret_cast<uint64_t>(s.dst));
    std::unique_ptr<GpuPlan> warm = TakeWarm(s, key);
    stats_->WarmPlan(warm != nullptr);
    if (warm != nullptr) {
      s.plan = std::move(warm);
      stats_->WarmPlansKept(warm_.entries(), warm_.bytes());
      return absl::OkStatus();
    }
  }
  // From a pinned staging slot when one is free: the whole image in one copy when it fits (the
  // tables are then copied on the host and need not be held), else the header.
  PlanStager::Slot* staging = options_.staged_plan_upload ? stager_.Take() : nullptr;
  const bool staged_whole = staging != nullptr && layout.bytes <= kStagingSlotBytes;
  KVRAIL_ASSIGN_OR_RETURN(s.plan, ops_->UploadPlan(plan, s.src, s.dst, ops_->main_stream(),
                                                   staging != nullptr ? staging->memory : nullptr,
                                                   staging != nullptr ? kStagingSlotBytes : 0));
  if (!key.empty()) s.warm = WarmPlans::Ticket{std::move(key), layout.bytes, nullptr};
  if (staging != nullptr) KVRAIL_RETURN_IF_ERROR(stager_.Used(*staging));
  if (!staged_whole) KVRAIL_RETURN_IF_ERROR(HoldTables(s));
  return absl::OkStatus();
}

std::unique_ptr<GpuPlan> Dispatcher::TakeWarm(JobState& s, const std::string& key) {
  std::optional<WarmPlans::Kept> kept = warm_.Take(key);
  if (!kept.has_value()) return nullptr;
  const planner::Plan& plan = s.RunPlan();
  // Only the ids move: through a staging slot when they fit (one copy, the tables need not be
  // held), else straight from the tables.
  const kernels::PlanIdsSection ids = kernels::IdsSection(kernels::LayoutPlanImage(plan.header()));
  PlanStager::Slot* staging =
      options_.staged_plan_upload && ids.bytes > 0 ? stager_.Take() : nullptr;
  const bool staged = staging != nullptr && ids.bytes <= kStagingSlotBytes;
  absl::Status wrote =
      ops_->UploadBlockIds(*kept->plan, plan, staging != nullptr ? staging->memory : nullptr,
                           staging != nullptr ? kStagingSlotBytes : 0);
  if (wrote.ok() && staging != nullptr) wrote = stager_.Used(*staging);
  if (wrote.ok() && !staged && ids.bytes > 0) wrote = HoldTables(s);
  if (!wrote.ok()) {
    // Its ids may be half written: the buffer is freed (in stream order) and never kept again;
    // the job uploads its whole plan instead.
    stats_->WarmPlanIdsFailed(wrote);
    return nullptr;
  }
  s.warm = std::move(kept->ticket);
  return std::move(kept->plan);
}

absl::Status Dispatcher::HoldTables(JobState& s) {
  const planner::Plan& plan = s.RunPlan();
  if (!plan.src_blocks().pinned() && !plan.dst_blocks().pinned()) return absl::OkStatus();
  if (s.uploaded == nullptr) {
    KVRAIL_ASSIGN_OR_RETURN(s.uploaded, ops_->CreateEvent());
  }
  KVRAIL_RETURN_IF_ERROR(ops_->Record(*s.uploaded, ops_->main_stream()));
  s.src_tables = plan.src_blocks().Hold();
  s.dst_tables = plan.dst_blocks().Hold();
  return absl::OkStatus();
}

void Dispatcher::SpinForWork() {
  if (queues_->ClearHintUnlessWork()) return;
  const absl::Duration wanted = absl::Microseconds(options_.dispatcher_spin_us);
  const absl::Time from = clock_->Now();
  // Decided once: a spin of the allowance leaves the budget empty, not overdrawn.
  const absl::Duration allowed = std::min(wanted, idle_budget_.Allowance(from));
  if (allowed <= absl::ZeroDuration()) {
    stats_->IdleSpinRefused();
    return;
  }
  stats_->IdleSpinBegan();
  const auto [now, hit] = PollHint(from, from + allowed, /*yield=*/false);
  // Every spin draws on the budget, one that found work too: it burned the core all the same.
  idle_budget_.Spent(from, now);
  stats_->IdleSpinEnded(now - from, hit, /*cut=*/!hit && allowed < wanted);
}

std::pair<absl::Time, bool> Dispatcher::PollHint(absl::Time from, absl::Time until, bool yield) {
  absl::Time now = from;
  while (true) {
    if (queues_->hint()) return {clock_->Now(), true};
    now = clock_->Now();
    if (now >= until) return {now, false};
    if (yield) {
      YieldCpu();
    } else {
      CpuRelax();
    }
  }
}

bool Dispatcher::AwaitPredicted() {
  const absl::Time start = clock_->Now();
  const PredictiveWake::Plan plan = wake_.Next(start);
  if (!plan.predicted) return true;
  // Work (or a stop) already there: no sleep. Else the hint is clear, and set by the next job.
  if (queues_->ClearHintUnlessWork()) return true;
  if (plan.wake_at > start) {
    if (!queues_->AwaitWork(plan.wake_at - start)) return false;
    if (queues_->hint()) return true;  // the job came early
    const absl::Time woke = clock_->Now();
    // Woken at the deadline (not by Engine::Expect, which leaves the hint clear too, earlier).
    if (woke >= plan.wake_at) wake_.Woke(plan.wake_at, woke);
  }
  const absl::Time from = clock_->Now();
  const absl::Duration allowed = std::min(plan.spin_until - from, idle_budget_.Allowance(from));
  if (allowed <= absl::ZeroDuration()) {
    if (plan.spin_until > from) stats_->IdleSpinRefused();
    wake_.Missed();
    return true;
  }
  stats_->IdleSpinBegan(/*predicted=*/true);
  // Yielding each round: on a host short of cores the client whose submit brings the job may
  // be woken onto this CPU, and a spinner that keeps it to the end of its slice delays that job
  // to the spin's end.
  const auto [now, hit] = PollHint(from, from + allowed, /*yield=*/true);
  idle_budget_.Spent(from, now);
  stats_->IdleSpinEnded(now - from, hit, /*cut=*/!hit && from + allowed < plan.spin_until,
                        /*predicted=*/true);
  if (!hit) wake_.Missed();
  return true;
}

absl::StatusOr<GpuStream*> Dispatcher::CopyStream() {
  if (copy_stream_ == nullptr) {
    KVRAIL_ASSIGN_OR_RETURN(copy_stream_, ops_->CreateStream());
  }
  return copy_stream_.get();
}

absl::StatusOr<std::unique_ptr<GpuEvent>> Dispatcher::TakeEvent() {
  if (spare_events_.empty()) return ops_->CreateEvent();
  std::unique_ptr<GpuEvent> e = std::move(spare_events_.back());
  spare_events_.pop_back();
  return e;
}

}  // namespace kvrail::engine::cuda_detail

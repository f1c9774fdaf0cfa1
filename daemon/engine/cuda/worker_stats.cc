#include "daemon/engine/cuda/worker_stats.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvrail::engine::cuda_detail {

void WorkerStats::WarmDone(std::string text) {
  absl::MutexLock lock(&mu_);
  warm_up_text_ = std::move(text);
  warm_done_ = true;
}

void WorkerStats::AwaitWarm() const {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&warm_done_));
}

void WorkerStats::Broke(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (broken_.ok()) broken_ = why;
}

absl::Status WorkerStats::broken() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

void WorkerStats::SetUp(const SetUpSample& sample) {
  absl::MutexLock lock(&mu_);
  last_setup_ = sample;
}

void WorkerStats::ModeNote(bool copy_only_kernel, const std::string& note) {
  absl::MutexLock lock(&mu_);
  (copy_only_kernel ? copy_only_kernel_plans_ : slow_copy_plans_)++;
  last_mode_note_ = note;
}

void WorkerStats::HeldStates(size_t n) {
  absl::MutexLock lock(&mu_);
  held_states_ = n;
}

void WorkerStats::Batch(bool kernel, bool split, std::string decision, const JobSample& job,
                        const std::string* first_job_trace) {
  absl::MutexLock lock(&mu_);
  if (first_job_trace != nullptr) first_job_batches_ = *first_job_trace;
  (kernel ? kernel_batches_ : copy_batches_)++;
  if (split) ++split_batches_;
  last_decision_ = std::move(decision);
  last_job_ = job;
}

void WorkerStats::FirstJob(std::string text) {
  absl::MutexLock lock(&mu_);
  first_job_text_ = std::move(text);
}

std::string WorkerStats::Describe(int device, int max_ctas, int critical_ctas) const {
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return absl::StrCat("cuda:", device, " BROKEN: ", broken_.message());
  return absl::StrCat(
      "cuda:", device, " ", warm_up_text_, last_decision_, ", budget ", max_ctas, " CTAs",
      critical_ctas > 0 ? absl::StrCat(" (critical transfers ", critical_ctas, ")") : std::string(),
      "; ", kernel_batches_, " kernel / ", copy_batches_, " copy-engine batches",
      split_batches_ > 0
          ? absl::StrCat(" (", split_batches_, " kernel batches split with the copy engines)")
          : std::string(),
      done_words_ + done_words_failed_ > 0
          ? absl::StrCat("; ", done_words_, " done words enqueued for the GPU",
                         done_words_failed_ > 0 ? absl::StrCat(" (", done_words_failed_,
                                                               " not: ", done_word_error_, ")")
                                                : std::string())
          : std::string(),
      WarmPlansTextLocked(), IdleSpinTextLocked(), "; ", CopyOnlyTextLocked(), held_states_,
      " jobs set up (plan on the GPU); last job set-up (plan upload enqueued) ", SetUpTextLocked(),
      LastJobTextLocked(), first_job_text_,
      first_job_batches_.empty()
          ? std::string()
          : absl::StrCat("; first job's batches (us: launch enqueued after the first launch's "
                         "/ GPU start / GPU end after the GPU reached the first launch): ",
                         first_job_batches_));
}

void WorkerStats::DoneWordWritten() {
  absl::MutexLock lock(&mu_);
  ++done_words_;
}

void WorkerStats::DoneWordFailed(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  ++done_words_failed_;
  done_word_error_ = std::string(why.message());
}

uint64_t WorkerStats::done_words() const {
  absl::MutexLock lock(&mu_);
  return done_words_;
}

void WorkerStats::WarmPlan(bool hit) {
  absl::MutexLock lock(&mu_);
  (hit ? warm_hits_ : warm_misses_)++;
}

void WorkerStats::WarmPlanIdsFailed(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  ++warm_ids_failed_;
  warm_error_ = std::string(why.message());
}

void WorkerStats::WarmPlansKept(size_t entries, size_t bytes) {
  absl::MutexLock lock(&mu_);
  warm_entries_ = entries;
  warm_bytes_ = bytes;
}

void WorkerStats::IdleSpinBegan(bool predicted) {
  absl::MutexLock lock(&mu_);
  ++idle_spins_.began;
  if (predicted) ++idle_spins_.predicted;
}

void WorkerStats::IdleSpinEnded(absl::Duration spun, bool hit, bool cut, bool predicted) {
  absl::MutexLock lock(&mu_);
  ++idle_spins_.ended;
  if (hit) ++idle_spins_.hits;
  if (hit && predicted) ++idle_spins_.predicted_hits;
  if (cut) ++idle_spins_.cut;
  idle_spins_.spun += spun;
  idle_spins_.last = spun;
}

void WorkerStats::IdleSpinRefused() {
  absl::MutexLock lock(&mu_);
  ++idle_spins_.refused;
}

IdleSpinCounts WorkerStats::idle_spins() const {
  absl::MutexLock lock(&mu_);
  return idle_spins_;
}

std::string WorkerStats::IdleSpinTextLocked() const {
  if (idle_spins_.began == 0 && idle_spins_.refused == 0) return "";
  return absl::StrFormat(
      "; idle spin: %u spins, %.1f ms, %u ended by work, %u cut short and %u refused by the "
      "budget%s",
      idle_spins_.began, absl::ToDoubleMilliseconds(idle_spins_.spun), idle_spins_.hits,
      idle_spins_.cut, idle_spins_.refused,
      idle_spins_.predicted == 0
          ? std::string()
          : absl::StrFormat(" (predictive wake: %u of them, %u ended by work)",
                            idle_spins_.predicted, idle_spins_.predicted_hits));
}

std::map<std::string, double> WorkerStats::Gauges() const {
  absl::MutexLock lock(&mu_);
  return {{"dispatcher_spins_total", static_cast<double>(idle_spins_.began)},
          {"dispatcher_spin_seconds_total", absl::ToDoubleSeconds(idle_spins_.spun)},
          {"dispatcher_spins_cut_total", static_cast<double>(idle_spins_.cut)},
          {"dispatcher_spins_refused_total", static_cast<double>(idle_spins_.refused)},
          {"dispatcher_predicted_spins_total", static_cast<double>(idle_spins_.predicted)},
          {"dispatcher_predicted_spin_hits_total", static_cast<double>(idle_spins_.predicted_hits)},
          {"warm_plan_hits_total", static_cast<double>(warm_hits_)},
          {"warm_plan_misses_total", static_cast<double>(warm_misses_)},
          {"warm_plan_id_upload_failures_total", static_cast<double>(warm_ids_failed_)},
          {"warm_plans", static_cast<double>(warm_entries_)},
          {"warm_plan_bytes", static_cast<double>(warm_bytes_)}};
}

std::string WorkerStats::WarmPlansTextLocked() const {
  if (warm_hits_ + warm_misses_ == 0) return "";
  return absl::StrFormat(
      "; warm plans: %u jobs uploaded their block ids only, %u their whole plan"
      " (%u kept, %.1f KiB)%s",
      warm_hits_, warm_misses_, warm_entries_, warm_bytes_ / 1024.0,
      warm_ids_failed_ > 0
          ? absl::StrCat(", ", warm_ids_failed_, " id uploads failed (latest: ", warm_error_, ")")
          : std::string());
}

std::string WorkerStats::CopyOnlyTextLocked() const {
  if (copy_only_kernel_plans_ == 0 && slow_copy_plans_ == 0) return "";
  return absl::StrCat(copy_only_kernel_plans_, " tiny-run plans on a small kernel / ",
                      slow_copy_plans_,
                      " slow plans kept on the copy engines (latest: ", last_mode_note_, "); ");
}

std::string WorkerStats::SetUpTextLocked() const {
  if (!last_setup_.has_value()) return "none yet";
  return absl::StrFormat(
      "%.0f us (%.1f MiB of block tables, %s)", absl::ToDoubleMicroseconds(last_setup_->took),
      last_setup_->table_bytes / 1048576.0, last_setup_->pinned ? "pinned" : "pageable");
}

std::string WorkerStats::LastJobTextLocked() const {
  if (!last_job_.has_value()) return "";
  const JobSample& j = *last_job_;
  return absl::StrFormat(
      "; last job so far: %u batches, GPU busy %.3f of %.3f ms since its first launch "
      "(%.1f GB/s while busy)",
      j.batches, j.gpu_seconds * 1e3, j.wall_seconds * 1e3,
      j.gpu_seconds > 0 ? j.bytes / j.gpu_seconds / 1e9 : 0.0);
}

}  // namespace kvrail::engine::cuda_detail

// What one GPU's dispatcher did, for Describe: batch counts, the latest launch decision, set-up
// and job samples, the warm-up, the copy-only mode's notes, a sticky GPU fault, and the trace of
// the daemon's first job (its set-up phases and first batches, so a slow first transfer can be
// told apart from a slow engine).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvrail::engine::cuda_detail {

// Batches of the daemon's first job traced in Describe ("first job's batches").
constexpr uint32_t kFirstJobTraceBatches = 32;

struct SetUpSample {
  absl::Duration took;
  uint64_t table_bytes = 0;
  bool pinned = false;
};

// The dispatcher's idle spins (CudaEngineOptions::dispatcher_spin_us under its budget).
struct IdleSpinCounts {
  uint64_t began = 0;  // spins begun (the budget allowed some time)
  uint64_t ended = 0;
  uint64_t hits = 0;     // ended by work coming (a job enqueued, or the engine stopping)
  uint64_t cut = 0;      // ended early by the budget, no work come
  uint64_t refused = 0;  // never begun: the budget was spent
  absl::Duration spun;   // every spin's time together, as the dispatcher's clock read it
  absl::Duration last;   // the latest spin's
  // Of those, predictive wake's (around a steady cadence's next job), and how many of them the
  // job ended.
  uint64_t predicted = 0;
  uint64_t predicted_hits = 0;
};

struct JobSample {
  uint32_t batches = 0;
  uint64_t bytes = 0;
  double gpu_seconds = 0;
  double wall_seconds = 0;  // first launch -> this completion
};

// Thread contract: the dispatcher writes, Describe reads from any thread (mu_); the first-job
// markers (first_job_pending, ...) are the dispatcher's alone.
class WorkerStats {
 public:
  void WarmDone(std::string text);
  void AwaitWarm() const;

  // The first sticky CUDA error; every later batch fails with it.
  void Broke(const absl::Status& why);
  absl::Status broken() const;

  void SetUp(const SetUpSample& sample);
  void ModeNote(bool copy_only_kernel, const std::string& note);
  void HeldStates(size_t n);
  // A completed batch: kernel (else copy engines), split with the copy engines, its decision.
  void Batch(bool kernel, bool split, std::string decision, const JobSample& job,
             const std::string* first_job_trace);
  void FirstJob(std::string text);
  // The GPU-written completion: a done word enqueued behind a job's last batch, or one that
  // could not be (the client then reads the daemon's completion).
  void DoneWordWritten();
  void DoneWordFailed(const absl::Status& why);
  uint64_t done_words() const;
  // Plans kept warm (warm_plans.h): a job of a kept shape (hit: only its ids uploaded) or not
  // (miss: its whole plan), an id upload that failed (the buffer dropped, the whole plan
  // uploaded instead), and what is kept now.
  void WarmPlan(bool hit);
  void WarmPlanIdsFailed(const absl::Status& why);
  void WarmPlansKept(size_t entries, size_t bytes);
  // The idle spin: one begun, one ended after `spun` (`hit`: work came; `cut`: the budget ended
  // it first), or one the budget refused outright (IdleSpinRefused).
  // `predicted`: predictive wake's spin.
  void IdleSpinBegan(bool predicted = false);
  void IdleSpinEnded(absl::Duration spun, bool hit, bool cut, bool predicted = false);
  void IdleSpinRefused();
  IdleSpinCounts idle_spins() const;
  // Numeric state for metrics (Engine::Gauges): counters end in _total.
  std::map<std::string, double> Gauges() const;

  // Dispatcher only: whether the daemon's first job is still to come, and when its set-up began.
  bool first_job_pending() const { return first_job_pending_; }
  void FirstJobStarted() { first_job_pending_ = false; }
  absl::Time first_setup_at() const { return first_setup_at_; }
  void FirstSetUpAt(absl::Time t) { first_setup_at_ = t; }

  // "cuda:N ..." without the gate's part.
  std::string Describe(int device, int max_ctas, int critical_ctas) const;

 private:
  std::string CopyOnlyTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string SetUpTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string LastJobTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string WarmPlansTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string IdleSpinTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  bool warm_done_ ABSL_GUARDED_BY(mu_) = false;
  std::string warm_up_text_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  std::string last_decision_ ABSL_GUARDED_BY(mu_) = "idle";
  std::optional<SetUpSample> last_setup_ ABSL_GUARDED_BY(mu_);
  std::optional<JobSample> last_job_ ABSL_GUARDED_BY(mu_);
  uint64_t kernel_batches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t copy_batches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t split_batches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t copy_only_kernel_plans_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t slow_copy_plans_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_mode_note_ ABSL_GUARDED_BY(mu_);
  std::string first_job_text_ ABSL_GUARDED_BY(mu_);
  std::string first_job_batches_ ABSL_GUARDED_BY(mu_);
  size_t held_states_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_words_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_words_failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::string done_word_error_ ABSL_GUARDED_BY(mu_);
  uint64_t warm_hits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t warm_misses_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t warm_ids_failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::string warm_error_ ABSL_GUARDED_BY(mu_);
  size_t warm_entries_ ABSL_GUARDED_BY(mu_) = 0;
  size_t warm_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  IdleSpinCounts idle_spins_ ABSL_GUARDED_BY(mu_);
  bool first_job_pending_ = true;
  absl::Time first_setup_at_;
};

}  // namespace kvrail::engine::cuda_detail

// Test support for the dispatcher's tests on the fake GPU (fake_gpu_ops.h): a job over host
// buffers the fake GPU copies between (optionally gated per layer), random cases, and one GPU's
// parts driven turn by turn from the test's thread with a manual clock. Thread contract: as each
// part's.
#pragma once

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/manual_clock.h"
#include "daemon/engine/cuda/dispatch_queues.h"
#include "daemon/engine/cuda/dispatcher.h"
#include "daemon/engine/cuda/fake_gpu_ops.h"
#include "daemon/engine/cuda/gpu_gate.h"
#include "daemon/engine/cuda/worker_stats.h"
#include "daemon/engine/engine.h"
#include "daemon/planner/testing/random_case.h"

namespace kvrail::engine::cuda_detail::testing {

// Where and how a reference was dropped.
struct DropSeen {
  std::atomic<bool> dropped{false};
  std::atomic<bool> under_queue_lock{false};
  std::thread::id thread;
};

// A paged transfer between two host buffers the fake GPU reads and writes directly, recording
// its reports; optionally gated by one ready word per layer.
class TestJob final : public Job, public DeviceSides {
 public:
  DeviceSides* device_sides() const override { return const_cast<TestJob*>(this); }
  TestJob(const planner::testing::RandomCase& c, std::mt19937_64& rng)
      : src_(c.src.size_bytes),
        dst_(c.dst.size_bytes, 0),
        want_(c.dst.size_bytes, 0),
        plan_(*planner::MakePlan(c.spec, c.src, c.dst, c.options)) {
    for (auto& b : src_) b = static_cast<uint8_t>(rng() | 1);
    planner::testing::ReferenceCopy(c, src_.data(), want_.data());
    words_.assign(plan_.num_layers(), 0);
  }
  const planner::Plan& plan() const override { return plan_; }
  const uint8_t* src_base() const override { return src_.data(); }
  uint8_t* dst_base() const override { return const_cast<uint8_t*>(dst_.data()); }
  Placement src() const override { return {true, 0, const_cast<uint8_t*>(src_.data())}; }
  Placement dst() const override { return {true, 0, dst_base()}; }
  absl::StatusOr<uint8_t*> DeviceAddress(Side side, int) const override {
    return side == Side::kSrc ? const_cast<uint8_t*>(src_.data()) : dst_base();
  }
  PriorityClass priority() const override { return PriorityClass::kNormal; }
  bool wants_digest() const override { return digest_; }
  std::optional<ReadyGate> ready_gate(int) const override {
    ReadyGate g;
    g.host_words = const_cast<uint32_t*>(words_.data());
    g.device_words = reinterpret_cast<uint64_t>(words_.data());
    g.count = static_cast<uint32_t>(words_.size());
    g.value = 1;
    g.field = "spec.ready_flags";
    g.keep = keep_;
    return g;
  }
  absl::Status ended(bool* producer_gone) const override {
    if (on_ended_) on_ended_();
    absl::MutexLock lock(&mu_);
    *producer_gone = producer_gone_;
    return ended_;
  }
  void OnTileStart(uint32_t) override {}
  std::optional<DoneWord> done_word(int) const override {
    if (done_value_ == 0) return std::nullopt;
    return DoneWord{reinterpret_cast<uint64_t>(&done_), done_value_, keep_};
  }
  void OnTileDone(uint32_t tile, const absl::Status& status) override {
    const int pending = fake_ != nullptr ? fake_->pending_writes() : 0;
    const uint64_t word = done();
    absl::MutexLock lock(&mu_);
    if (word == done_value_ && done_value_ != 0) ++reports_after_done_;
    statuses_[tile] = status;
    writes_pending_at_report_ = std::max(writes_pending_at_report_, pending);
  }

  void set_digest(bool on) { digest_ = on; }
  // The GPU-written completion: `value` into this job's own word (0: none).
  void set_done_value(uint64_t value) { done_value_ = value; }
  uint64_t done() const { return __atomic_load_n(&done_, __ATOMIC_ACQUIRE); }
  void set_done(uint64_t v) { __atomic_store_n(&done_, v, __ATOMIC_RELEASE); }
  // Tile reports that found the word already stored.
  int reports_after_done() const {
    absl::MutexLock lock(&mu_);
    return reports_after_done_;
  }
  // Reports look at what the fake GPU still has queued to write.
  void WatchWrites(const FakeGpuOps* fake) { fake_ = fake; }
  // The words stay mapped while `keep` lives (the test then drops its own reference).
  void set_keep(std::shared_ptr<const void> keep) { keep_ = std::move(keep); }
  void set_on_ended(std::function<void()> fn) { on_ended_ = std::move(fn); }
  void End(absl::Status why, bool producer_gone) {
    absl::MutexLock lock(&mu_);
    ended_ = std::move(why);
    producer_gone_ = producer_gone;
  }
  void Write(uint32_t layer) { __atomic_store_n(&words_[layer], 1u, __ATOMIC_RELEASE); }
  uint32_t word(uint32_t layer) const { return __atomic_load_n(&words_[layer], __ATOMIC_ACQUIRE); }

  std::vector<uint32_t> AllTiles() const {
    std::vector<uint32_t> t(plan_.num_tiles());
    for (uint32_t i = 0; i < t.size(); ++i) t[i] = i;
    return t;
  }
  size_t reported() const {
    absl::MutexLock lock(&mu_);
    return statuses_.size();
  }
  std::map<uint32_t, absl::Status> statuses() const {
    absl::MutexLock lock(&mu_);
    return statuses_;
  }
  int writes_pending_at_report() const {
    absl::MutexLock lock(&mu_);
    return writes_pending_at_report_;
  }
  bool copied() const { return dst_ == want_; }
  bool untouched() const {
    for (uint8_t b : dst_) {
      if (b != 0) return false;
    }
    return true;
  }
  // Whether the tiles of `layer` landed (each tile's reference bytes).
  bool LayerReported(uint32_t layer) const {
    absl::MutexLock lock(&mu_);
    for (uint32_t t = 0; t < plan_.num_tiles(); ++t) {
      if (plan_.tile(t).layer == layer && statuses_.count(t) == 0) return false;
    }
    return true;
  }

 private:
  std::vector<uint8_t> src_, dst_, want_;
  planner::Plan plan_;
  std::vector<uint32_t> words_;
  bool digest_ = false;
  uint64_t done_value_ = 0;
  alignas(8) uint64_t done_ = 0;
  const FakeGpuOps* fake_ = nullptr;
  std::shared_ptr<const void> keep_;
  std::function<void()> on_ended_;
  mutable absl::Mutex mu_;
  std::map<uint32_t, absl::Status> statuses_ ABSL_GUARDED_BY(mu_);
  int writes_pending_at_report_ ABSL_GUARDED_BY(mu_) = 0;
  int reports_after_done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status ended_ ABSL_GUARDED_BY(mu_);
  bool producer_gone_ ABSL_GUARDED_BY(mu_) = false;
};

// A paged case of at least two layers (the gate's cases wait per layer).
inline planner::testing::RandomCase LayeredCase(std::mt19937_64& rng) {
  while (true) {
    planner::testing::RandomCase c = planner::testing::RandomPagedCase(rng);
    auto plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
    if (plan.ok() && plan->num_layers() >= 2 && plan->num_tiles() >= 4) return c;
  }
}

inline CudaEngineOptions TestOptions() {
  CudaEngineOptions o;
  o.max_ctas = 8;
  o.fixed_ctas = 8;  // no knee probing: every batch is the tuner's plain choice
  o.copy_split_max_percent = 0;
  o.warm_up = false;
  o.dispatcher_spin_us = 0;
  o.staged_plan_upload = true;
  o.stream_wait = true;
  o.batch_bytes = 1 << 10;  // several batches per job
  return o;
}

// One GPU's parts on the fake GPU, driven from the test's thread.
struct Rig {
  explicit Rig(CudaEngineOptions o = TestOptions())
      : options(o),
        queues(o.limits, o.batch_bytes, &clock),
        gate(&fake, &clock, Gate(o)),
        dispatcher(&fake, &clock, o, 0, &queues, &gate, &stats) {
    REQUIRE(gate.Make().ok());
    REQUIRE(dispatcher.stager().Make().ok());
  }
  static GateOptions Gate(const CudaEngineOptions& o) {
    GateOptions g;
    g.enabled = o.stream_wait;
    g.max_jobs = 4;
    g.sync_bound_ms = 1000;
    return g;
  }
  // Turns until `done` holds (at most `turns`).
  bool TurnUntil(const std::function<bool()>& done, int turns = 2000) {
    for (int i = 0; i < turns && !done(); ++i) dispatcher.Turn(/*block=*/false);
    return done();
  }
  // Admits `job` for the GPU wait (as Engine::AdmitGated).
  bool Admit(const std::shared_ptr<TestJob>& job) {
    scheduler::GateInputs in;
    in.flags_mapped = true;
    in.kernel_mode = true;
    return gate.Admit(job, *job->ready_gate(0), in);
  }

  ManualClock clock;
  FakeGpuOps fake;
  const CudaEngineOptions options;
  DispatchQueues queues;
  WorkerStats stats;
  GpuGate gate;
  Dispatcher dispatcher;
};

// A case of several batches (TestOptions' 1 KiB batches).
inline planner::testing::RandomCase ManyBatchCase(std::mt19937_64& rng) {
  while (true) {
    planner::testing::RandomCase c = planner::testing::RandomPagedCase(rng);
    auto plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
    if (!plan.ok() || plan->num_tiles() < 4) continue;
    uint64_t bytes = 0;
    for (uint32_t t = 0; t < plan->num_tiles(); ++t) bytes += plan->tile(t).bytes;
    if (bytes >= 4096) return c;
  }
}

inline bool AllOk(const TestJob& job) {
  for (const auto& [tile, status] : job.statuses()) {
    if (!status.ok()) return false;
  }
  return job.statuses().size() == job.plan().num_tiles();
}

}  // namespace kvrail::engine::cuda_detail::testing

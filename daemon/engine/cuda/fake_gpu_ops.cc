#include "daemon/engine/cuda/fake_gpu_ops.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvrail::engine::cuda_detail {

struct FakeGpuOps::Stream final : public GpuStream {
  explicit Stream(size_t i) : index(i) {}
  const size_t index;
};

namespace {

struct FakeEvent final : public GpuEvent {
  uint64_t recorded = 0;  // generation of the latest Record (0: never recorded)
  uint64_t passed = 0;    // generation the stream has passed
  uint64_t at = 0;        // fake GPU time it passed at
};

struct FakePlan final : public GpuPlan {
  const planner::Plan* plan = nullptr;
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  uint32_t num_tiles = 0;  // zeroed by DisarmPlan's operation
};

struct FakeDigests final : public GpuDigests {
  explicit FakeDigests(uint32_t n) : values(2 * n, 0), tiles(n) {}
  uint64_t host_source(uint32_t tile) const override { return values[tile]; }
  uint64_t host_destination(uint32_t tile) const override { return values[tiles + tile]; }
  std::vector<uint64_t> values;
  uint32_t tiles;
};

struct FakeHostMemory final : public HostMemory {
  explicit FakeHostMemory(size_t bytes) : memory(std::calloc(1, bytes)) {}
  ~FakeHostMemory() override { std::free(memory); }
  void* host() const override { return memory; }
  uint64_t device() const override { return reinterpret_cast<uint64_t>(memory); }
  void* memory;
};

// The run's bytes between bases (nullptr: a per-layer side's whole addresses).
void CopyRun(const scheduler::CopyRun& r, const uint8_t* src, uint8_t* dst) {
  const auto s = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(src) + r.src);
  auto d = reinterpret_cast<uint8_t*>(reinterpret_cast<uintptr_t>(dst) + r.dst);
  std::memmove(d, s, r.bytes);
}

FakeEvent& Ev(GpuEvent& e) { return static_cast<FakeEvent&>(e); }

}  // namespace

FakeGpuOps::FakeGpuOps(int device) : device_(device) {
  absl::MutexLock lock(&mu_);
  queues_.emplace_back();
  main_ = std::make_unique<Stream>(0);
}

FakeGpuOps::~FakeGpuOps() = default;

void FakeGpuOps::FailNext(const std::string& op, absl::Status status, bool sticky) {
  absl::MutexLock lock(&mu_);
  fail_[op] = {std::move(status), sticky};
}

void FakeGpuOps::set_auto_run(bool on) {
  absl::MutexLock lock(&mu_);
  auto_run_ = on;
}

void FakeGpuOps::Run() {
  absl::MutexLock lock(&mu_);
  RunLocked();
}

int FakeGpuOps::pending_writes() const {
  absl::MutexLock lock(&mu_);
  return PendingWritesLocked();
}

int FakeGpuOps::PendingWritesLocked() const {
  int n = 0;
  for (const auto& q : queues_) {
    for (const Op& op : q) n += op.writes ? 1 : 0;
  }
  return n;
}

void FakeGpuOps::FaultNextKernel() {
  absl::MutexLock lock(&mu_);
  fault_next_kernel_ = true;
}

std::vector<FakeGpuOps::DoneWordStored> FakeGpuOps::done_words() const {
  absl::MutexLock lock(&mu_);
  return done_words_;
}

int FakeGpuOps::pending_ops() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& q : queues_) n += static_cast<int>(q.size());
  return n;
}

int FakeGpuOps::streams_made() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queues_.size());
}

int FakeGpuOps::kernels_run() const {
  absl::MutexLock lock(&mu_);
  return kernels_run_;
}

absl::Status FakeGpuOps::Injected(const std::string& op, bool* sticky) {
  auto it = fail_.find(op);
  if (it == fail_.end()) return absl::OkStatus();
  absl::Status status = std::move(it->second.first);
  if (sticky != nullptr) *sticky = it->second.second;
  fail_.erase(it);
  return status;
}

void FakeGpuOps::Push(GpuStream& stream, Op op) {
  queues_[static_cast<Stream&>(stream).index].push_back(std::move(op));
}

void FakeGpuOps::RunLocked() {
  bool progress = true;
  while (progress && !faulted_) {
    progress = false;
    for (auto& q : queues_) {
      while (!faulted_ && !q.empty() && q.front().run()) {
        q.pop_front();
        ++clock_;
        progress = true;
      }
    }
  }
}

absl::StatusOr<std::unique_ptr<GpuStream>> FakeGpuOps::CreateStream() {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Injected("CreateStream"); !s.ok()) return s;
  queues_.emplace_back();
  return std::make_unique<Stream>(queues_.size() - 1);
}

absl::StatusOr<std::unique_ptr<GpuEvent>> FakeGpuOps::CreateEvent() {
  return std::make_unique<FakeEvent>();
}

absl::Status FakeGpuOps::Record(GpuEvent& event, GpuStream& stream) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Injected("Record"); !s.ok()) return s;
  FakeEvent* e = &Ev(event);
  const uint64_t generation = ++e->recorded;
  Push(stream, Op{[this, e, generation]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                    e->passed = generation;
                    e->at = clock_;
                    return true;
                  },
                  false});
  return absl::OkStatus();
}

bool FakeGpuOps::Passed(GpuEvent& event) {
  absl::MutexLock lock(&mu_);
  if (auto_run_) RunLocked();
  const FakeEvent& e = Ev(event);
  return e.passed == e.recorded || faulted_;  // a fault shows in Wait
}

absl::Status FakeGpuOps::Wait(GpuEvent& event, bool* sticky) {
  *sticky = false;
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (absl::Status s = Injected("Wait", sticky); !s.ok()) return s;
      RunLocked();
      const FakeEvent& e = Ev(event);
      if (e.passed == e.recorded) return absl::OkStatus();
      if (faulted_) {
        *sticky = true;
        return absl::InternalError("fake GPU: a kernel faulted (cudaErrorIllegalAddress)");
      }
    }
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError("fake GPU: the event never passed (a wait blocks it)");
    }
    absl::SleepFor(absl::Microseconds(50));
  }
}

absl::Status FakeGpuOps::Synchronize(GpuStream& stream) {
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      RunLocked();
      if (queues_[static_cast<Stream&>(stream).index].empty()) return absl::OkStatus();
      if (faulted_)
        return absl::InternalError("fake GPU: a kernel faulted (cudaErrorIllegalAddress)");
    }
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError("fake GPU: the stream never drained (a wait blocks it)");
    }
    absl::SleepFor(absl::Microseconds(50));
  }
}

double FakeGpuOps::Seconds(GpuEvent& from, GpuEvent& to) {
  absl::MutexLock lock(&mu_);
  return static_cast<double>(Ev(to).at - Ev(from).at) * 1e-6;
}

absl::Status FakeGpuOps::StreamWaitEvent(GpuStream& stream, GpuEvent& event) {
  absl::MutexLock lock(&mu_);
  FakeEvent* e = &Ev(event);
  const uint64_t generation = e->recorded;
  Push(stream, Op{[e, generation] { return e->passed >= generation; }, false});
  return absl::OkStatus();
}

absl::Status FakeGpuOps::WaitWord(GpuStream& stream, uint64_t device_word, uint32_t value) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Injected("WaitWord"); !s.ok()) return s;
  auto* word = reinterpret_cast<uint32_t*>(device_word);
  Push(stream, Op{[word, value] {
                    return static_cast<int32_t>(__atomic_load_n(word, __ATOMIC_ACQUIRE) - value) >=
                           0;
                  },
                  false});
  return absl::OkStatus();
}

absl::Status FakeGpuOps::WriteWord(GpuStream& stream, uint64_t device_word, uint32_t value) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Injected("WriteWord"); !s.ok()) return s;
  auto* word = reinterpret_cast<uint32_t*>(device_word);
  Push(stream, Op{[word, value] {
                    __atomic_store_n(word, value, __ATOMIC_RELEASE);
                    return true;
                  },
                  false});
  return absl::OkStatus();
}

absl::Status FakeGpuOps::WriteDoneWord(GpuStream& stream, uint64_t device_word, uint64_t value) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Injected("WriteDoneWord"); !s.ok()) return s;
  auto* word = reinterpret_cast<uint64_t*>(device_word);
  Push(stream, Op{[this, word, device_word, value]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                    // Popped after this returns: pending_writes counts only other operations.
                    done_words_.push_back(
                        DoneWordStored{device_word, value, PendingWritesLocked(), kernels_run_});
                    __atomic_store_n(word, value, __ATOMIC_RELEASE);
                    return true;
                  },
                  false});
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GpuPlan>> FakeGpuOps::UploadPlan(const planner::Plan& plan,
                                                                const uint8_t* src, uint8_t* dst,
                                                                GpuStream& stream, void* staging,
                                                                size_t staging_bytes) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Injected("UploadPlan"); !s.ok()) return s;
  auto p = std::make_unique<FakePlan>();
  p->plan = &plan;
  p->src = src;
  p->dst = dst;
  p->num_tiles = plan.num_tiles();
  return std::unique_ptr<GpuPlan>(std::move(p));
}

absl::Status FakeGpuOps::DisarmPlan(GpuPlan& plan, GpuStream& stream) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Injected("DisarmPlan"); !s.ok()) return s;
  auto* p = &static_cast<FakePlan&>(plan);
  Push(stream, Op{[p] {
                    p->num_tiles = 0;
                    return true;
                  },
                  false});
  return absl::OkStatus();
}

absl::Status FakeGpuOps::LaunchCopy(GpuPlan& plan, uint32_t begin, uint32_t end, int ctas,
                                    GpuStream& stream) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Injected("LaunchCopy"); !s.ok()) return s;
  if (ctas <= 0) return absl::InvalidArgumentError("fake GPU: a kernel of no CTAs");
  auto* p = &static_cast<FakePlan&>(plan);
  Push(stream, Op{[this, p, begin, end]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                    if (fault_next_kernel_) {
                      fault_next_kernel_ = false;
                      faulted_ = true;
                      return false;
                    }
                    std::vector<scheduler::CopyRun> runs;
                    for (uint32_t t = begin; t < end && t < p->num_tiles; ++t) {
                      scheduler::AppendTileRuns(*p->plan, t, &runs);
                    }
                    for (const auto& r : runs) CopyRun(r, p->src, p->dst);
                    ++kernels_run_;
                    return true;
                  },
                  true});
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GpuDigests>> FakeGpuOps::CreateDigests(uint32_t num_tiles,
                                                                      GpuStream& stream) {
  return std::make_unique<FakeDigests>(num_tiles);
}

absl::Status FakeGpuOps::LaunchDigest(GpuPlan& plan, uint32_t begin, uint32_t end, DigestPass pass,
                                      GpuDigests& digests, int ctas, GpuStream& stream) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = Injected("LaunchDigest"); !s.ok()) return s;
  }
  // The fused kernel copies (its digests stay equal: zero); the hash passes write no bytes.
  if (pass == DigestPass::kCopyHashSource) return LaunchCopy(plan, begin, end, ctas, stream);
  return absl::OkStatus();
}

absl::Status FakeGpuOps::CopyBackDigests(GpuDigests& digests, uint32_t begin, uint32_t end) {
  absl::MutexLock lock(&mu_);
  return Injected("CopyBackDigests");
}

absl::Status FakeGpuOps::CopyRuns(const std::vector<scheduler::CopyRun>& runs, const uint8_t* src,
                                  uint8_t* dst, GpuStream& stream) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Injected("CopyRuns"); !s.ok()) return s;
  Push(stream, Op{[runs, src, dst] {
                    for (const auto& r : runs) CopyRun(r, src, dst);
                    return true;
                  },
                  true});
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HostMemory>> FakeGpuOps::AllocHost(size_t bytes, bool mapped) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Injected("AllocHost"); !s.ok()) return s;
  return std::unique_ptr<HostMemory>(std::make_unique<FakeHostMemory>(bytes));
}

}  // namespace kvrail::engine::cuda_detail

#include "daemon/engine/cuda/fake_gpu_ops.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/plan_image.h"
#include "kernels/plan_math.h"

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

// A plan's device memory: the image as DevicePlanBuffer lays it out (kernels/plan_image.h), its
// header's pointers real host addresses inside it, so the fake kernel reads header, ids and layer
// tables from it as the GPU's would. Shared with the operations that fill and read it (freed in
// stream order, as cudaFreeAsync).
struct FakeImage {
  explicit FakeImage(size_t bytes) : words((bytes + 7) / 8 + 1, kPoison) {}
  static constexpr uint64_t kPoison = 0xabababababababab;  // read before its upload: garbage
  uint8_t* bytes() { return reinterpret_cast<uint8_t*>(words.data()); }
  const kernels::PlanHeader& header() const {
    return *reinterpret_cast<const kernels::PlanHeader*>(words.data());
  }
  std::vector<uint64_t> words;
  int pending_readers = 0;  // kernels enqueued on it and not run yet
};

struct FakePlan final : public GpuPlan {
  std::shared_ptr<FakeImage> image;
  kernels::PlanImageLayout layout;
  size_t stream = 0;  // of its upload
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

// The kernel's work for one tile, read from the uploaded image only: the walk of
// planner::ForEachTileRun over the image's header and tables, each chunk copied between the
// header's bases (kernels/plan_math.h, as the kernel and the host twin compute them).
void RunImageTile(const kernels::PlanHeader& h, uint32_t tile) {
  namespace k = ::kvrail::kernels;
  const k::TileDesc t = k::TileAt(h, tile);
  const uint64_t src = k::SideBase(h.src, h.src.base), dst = k::SideBase(h.dst, h.dst.base);
  auto copy = [&](uint64_t s, uint64_t d, uint64_t n) {
    std::memmove(reinterpret_cast<void*>(dst + d), reinterpret_cast<const void*>(src + s), n);
  };
  if (static_cast<k::ChunkKind>(h.chunk_kind) == k::ChunkKind::kBytes) {
    copy(h.src.origin + t.byte_begin, h.dst.origin + t.byte_begin, t.byte_end - t.byte_begin);
    return;
  }
  const auto* sb = reinterpret_cast<const uint32_t*>(h.src.block_table);
  const auto* db = reinterpret_cast<const uint32_t*>(h.dst.block_table);
  uint64_t pos = t.byte_begin;
  uint32_t c = static_cast<uint32_t>(pos / h.chunk_bytes);
  uint64_t r = pos % h.chunk_bytes;
  const k::LayerSpan layer = k::LayerAt(h, t.layer);
  while (pos < t.byte_end) {
    const k::ChunkSpan span = k::ChunkAtInLayer(h, sb, db, layer, t.part, c);
    const uint64_t n = std::min(span.bytes - r, t.byte_end - pos);
    copy(span.src + r, span.dst + r, n);
    pos += n;
    ++c;
    r = 0;
  }
}

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

uint64_t FakeGpuOps::upload_bytes() const {
  absl::MutexLock lock(&mu_);
  return upload_bytes_;
}

int FakeGpuOps::plans_made() const {
  absl::MutexLock lock(&mu_);
  return plans_made_;
}

int FakeGpuOps::id_uploads() const {
  absl::MutexLock lock(&mu_);
  return id_uploads_;
}

int FakeGpuOps::overwrites_while_read() const {
  absl::MutexLock lock(&mu_);
  return overwrites_while_read_;
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
  const kernels::PlanHeader& header = plan.header();
  p->layout = kernels::LayoutPlanImage(header);
  p->image = std::make_shared<FakeImage>(p->layout.bytes);
  p->stream = static_cast<Stream&>(stream).index;
  const uint64_t device = reinterpret_cast<uint64_t>(p->image->bytes());
  const auto src_base = reinterpret_cast<uint64_t>(src);
  const auto dst_base = reinterpret_cast<uint64_t>(dst);
  ++plans_made_;
  upload_bytes_ += p->layout.bytes;
  std::shared_ptr<FakeImage> image = p->image;
  const size_t n = p->layout.bytes;
  if (kernels::WritePlanImage(header, plan.src_blocks().data(), plan.dst_blocks().data(), src_base,
                              dst_base, device, staging, staging_bytes)) {
    // One copy from the staging, read when the stream gets there (as the copy engine reads it).
    Push(stream, Op{[image, staging, n] {
                      std::memcpy(image->bytes(), staging, n);
                      return true;
                    },
                    false});
  } else {
    // Pageable parts are staged now (the driver does so before cudaMemcpyAsync returns); pinned
    // tables are read when the stream gets there.
    auto now = std::make_shared<std::vector<uint8_t>>(n);
    kernels::WritePlanImage(header, plan.src_blocks().data(), plan.dst_blocks().data(), src_base,
                            dst_base, device, now->data(), n);
    const kernels::PlanImageLayout l = p->layout;
    const uint32_t* sb = plan.src_blocks().pinned() ? plan.src_blocks().data() : nullptr;
    const uint32_t* db = plan.dst_blocks().pinned() ? plan.dst_blocks().data() : nullptr;
    Push(stream, Op{[image, now, l, sb, db] {
                      std::memcpy(image->bytes(), now->data(), now->size());
                      if (sb != nullptr)
                        std::memcpy(image->bytes() + l.src_blocks_at, sb, 4 * l.src_n);
                      if (db != nullptr)
                        std::memcpy(image->bytes() + l.dst_blocks_at, db, 4 * l.dst_n);
                      return true;
                    },
                    false});
  }
  return std::unique_ptr<GpuPlan>(std::move(p));
}

absl::Status FakeGpuOps::UploadBlockIds(GpuPlan& resident, const planner::Plan& plan, void* staging,
                                        size_t staging_bytes) {
  absl::MutexLock lock(&mu_);
  auto& p = static_cast<FakePlan&>(resident);
  const kernels::PlanImageLayout& l = p.layout;
  if (plan.src_blocks().size() != l.src_n || plan.dst_blocks().size() != l.dst_n) {
    return absl::InvalidArgumentError(
        "fake GPU: block ids of another shape than the resident plan");
  }
  if (absl::Status s = Injected("UploadBlockIds"); !s.ok()) return s;
  if (p.image->pending_readers > 0) ++overwrites_while_read_;
  const kernels::PlanIdsSection ids = kernels::IdsSection(l);
  ++id_uploads_;
  upload_bytes_ += ids.bytes;
  std::shared_ptr<FakeImage> image = p.image;
  std::deque<Op>& queue = queues_[p.stream];  // the upload's stream
  if (kernels::WritePlanIds(l, plan.src_blocks().data(), plan.dst_blocks().data(), staging,
                            staging_bytes)) {
    queue.push_back(Op{[image, staging, ids] {
                         std::memcpy(image->bytes() + ids.at, staging, ids.bytes);
                         return true;
                       },
                       false});
    return absl::OkStatus();
  }
  auto now = std::make_shared<std::vector<uint8_t>>(ids.bytes);
  kernels::WritePlanIds(l, plan.src_blocks().data(), plan.dst_blocks().data(), now->data(),
                        now->size());
  const uint32_t* sb = plan.src_blocks().pinned() ? plan.src_blocks().data() : nullptr;
  const uint32_t* db = plan.dst_blocks().pinned() ? plan.dst_blocks().data() : nullptr;
  queue.push_back(Op{[image, now, l, sb, db, ids] {
                       std::memcpy(image->bytes() + ids.at, now->data(), ids.bytes);
                       if (sb != nullptr)
                         std::memcpy(image->bytes() + l.src_blocks_at, sb, 4 * l.src_n);
                       if (db != nullptr)
                         std::memcpy(image->bytes() + l.dst_blocks_at, db, 4 * l.dst_n);
                       return true;
                     },
                     false});
  return absl::OkStatus();
}

absl::Status FakeGpuOps::DisarmPlan(GpuPlan& plan, GpuStream& stream) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Injected("DisarmPlan"); !s.ok()) return s;
  std::shared_ptr<FakeImage> image = static_cast<FakePlan&>(plan).image;
  Push(stream, Op{[image] {
                    const uint32_t zero = 0;
                    std::memcpy(image->bytes() + offsetof(kernels::PlanHeader, num_tiles), &zero,
                                sizeof(zero));
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
  std::shared_ptr<FakeImage> image = static_cast<FakePlan&>(plan).image;
  ++image->pending_readers;
  Push(stream, Op{[this, image, begin, end]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                    if (fault_next_kernel_) {
                      fault_next_kernel_ = false;
                      faulted_ = true;
                      return false;
                    }
                    // Header, ids and layer tables as the image holds them when the kernel runs.
                    const kernels::PlanHeader h = image->header();
                    for (uint32_t t = begin; t < end && t < h.num_tiles; ++t) RunImageTile(h, t);
                    --image->pending_readers;
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

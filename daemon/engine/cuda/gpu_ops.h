// The GPU operations the CUDA engine's parts use, as one thin interface: streams, events, the
// stream-ordered word wait and write, plan upload, the copy and digest kernels, the copy engines
// and pinned host memory. CudaGpuOps (cuda_gpu_ops.h) calls the CUDA runtime; FakeGpuOps
// (fake_gpu_ops.h) runs the same streams on the CPU for tests. No CUDA header here: the engine's
// parts above it build and test without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/planner/planner.h"
#include "daemon/scheduler/cuda_batch_policy.h"

namespace kvrail::engine::cuda_detail {

// Handles an implementation hands out and takes back (each its own kind; never mixed).
class GpuStream {
 public:
  virtual ~GpuStream() = default;
};
class GpuEvent {
 public:
  virtual ~GpuEvent() = default;
};
// A plan resident on the GPU (header, block tables, the sides' bases), freed in its upload
// stream's order when destroyed.
class GpuPlan {
 public:
  virtual ~GpuPlan() = default;
};
// Per-tile source and destination digests on the GPU with their host mirror (kv_digest.h).
class GpuDigests {
 public:
  virtual ~GpuDigests() = default;
  // The mirror, valid for tiles whose CopyBackDigests an event has since passed.
  virtual uint64_t host_source(uint32_t tile) const = 0;
  virtual uint64_t host_destination(uint32_t tile) const = 0;
};
// Pinned host memory (mapped for the GPU when asked), freed when destroyed.
class HostMemory {
 public:
  virtual ~HostMemory() = default;
  virtual void* host() const = 0;
  virtual uint64_t device() const = 0;  // 0 unless mapped
};

// Threads per CTA of the engine's kernels.
constexpr int kThreadsPerCta = 512;

// Which digest kernel (kernels/kv_digest.h).
enum class DigestPass { kCopyHashSource, kHashSource, kHashDestination };

// One GPU's operations. Thread contract: an implementation is used by the dispatcher thread
// (every call), except HostMemory's words, which the gate watchdog reads and stores from the CPU.
class GpuOps {
 public:
  virtual ~GpuOps() = default;

  virtual int device() const = 0;
  // Lets this GPU's kernels and copies reach `peer`'s memory (once per pair).
  virtual absl::Status EnablePeerAccess(int peer) = 0;
  // The dispatcher's stream (made with the ops).
  virtual GpuStream& main_stream() = 0;
  virtual absl::StatusOr<std::unique_ptr<GpuStream>> CreateStream() = 0;
  virtual absl::StatusOr<std::unique_ptr<GpuEvent>> CreateEvent() = 0;

  virtual absl::Status Record(GpuEvent& event, GpuStream& stream) = 0;
  // Whether the stream has passed `event` (false while pending; an error shows in Wait).
  virtual bool Passed(GpuEvent& event) = 0;
  // Blocks until the stream has passed `event`: the first error of the work before it.
  // `*sticky`: the error leaves this GPU unusable for the process.
  virtual absl::Status Wait(GpuEvent& event, bool* sticky) = 0;
  // Blocks until everything enqueued on `stream` so far has run.
  virtual absl::Status Synchronize(GpuStream& stream) = 0;
  // GPU seconds between two passed events.
  virtual double Seconds(GpuEvent& from, GpuEvent& to) = 0;
  virtual absl::Status StreamWaitEvent(GpuStream& stream, GpuEvent& event) = 0;

  // cuStreamWaitValue32 (GEQ) and cuStreamWriteValue32 on a 32-bit word the GPU sees at
  // `device_word`; WordOpsAvailable says whether the driver offers both.
  virtual bool WordOpsAvailable() const = 0;
  virtual absl::Status WaitWord(GpuStream& stream, uint64_t device_word, uint32_t value) = 0;
  virtual absl::Status WriteWord(GpuStream& stream, uint64_t device_word, uint32_t value) = 0;
  // Stores the 64-bit `value` at `device_word` (mapped host memory) in `stream`'s order, after
  // every write enqueued before it on the stream is visible to the host: cuStreamWriteValue64
  // (its default memory barrier) where the device offers 64-bit stream memory operations, else a
  // one-thread kernel that fences (__threadfence_system) before its store. Job::DoneWord.
  virtual absl::Status WriteDoneWord(GpuStream& stream, uint64_t device_word, uint64_t value) = 0;

  // The plan with the sides' device-visible bases (nullptr for per-layer sides), uploaded in
  // `stream`'s order; through `staging` (pinned, `staging_bytes`) when given. Tables in pinned
  // memory are read later in stream order (kv_copy.h: DevicePlanBuffer::Upload).
  virtual absl::StatusOr<std::unique_ptr<GpuPlan>> UploadPlan(const planner::Plan& plan,
                                                              const uint8_t* src, uint8_t* dst,
                                                              GpuStream& stream, void* staging,
                                                              size_t staging_bytes) = 0;
  // Rewrites `resident`'s block ids with `plan`'s, in the stream order of its upload: `plan` has
  // the shape `resident` was uploaded for (kernels::PlanShapeKey of the header and the same
  // bases), so only the ids' section moves (kernels/plan_image.h: IdsSection); through `staging`
  // (pinned, `staging_bytes`) when the ids fit, else from the tables (pinned ones read later in
  // stream order). Kernels enqueued on that stream before read the old ids. After an error the
  // ids may be mixed: `resident` must not be launched again (kv_copy.h: UploadBlockIds).
  virtual absl::Status UploadBlockIds(GpuPlan& resident, const planner::Plan& plan, void* staging,
                                      size_t staging_bytes) = 0;
  // Zeroes the uploaded plan's tile count in `stream`'s order: kernels launched after it (or
  // waiting before it) copy nothing. The gate's abort.
  virtual absl::Status DisarmPlan(GpuPlan& plan, GpuStream& stream) = 0;
  virtual absl::Status LaunchCopy(GpuPlan& plan, uint32_t begin, uint32_t end, int ctas,
                                  GpuStream& stream) = 0;

  virtual absl::StatusOr<std::unique_ptr<GpuDigests>> CreateDigests(uint32_t num_tiles,
                                                                    GpuStream& stream) = 0;
  virtual absl::Status LaunchDigest(GpuPlan& plan, uint32_t begin, uint32_t end, DigestPass pass,
                                    GpuDigests& digests, int ctas, GpuStream& stream) = 0;
  // Enqueues the copy of tiles [begin, end)'s digests into the host mirror (the main stream).
  virtual absl::Status CopyBackDigests(GpuDigests& digests, uint32_t begin, uint32_t end) = 0;

  // The copy engines: `runs` (offsets from `src` / `dst`) as one batch on `stream`.
  virtual absl::Status CopyRuns(const std::vector<scheduler::CopyRun>& runs, const uint8_t* src,
                                uint8_t* dst, GpuStream& stream) = 0;

  // Pinned host memory of `bytes` (zeroed); `mapped`: with a device address too.
  virtual absl::StatusOr<std::unique_ptr<HostMemory>> AllocHost(size_t bytes, bool mapped) = 0;
};

}  // namespace kvrail::engine::cuda_detail

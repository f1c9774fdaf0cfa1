// The CUDA engine: one dispatcher thread and one stream per GPU. It executes what the scheduler's
// pure policy decides (//daemon/scheduler: tile_queues for the order, cuda_batch_policy for
// batches, mode and CTAs); see docs/architecture.md ("CUDA engine").
#include "daemon/engine/cuda/cuda_engine.h"

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/cuda/context_sync.h"
#include "base/cuda/cuda_util.h"
#include "base/status.h"
#include "daemon/engine/cuda/cuda_gpu_ops.h"
#include "daemon/engine/cuda/device_worker.h"
#include "daemon/planner/table_pool.h"
#include "daemon/scheduler/cuda_batch_policy.h"

namespace kvrail::engine {
namespace {

using cuda_detail::DeviceWorker;
// Pinned block-table memory kept free for the next plans (a 262k-block transfer needs 2 MiB).
constexpr uint64_t kRetainedTableBytes = 64 << 20;
// Pinned table buffers made at start, per size class from 4 KiB to 4 MiB (two each): a first
// plan finds its tables' memory without a cudaHostAlloc.
constexpr size_t kWarmTableMinBytes = 4 << 10, kWarmTableMaxBytes = 4 << 20;

// Routes each job to the worker of its executing GPU. Thread-safe (workers are fixed at
// creation; each guards its own queues).
class CudaEngine final : public Engine {
 public:
  CudaEngine(std::vector<std::unique_ptr<DeviceWorker>> workers, std::vector<int> devices,
             bool run_on_destination)
      : workers_(std::move(workers)),
        devices_(std::move(devices)),
        run_on_destination_(run_on_destination),
        tables_(planner::TablePool::Create(PinnedAllocator(), kRetainedTableBytes)) {
    // Pinned table memory made now, not inside a first transfer (cudaHostAlloc costs up to
    // milliseconds): taken and given straight back, it stays in the pool for the first plans.
    std::vector<planner::TableAllocator::Memory> warm;
    for (size_t bytes = kWarmTableMinBytes; bytes <= kWarmTableMaxBytes; bytes *= 2) {
      warm.push_back(tables_->Take(bytes));
      warm.push_back(tables_->Take(bytes));
    }
  }

  std::string name() const override { return "cuda"; }

  void Enqueue(const std::shared_ptr<Job>& job, const std::vector<uint32_t>& tiles) override {
    if (tiles.empty()) return;
    const int device = ExecutingDevice(job->src(), job->dst());
    DeviceWorker* worker = Worker(device);
    if (worker == nullptr) {
      const absl::Status status =
          absl::FailedPreconditionError(absl::StrCat("the CUDA engine does not serve GPU", device));
      for (uint32_t t : tiles) {
        job->OnTileStart(t);
        job->OnTileDone(t, status);
      }
      return;
    }
    worker->Enqueue(job, tiles);
  }

  bool AdmitGated(const std::shared_ptr<Job>& job) override {
    DeviceWorker* worker = Worker(ExecutingDevice(job->src(), job->dst()));
    return worker != nullptr && worker->AdmitGated(job);
  }

  void Expect(const Placement& src, const Placement& dst) override {
    DeviceWorker* worker = Worker(ExecutingDevice(src, dst));
    if (worker != nullptr) worker->Expect();
  }

  size_t Remove(const Job* job) override {
    size_t removed = 0;
    for (auto& w : workers_) removed += w->Remove(job);
    return removed;
  }

  Capabilities capabilities() const override {
    Capabilities caps;
    caps.gpu_memory = true;
    caps.gpu_count = static_cast<int>(devices_.size());
    // Every job is offered: AdmitGated decides (cuda_stream_wait) and notes why it declined.
    caps.gated_admission = true;
    caps.digest = true;
    caps.table_pool = tables_.get();
    return caps;
  }

  void FinishStartedFirst() override {
    for (auto& w : workers_) w->FinishStartedFirst();
  }

  std::vector<uint64_t> QueuedTiles() const override {
    std::vector<uint64_t> out(kNumPriorityClasses, 0);
    for (const auto& w : workers_) w->AddQueued(&out);
    return out;
  }

  // Summed over the GPUs (counters and what is kept alike).
  std::map<std::string, double> Gauges() const override {
    std::map<std::string, double> out;
    for (const auto& w : workers_) {
      for (const auto& [name, value] : w->Gauges()) out[name] += value;
    }
    return out;
  }

  std::string Describe() const override {
    std::vector<std::string> lines;
    for (const auto& w : workers_) lines.push_back(w->Describe());
    if (run_on_destination_) lines.push_back("GPU-to-GPU transfers run on the destination GPU");
    return absl::StrJoin(lines, "; ");
  }

 private:
  // The GPU whose dispatcher runs a job between `src` and `dst` (scheduler::ExecutingDevice):
  // one answer for Enqueue, AdmitGated and Expect, so a job is admitted, woken for and queued on
  // the same worker.
  int ExecutingDevice(const Placement& src, const Placement& dst) const {
    return scheduler::ExecutingDevice(src.cuda, src.device, dst.cuda, dst.device,
                                      run_on_destination_, devices_.front());
  }
  // nullptr when the engine does not serve `device`.
  DeviceWorker* Worker(int device) const {
    for (size_t i = 0; i < devices_.size(); ++i) {
      if (devices_[i] == device) return workers_[i].get();
    }
    return nullptr;
  }

  // Portable pinned host memory: any of the engine's GPUs copies from it without staging.
  static planner::TablePool::Allocator PinnedAllocator() {
    planner::TablePool::Allocator a;
    a.allocate = [](size_t bytes) -> void* {
      void* memory = nullptr;
      cuda::ContextSyncScope sync("cudaHostAlloc(block tables)");
      if (cudaHostAlloc(&memory, bytes, cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
      }
      return memory;
    };
    a.release = [](void* memory) {
      cuda::ContextSyncScope sync("cudaFreeHost(block tables)");
      cudaFreeHost(memory);
    };
    a.pinned = true;
    return a;
  }

  const std::vector<std::unique_ptr<DeviceWorker>> workers_;
  const std::vector<int> devices_;
  const bool run_on_destination_;
  const std::shared_ptr<planner::TablePool> tables_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> CreateCudaEngine(const CudaEngineOptions& options) {
  KVRAIL_ASSIGN_OR_RETURN(const int count, cuda::DeviceCount());
  std::vector<int> devices = options.devices;
  if (devices.empty()) {
    for (int d = 0; d < count; ++d) devices.push_back(d);
  }
  std::vector<std::unique_ptr<DeviceWorker>> workers;
  for (int d : devices) {
    if (d < 0 || d >= count) {
      return absl::InvalidArgumentError(absl::StrCat("cuda devices: GPU", d, " does not exist"));
    }
    KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<cuda_detail::GpuOps> ops,
                            cuda_detail::CreateCudaGpuOps(d));
    workers.push_back(std::make_unique<DeviceWorker>(options, std::move(ops)));
  }
  // Serving starts warm (CudaEngineOptions::warm_up): every dispatcher has loaded its kernels.
  for (const auto& w : workers) w->AwaitWarm();
  return std::unique_ptr<Engine>(
      new CudaEngine(std::move(workers), std::move(devices), options.run_on_destination));
}

}  // namespace kvrail::engine

// Pinned staging for plan uploads (CudaEngineOptions::staged_plan_upload): slots of
// kStagingSlotBytes (a plan image of up to ~32k block ids in all fits whole), each reused once
// the stream has passed its latest upload.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "daemon/engine/cuda/gpu_ops.h"

namespace kvrail::engine::cuda_detail {

constexpr size_t kStagingSlots = 8;
constexpr size_t kStagingSlotBytes = 128 << 10;

// Thread contract: the dispatcher thread only.
class PlanStager {
 public:
  struct Slot {
    void* memory = nullptr;
    std::unique_ptr<GpuEvent> passed;  // recorded after the slot's latest upload
    bool recorded = false;
  };

  explicit PlanStager(GpuOps* ops) : ops_(ops) {}

  // Before serving (cudaHostAlloc may synchronize the context). Without it uploads go unstaged.
  absl::Status Make();
  // A slot whose last upload the stream has passed (round robin), or nullptr when none is made
  // or all are still in use (the upload then goes unstaged).
  Slot* Take();
  // The slot's upload was enqueued on the main stream: it is reused once that has passed.
  absl::Status Used(Slot& slot);

 private:
  GpuOps* const ops_;
  std::unique_ptr<HostMemory> memory_;
  std::vector<Slot> slots_;
  size_t next_ = 0;
};

}  // namespace kvrail::engine::cuda_detail

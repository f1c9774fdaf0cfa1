#include "daemon/engine/cuda/plan_stager.h"

#include <cstdint>
#include <utility>

#include "base/status.h"

namespace kvrail::engine::cuda_detail {

absl::Status PlanStager::Make() {
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<HostMemory> memory,
                          ops_->AllocHost(kStagingSlots * kStagingSlotBytes, /*mapped=*/false));
  std::vector<Slot> slots(kStagingSlots);
  for (size_t i = 0; i < kStagingSlots; ++i) {
    slots[i].memory = static_cast<uint8_t*>(memory->host()) + i * kStagingSlotBytes;
    KVRAIL_ASSIGN_OR_RETURN(slots[i].passed, ops_->CreateEvent());
  }
  memory_ = std::move(memory);
  slots_ = std::move(slots);
  return absl::OkStatus();
}

PlanStager::Slot* PlanStager::Take() {
  for (size_t i = 0; i < slots_.size(); ++i) {
    const size_t k = (next_ + i) % slots_.size();
    Slot& slot = slots_[k];
    if (slot.recorded && !ops_->Passed(*slot.passed)) continue;
    next_ = (k + 1) % slots_.size();
    return &slot;
  }
  return nullptr;
}

absl::Status PlanStager::Used(Slot& slot) {
  KVRAIL_RETURN_IF_ERROR(ops_->Record(*slot.passed, ops_->main_stream()));
  slot.recorded = true;
  return absl::OkStatus();
}

}  // namespace kvrail::engine::cuda_detail

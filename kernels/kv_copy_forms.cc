#include "kernels/kv_copy_forms.h"

#include "absl/strings/str_cat.h"
#include "kernels/kv_copy_forms_launch.h"
#include "kernels/kv_copy_launch.h"

namespace kvrail::kernels {

absl::Status LaunchKvCopyForm(const DevicePlan& plan, uint32_t tile_begin, uint32_t tile_end,
                              int num_ctas, CudaStream stream, SegmentForm form,
                              int threads_per_cta) {
  if (!plan.segments || plan.piece_bytes != 0) {
    return LaunchKvCopy(plan, tile_begin, tile_end, num_ctas, stream, threads_per_cta);
  }
  if (tile_end > plan.num_tiles || tile_begin > tile_end) {
    return absl::InvalidArgumentError(absl::StrCat("tiles [", tile_begin, ", ", tile_end,
                                                   ") outside the plan's ", plan.num_tiles));
  }
  absl::StatusOr<KernelArch> arch = CurrentKernelArch();
  if (!arch.ok()) return arch.status();
  if (form == SegmentForm::kDefault) form = SegmentFormOn(form, *arch);
  if (IsBulkSegmentForm(form) && !HasBulkCopies(*arch)) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment form ", static_cast<int>(form), " needs bulk copies (sm_",
                     kBulkCopyArch, "); this GPU runs the kernels as sm_", arch->code_arch));
  }
  const int error = internal::KvCopySegmentsFormLaunch(plan.header, tile_begin, tile_end, num_ctas,
                                                       threads_per_cta, form, stream);
  if (error == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("kv_copy launch (segment form ", static_cast<int>(form),
                                          "): ", internal::ErrorName(error), ": ",
                                          internal::ErrorString(error)));
}

}  // namespace kvrail::kernels

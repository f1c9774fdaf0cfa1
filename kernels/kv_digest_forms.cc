#include "kernels/kv_digest_forms.h"

#include "absl/strings/str_cat.h"
#include "kernels/kv_digest_forms_launch.h"
#include "kernels/kv_digest_launch.h"

namespace kvrail::kernels {

absl::Status LaunchKvDigestForm(const DevicePlan& plan, uint32_t tile_begin, uint32_t tile_end,
                                DigestKernelMode mode, uint64_t* tile_digests, int num_ctas,
                                CudaStream stream, int threads_per_cta) {
  if (tile_end > plan.num_tiles || tile_begin > tile_end) {
    return absl::InvalidArgumentError(absl::StrCat("tiles [", tile_begin, ", ", tile_end,
                                                   ") outside the plan's ", plan.num_tiles));
  }
  if (num_ctas <= 0 || threads_per_cta <= 0 || threads_per_cta > 512 || threads_per_cta % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad launch shape: ", num_ctas, " CTAs x ", threads_per_cta, " threads"));
  }
  if (tile_digests == nullptr) return absl::InvalidArgumentError("tile_digests: null");
  absl::StatusOr<KernelArch> arch = CurrentKernelArch();
  if (!arch.ok()) return arch.status();
  if ((mode == DigestKernelMode::kCopyHashSourceBulkLoadForBenchmark ||
       mode == DigestKernelMode::kCopyNoHashBulkLoadForBenchmark) &&
      !HasBulkCopies(*arch)) {
    return absl::FailedPreconditionError(
        absl::StrCat("digest mode ", static_cast<int>(mode), " needs bulk copies (sm_",
                     kBulkCopyArch, "); this GPU runs the kernels as sm_", arch->code_arch));
  }
  const int error = internal::KvDigestFormLaunch(
      plan.header, tile_begin, tile_end, static_cast<int>(mode), tile_digests, num_ctas,
      threads_per_cta, plan.access_bytes, plan.piece_bytes,
      static_cast<int>(DigestStagingOn(*arch)), stream);
  if (error == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("kv_digest launch (mode ", static_cast<int>(mode),
                                          "): ", internal::DigestErrorName(error), ": ",
                                          internal::DigestErrorString(error)));
}

}  // namespace kvrail::kernels

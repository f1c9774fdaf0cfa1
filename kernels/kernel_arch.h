// Which kernel forms a GPU may run, decided from what it runs the kernels AS (pure functions over
// a probed KernelArch; the probe is kv_copy.h: CurrentKernelArch).
//
// The kernel libraries are fat binaries (bazel/cuda.bzl): SASS for sm_80, sm_89 and sm_90a (plus
// sm_100 in release builds) and PTX for compute_90. The driver runs the SASS built for the GPU, or
// JIT-compiles the newest PTX not newer than it. So what a kernel may use is fixed by the
// architecture its loaded code was compiled for (cudaFuncAttributes::ptxVersion), which can be
// older than the GPU: compute_80 PTX JIT-compiled on an H100 is code for sm_80. Every kernel has a
// form that compiles for sm_80 (16-byte vector loads and stores, cp.async); the forms built on
// sm_90's bulk copies (cp.async.bulk, the SM's TMA unit) and transaction-count mbarriers exist
// only in code compiled for sm_90 or newer (in older code their bodies trap), so the host must
// never launch them unless HasBulkCopies says so.
#pragma once

#include "kernels/segment_math.h"

namespace kvrail::kernels {

// Compute capabilities as major * 10 + minor: 80 A100, 86 A10/A40, 89 L4/L40(S), 90 H100/H200,
// 100 B200.
struct KernelArch {
  // probe: the GPU's compute capability.
  int device_cc = 0;
  // probe: the architecture the GPU's loaded kernel code was compiled for (<= device_cc).
  int code_arch = 0;
};

// The oldest architecture the kernels are built for (cp.async needs sm_80).
inline constexpr int kMinKernelArch = 80;
// Bulk copies and transaction-count mbarriers.
inline constexpr int kBulkCopyArch = 90;

// Whether the kernels can run at all (the binary holds code for the GPU and it is sm_80 or newer;
// an older GPU fails its first launch with cudaErrorNoKernelImageForDevice instead).
inline constexpr bool RunsKernels(const KernelArch& a) {
  return a.code_arch >= kMinKernelArch && a.device_cc >= a.code_arch;
}

// Whether the bulk-copy forms (the bulk-staged segment form, the digest's bulk staging) may run.
inline constexpr bool HasBulkCopies(const KernelArch& a) {
  return RunsKernels(a) && a.code_arch >= kBulkCopyArch;
}

inline constexpr bool IsBulkSegmentForm(SegmentForm form) {
  return form == SegmentForm::kDefault || form == SegmentForm::kBulk3 ||
         form == SegmentForm::kBulk2;
}

// The segment form a plan that asked for `form` (segment_math.h: SegmentFormFor) runs on `a`:
// without bulk copies the bulk-staged forms become the split register form (cp.async for its
// partial units), which moves any segment-path plan; every other form is kept.
inline constexpr SegmentForm SegmentFormOn(SegmentForm form, const KernelArch& a) {
  return IsBulkSegmentForm(form) && !HasBulkCopies(a) ? SegmentForm::kSplit6 : form;
}

// How the digest's staged warp kernel moves a piece (kv_digest_kernels.cuh): per-lane 16-byte
// cp.async into a shared-memory ring and stores from registers (kLaneCopies); one bulk copy per
// piece into the ring and stores from registers (kBulkLoad); or bulk copies both ways
// (kBulkLoadStore).
enum class DigestStaging : int { kLaneCopies = 0, kBulkLoad = 1, kBulkLoadStore = 2 };

// The staging the daemon's digest launches use on `a`: bulk copies both ways where they exist
// (docs/benchmarks.md: the fastest on an H200), per-lane cp.async otherwise.
inline constexpr DigestStaging DigestStagingOn(const KernelArch& a) {
  return HasBulkCopies(a) ? DigestStaging::kBulkLoadStore : DigestStaging::kLaneCopies;
}

// Whether a staging may run on `a`.
inline constexpr bool DigestStagingRuns(DigestStaging staging, const KernelArch& a) {
  return staging == DigestStaging::kLaneCopies || HasBulkCopies(a);
}

}  // namespace kvrail::kernels

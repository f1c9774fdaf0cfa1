// The kernel forms each GPU may run (kernel_arch.h): no bulk-copy form on code older than sm_90,
// whatever the GPU, and every form with a pre-sm_90 path keeps it.
#include "kernels/kernel_arch.h"

#include <catch2/catch.hpp>

namespace kvrail::kernels {
namespace {

constexpr KernelArch kA100{80, 80};
constexpr KernelArch kA10{86, 80};  // sm_80 SASS runs on sm_86
constexpr KernelArch kL40{89, 89};
constexpr KernelArch kH100{90, 90};
constexpr KernelArch kB200Jit{100, 90};   // compute_90 PTX JIT-compiled
constexpr KernelArch kB200{100, 100};     // release build: sm_100 SASS
constexpr KernelArch kH100Ptx80{90, 80};  // compute_80 PTX JIT-compiled on an H100
constexpr KernelArch kV100{70, 70};       // no code in the binary runs there
constexpr KernelArch kNotProbed{0, 0};

TEST_CASE("bulk copies exactly where the loaded code is sm_90 or newer") {
  CHECK_FALSE(HasBulkCopies(kA100));
  CHECK_FALSE(HasBulkCopies(kA10));
  CHECK_FALSE(HasBulkCopies(kL40));
  CHECK_FALSE(HasBulkCopies(kH100Ptx80));  // the GPU has them, its code does not
  CHECK(HasBulkCopies(kH100));
  CHECK(HasBulkCopies(kB200Jit));
  CHECK(HasBulkCopies(kB200));
  CHECK_FALSE(HasBulkCopies(kV100));
  CHECK_FALSE(HasBulkCopies(kNotProbed));
}

TEST_CASE("the kernels run on sm_80 and newer only") {
  for (const KernelArch& a : {kA100, kA10, kL40, kH100, kB200Jit, kB200, kH100Ptx80}) {
    INFO(a.device_cc << " as " << a.code_arch);
    CHECK(RunsKernels(a));
  }
  CHECK_FALSE(RunsKernels(kV100));
  CHECK_FALSE(RunsKernels(kNotProbed));
  CHECK_FALSE(RunsKernels(KernelArch{80, 90}));  // code newer than the GPU: not a real probe
}

TEST_CASE("bulk-staged segment forms become the split form without bulk copies") {
  for (const KernelArch& a : {kA100, kA10, kL40, kH100Ptx80}) {
    INFO(a.device_cc << " as " << a.code_arch);
    for (SegmentForm f : {SegmentForm::kDefault, SegmentForm::kBulk3, SegmentForm::kBulk2}) {
      CHECK(SegmentFormOn(f, a) == SegmentForm::kSplit6);
    }
    // The forms without bulk copies are kept.
    for (SegmentForm f : {SegmentForm::kRegisters, SegmentForm::kSplit4, SegmentForm::kSplit6,
                          SegmentForm::kSplit4x2, SegmentForm::kSplit6x2}) {
      CHECK(SegmentFormOn(f, a) == f);
    }
    // What the daemon's library launches stays one of its forms.
    CHECK(IsDaemonSegmentForm(SegmentFormOn(SegmentForm::kDefault, a)));
  }
  for (const KernelArch& a : {kH100, kB200Jit, kB200}) {
    for (SegmentForm f : {SegmentForm::kDefault, SegmentForm::kBulk3, SegmentForm::kBulk2,
                          SegmentForm::kSplit6, SegmentForm::kRegisters}) {
      CHECK(SegmentFormOn(f, a) == f);
    }
  }
}

TEST_CASE("the digest stages with bulk copies where they exist, cp.async otherwise") {
  CHECK(DigestStagingOn(kH100) == DigestStaging::kBulkLoadStore);
  CHECK(DigestStagingOn(kB200Jit) == DigestStaging::kBulkLoadStore);
  for (const KernelArch& a : {kA100, kA10, kL40, kH100Ptx80}) {
    CHECK(DigestStagingOn(a) == DigestStaging::kLaneCopies);
    CHECK(DigestStagingRuns(DigestStaging::kLaneCopies, a));
    CHECK_FALSE(DigestStagingRuns(DigestStaging::kBulkLoad, a));
    CHECK_FALSE(DigestStagingRuns(DigestStaging::kBulkLoadStore, a));
  }
  CHECK(DigestStagingRuns(DigestStaging::kBulkLoad, kH100));
}

}  // namespace
}  // namespace kvrail::kernels

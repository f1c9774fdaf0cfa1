// The copy kernel's launch checks that need no GPU: refused before any CUDA call.
#include "kernels/kv_copy.h"

#include <catch2/catch.hpp>

#include "kernels/segment_math.h"

namespace kvrail::kernels {
namespace {

TEST_CASE("LaunchKvCopy runs the daemon's segment forms only; a benchmark form is refused") {
  DevicePlan plan;
  plan.num_tiles = 4;
  plan.segments = true;
  for (SegmentForm form : {SegmentForm::kRegisters, SegmentForm::kBulk2, SegmentForm::kSplit4,
                           SegmentForm::kSplit4x2, SegmentForm::kSplit6x2}) {
    INFO(static_cast<int>(form));
    CHECK_FALSE(IsDaemonSegmentForm(form));
    plan.segment_form = form;
    const absl::Status s = LaunchKvCopy(plan, 0, 4, 8, nullptr);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find("segment_form") != std::string::npos);
  }
  for (SegmentForm form : {SegmentForm::kDefault, SegmentForm::kBulk3, SegmentForm::kSplit6}) {
    CHECK(IsDaemonSegmentForm(form));
  }
}

TEST_CASE("a launch asks the device nothing: the form comes from the arch Upload probed") {
  // An empty range of a segment-path plan: nothing is launched, and nothing is probed either
  // (where no GPU answers, a probe per launch would fail it).
  DevicePlan plan;
  plan.num_tiles = 4;
  plan.segments = true;
  for (const KernelArch arch : {KernelArch{}, KernelArch{90, 90}, KernelArch{90, 80}}) {
    plan.arch = arch;
    plan.segment_form = SegmentForm::kDefault;
    CHECK(LaunchKvCopy(plan, 2, 2, 8, nullptr).ok());
  }
}

}  // namespace
}  // namespace kvrail::kernels

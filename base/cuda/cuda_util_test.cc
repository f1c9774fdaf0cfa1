// The CUDA helpers that need no device: error conversion and the sticky-error classification the
// CUDA engine uses to stop using a GPU whose context a kernel fault has broken.
#define CATCH_CONFIG_MAIN
#include "base/cuda/cuda_util.h"

#include <catch2/catch.hpp>

namespace kvrail::cuda {
namespace {

TEST_CASE("kernel faults are sticky; argument and resource errors are not") {
  CHECK(IsStickyError(cudaErrorIllegalAddress));
  CHECK(IsStickyError(cudaErrorLaunchFailure));
  CHECK(IsStickyError(cudaErrorMisalignedAddress));
  CHECK(IsStickyError(cudaErrorAssert));
  CHECK_FALSE(IsStickyError(cudaSuccess));
  CHECK_FALSE(IsStickyError(cudaErrorInvalidValue));
  CHECK_FALSE(IsStickyError(cudaErrorMemoryAllocation));
  CHECK_FALSE(IsStickyError(cudaErrorPeerAccessAlreadyEnabled));
  CHECK_FALSE(IsStickyError(cudaErrorNotReady));
}

TEST_CASE("CUDA errors become Status with the runtime's name and the caller's words") {
  CHECK(CudaStatus(cudaSuccess, "x").ok());
  const absl::Status s = CudaStatus(cudaErrorInvalidValue, "cudaMemcpyAsync");
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(std::string(s.message()).find("cudaMemcpyAsync: cudaErrorInvalidValue") == 0);
  CHECK(CudaStatus(cudaErrorInvalidValue, "h", absl::StatusCode::kInvalidArgument).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("no GPU is FAILED_PRECONDITION with a reason; a GPU is a positive count") {
  const absl::StatusOr<int> count = DeviceCount();
  if (count.ok()) {
    CHECK(*count > 0);
  } else {
    CHECK(count.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(!count.status().message().empty());
  }
}

}  // namespace
}  // namespace kvrail::cuda

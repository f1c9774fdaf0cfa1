// The CUDA helpers that need no device: error conversion and the sticky-error classification the
// CUDA engine uses to stop using a GPU whose context a kernel fault has broken.
#include "base/cuda/cuda_util.h"

#include <catch2/catch.hpp>
#include <string>

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

TEST_CASE("a driver function the driver lacks is nullptr, and the runtime's error is cleared") {
  // Without a driver the query itself fails; with one, the name is not found: nullptr both ways.
  CHECK(DriverEntryPoint("cuKvrailNoSuchFunction") == nullptr);
  // With a GPU the next runtime call sees no stale error (without a driver every runtime call
  // reports the missing driver, cleared or not).
  if (DeviceCount().ok()) CHECK(cudaGetLastError() == cudaSuccess);
}

// A fake runtime's current device for ScopedDevice (this thread's only).
struct FakeRuntime {
  int current = 1;
  int sets = 0;
  cudaError_t get_error = cudaSuccess;
  cudaError_t set_error = cudaSuccess;
};
thread_local FakeRuntime fake;

cudaError_t FakeGet(int* device) {
  if (fake.get_error != cudaSuccess) return fake.get_error;
  *device = fake.current;
  return cudaSuccess;
}

cudaError_t FakeSet(int device) {
  ++fake.sets;
  if (fake.set_error != cudaSuccess) return fake.set_error;
  fake.current = device;
  return cudaSuccess;
}

TEST_CASE("ScopedDevice selects a device for its scope and restores the thread's previous one") {
  fake = FakeRuntime{};
  fake.current = 1;
  {
    ScopedDevice on(3, &FakeGet, &FakeSet);
    CHECK(on.status().ok());
    CHECK(fake.current == 3);
    {
      ScopedDevice nested(0, &FakeGet, &FakeSet);  // nested guards unwind in order
      CHECK(fake.current == 0);
    }
    CHECK(fake.current == 3);
  }
  CHECK(fake.current == 1);  // what ~CudaMappingImpl used to leave at 3
  CHECK(fake.sets == 4);
}

TEST_CASE("ScopedDevice: the current device already, no runtime call either way") {
  fake = FakeRuntime{};
  fake.current = 2;
  {
    ScopedDevice on(2, &FakeGet, &FakeSet);
    CHECK(on.status().ok());
  }
  CHECK(fake.current == 2);
  CHECK(fake.sets == 0);
}

TEST_CASE("ScopedDevice: failures change nothing and say why") {
  fake = FakeRuntime{};
  fake.current = 1;
  fake.set_error = cudaErrorInvalidDevice;
  {
    ScopedDevice on(9, &FakeGet, &FakeSet);
    CHECK(on.status().code() == absl::StatusCode::kInternal);
    CHECK(std::string(on.status().message()).find("cudaSetDevice(9): cudaErrorInvalidDevice") == 0);
  }
  CHECK(fake.current == 1);
  CHECK(fake.sets == 1);  // no restore of a device that never changed

  fake = FakeRuntime{};
  fake.current = 1;
  fake.get_error = cudaErrorNoDevice;
  {
    ScopedDevice on(3, &FakeGet, &FakeSet);
    CHECK(std::string(on.status().message()).find("cudaGetDevice: cudaErrorNoDevice") == 0);
  }
  CHECK(fake.current == 1);  // the previous device is unknown: the thread's device is not touched
  CHECK(fake.sets == 0);
}

}  // namespace
}  // namespace kvrail::cuda

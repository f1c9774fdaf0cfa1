// CUDA region validation: without a GPU driver (CI) every MEMORY_KIND_CUDA spec fails with
// FAILED_PRECONDITION naming spec.memory_kind, before the share is looked at; with a GPU, bad
// shares name spec.share.cuda_ipc_handle (tests/gpu covers real imports).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <string>

#include "base/clock.h"
#include "base/cuda/cuda_util.h"
#include "daemon/regions/regions.h"

namespace kvrail::regions {
namespace {

v1::RegionSpec CudaSpec() {
  v1::RegionSpec spec;
  spec.set_name("gpu-pool");
  spec.set_memory_kind(v1::MEMORY_KIND_CUDA);
  spec.set_device(0);
  spec.set_size_bytes(1 << 20);
  spec.mutable_bytes();
  spec.set_writable(true);
  spec.mutable_share()->set_cuda_ipc_handle(std::string(64, '\x01'));
  return spec;
}

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

TEST_CASE("CUDA specs: the share must be a 64-byte CUDA IPC handle") {
  if (!cuda::DeviceCount().ok()) {
    WARN("no CUDA device: the share checks need one (the no-driver case below covers CI)");
    return;
  }
  auto table = RegionTable::Create(Clock::Real());
  v1::RegionSpec spec = CudaSpec();
  spec.mutable_share()->set_cuda_ipc_handle("short");
  auto r = table->Register(spec, 0);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(r.status(), "spec.share.cuda_ipc_handle"));
  CHECK(Contains(r.status(), "64 bytes"));

  spec = CudaSpec();
  spec.mutable_share()->set_shm_name("/x");
  r = table->Register(spec, 0);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(r.status(), "spec.share.cuda_ipc_handle"));
  CHECK(table->size() == 0);
}

TEST_CASE("host specs with a CUDA IPC handle say to set memory_kind") {
  auto table = RegionTable::Create(Clock::Real());
  v1::RegionSpec spec = CudaSpec();
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  auto r = table->Register(spec, 0);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(r.status(), "MEMORY_KIND_CUDA"));
}

TEST_CASE("layout errors come before any CUDA call") {
  auto table = RegionTable::Create(Clock::Real());
  v1::RegionSpec spec = CudaSpec();
  spec.set_size_bytes(0);
  auto r = table->Register(spec, 0);
  REQUIRE(!r.ok());
  CHECK(Contains(r.status(), "spec.size_bytes"));
}

TEST_CASE("without a CUDA driver or device: FAILED_PRECONDITION naming spec.memory_kind") {
  if (cuda::DeviceCount().ok()) {
    WARN("a CUDA device is present: the no-driver case is covered on CI machines only");
    return;
  }
  auto table = RegionTable::Create(Clock::Real());
  v1::RegionSpec bad_share = CudaSpec();
  bad_share.mutable_share()->set_fd_token("t");
  v1::RegionSpec short_handle = CudaSpec();
  short_handle.mutable_share()->set_cuda_ipc_handle("short");
  for (const v1::RegionSpec& spec : {CudaSpec(), bad_share, short_handle}) {
    auto r = table->Register(spec, 0);
    REQUIRE(!r.ok());
    INFO(r.status().ToString());
    CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Contains(r.status(), "spec.memory_kind"));
  }
  CHECK(table->size() == 0);
}

}  // namespace
}  // namespace kvrail::regions

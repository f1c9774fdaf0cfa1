// CUDA region validation: without a GPU driver (CI) every MEMORY_KIND_CUDA spec fails with
// FAILED_PRECONDITION naming spec.memory_kind, before the share is looked at; with a GPU, bad
// shares name spec.share.cuda_ipc_handle (tests/gpu covers real imports).
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "base/clock.h"
#include "base/cuda/cuda_util.h"
#include "daemon/regions/regions.h"
#include "daemon/regions/test_tables.h"

namespace kvrail::regions {
namespace {

using testing::Tables;

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
  Tables tables;
  RegionTable* table = tables.regions.get();
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
  Tables tables;
  RegionTable* table = tables.regions.get();
  v1::RegionSpec spec = CudaSpec();
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  auto r = table->Register(spec, 0);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(r.status(), "MEMORY_KIND_CUDA"));
}

TEST_CASE("layout errors come before any CUDA call") {
  Tables tables;
  RegionTable* table = tables.regions.get();
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
  Tables tables;
  RegionTable* table = tables.regions.get();
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

namespace kvrail::regions {
namespace {

// A cuMem share whose chunk is a plain memfd: on CI (no driver) the daemon refuses before any
// import, on a GPU machine the import refuses the fd; either way the error names the field and
// the client's fd token is not lost.
TEST_CASE("cuMem shares: errors name the field and give the fd tokens back") {
  Tables tables;
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  UniqueFd fd(::memfd_create("not-cumem", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(fd.valid());
  REQUIRE(::ftruncate(fd.get(), 1 << 21) == 0);
  auto token = session_table->AddFd(session, UniqueFd(::dup(fd.get())));
  REQUIRE(token.ok());
  v1::RegionSpec spec = CudaSpec();
  spec.mutable_share()->Clear();
  v1::CudaVmmChunk* chunk = spec.mutable_share()->mutable_cuda_vmm()->add_chunks();
  chunk->set_fd_token(*token);
  chunk->set_size_bytes(1 << 21);
  auto r = table->Register(spec, session);
  INFO(r.status().ToString());
  REQUIRE(!r.ok());
  if (!cuda::DeviceCount().ok()) {
    CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Contains(r.status(), "spec.memory_kind"));
  } else {
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Contains(r.status(), "spec.share.cuda_vmm.chunks[0].fd_token"));
  }
  // The token is still the client's: usable once more (here for host memory).
  v1::RegionSpec host;
  host.set_memory_kind(v1::MEMORY_KIND_HOST);
  host.set_size_bytes(1 << 21);
  host.mutable_bytes();
  host.mutable_share()->set_fd_token(*token);
  auto again = table->Register(host, session);
  INFO(again.status().ToString());
  CHECK(again.ok());

  // Another session's token is refused, naming the chunk.
  const uint64_t other = session_table->BeginSession();
  auto foreign = session_table->AddFd(other, UniqueFd(::dup(fd.get())));
  REQUIRE(foreign.ok());
  chunk->set_fd_token(*foreign);
  if (cuda::DeviceCount().ok()) {
    auto stolen = table->Register(spec, session);
    CHECK(stolen.status().code() == absl::StatusCode::kPermissionDenied);
    CHECK(Contains(stolen.status(), "spec.share.cuda_vmm.chunks[0].fd_token"));
  }
}

}  // namespace
}  // namespace kvrail::regions

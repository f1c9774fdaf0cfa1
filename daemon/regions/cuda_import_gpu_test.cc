// GPU test (tag "gpu"): dropping the last reference to a CUDA IPC mapping, and opening one, leave
// the calling thread's current device exactly as they found it. Before the fix ~CudaMappingImpl
// called cudaSetDevice(mapping's GPU) and never restored the thread's device, so a dispatcher of
// GPU 1 that dropped a GPU 0 mapping went on launching on GPU 0. With one GPU both devices are 0
// and the check still pins the contract; with two or more it is the failing case.
//
// A CUDA IPC handle cannot be opened in the process that exported it, so a child (forked before
// this process touches CUDA) exports a cudaMalloc allocation and holds it until told to exit.
#include <cuda_runtime_api.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "daemon/regions/cuda_import.h"
#include "daemon/regions/test_tables.h"
#include "proto/kvrail/v1/region.pb.h"
#include "tests/gpu/gpu_skip.h"

namespace kvrail::regions {
namespace {

constexpr size_t kBytes = 1 << 20;

// The exporting child: its pid, and the pipes to it.
struct Exporter {
  pid_t pid = -1;
  int handle_fd = -1;  // the child writes the 64-byte handle here
  int hold_fd = -1;    // closing it tells the child to free and exit
  std::string handle;  // empty when the child could not export (no GPU)
};

Exporter StartExporter() {
  int to_parent[2], to_child[2];
  REQUIRE(pipe(to_parent) == 0);
  REQUIRE(pipe(to_child) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(to_parent[0]);
    close(to_child[1]);
    void* memory = nullptr;
    cudaIpcMemHandle_t handle{};
    if (cudaSetDevice(0) != cudaSuccess || cudaMalloc(&memory, kBytes) != cudaSuccess ||
        cudaIpcGetMemHandle(&handle, memory) != cudaSuccess) {
      _exit(2);
    }
    if (write(to_parent[1], &handle, sizeof(handle)) != sizeof(handle)) _exit(3);
    char c;
    while (read(to_child[0], &c, 1) > 0) {
    }
    cudaFree(memory);
    _exit(0);
  }
  close(to_parent[1]);
  close(to_child[0]);
  Exporter e{pid, to_parent[0], to_child[1], std::string(sizeof(cudaIpcMemHandle_t), '\0')};
  size_t got = 0;
  while (got < e.handle.size()) {
    const ssize_t n = read(e.handle_fd, e.handle.data() + got, e.handle.size() - got);
    if (n <= 0) {  // the child exited without a handle
      e.handle.clear();
      break;
    }
    got += static_cast<size_t>(n);
  }
  return e;
}

void StopExporter(Exporter& e) {
  close(e.hold_fd);
  close(e.handle_fd);
  int status = 0;
  REQUIRE(waitpid(e.pid, &status, 0) == e.pid);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
}

int CurrentDevice() {
  int device = -1;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  return device;
}

TEST_CASE("opening and closing a mapping leave the thread's current device as they found it") {
  Exporter exporter = StartExporter();  // before this process's first CUDA call
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (!gpu_test::HaveGpus(1, count)) {
    close(exporter.hold_fd);
    close(exporter.handle_fd);
    waitpid(exporter.pid, nullptr, 0);
    return;
  }
  REQUIRE(!exporter.handle.empty());  // the child exported its allocation
  // The thread works for the last GPU (a dispatcher of GPU count-1); the mapping is on GPU 0.
  const int own = count - 1;
  REQUIRE(cudaSetDevice(own) == cudaSuccess);

  v1::RegionSpec spec;
  spec.set_memory_kind(v1::MEMORY_KIND_CUDA);
  spec.set_device(0);
  spec.set_size_bytes(kBytes);
  spec.mutable_share()->set_cuda_ipc_handle(exporter.handle);
  {
    absl::StatusOr<std::shared_ptr<CudaMapping>> mapping = ImportCudaIpc(spec);
    REQUIRE(mapping.ok());
    CHECK((*mapping)->device() == 0);
    CHECK(CurrentDevice() == own);  // the open selected GPU 0 for itself only
    if (count > 1) {
      // A peer view in GPU 1's context, dropped while the thread is on GPU 0.
      absl::StatusOr<std::shared_ptr<CudaMapping>> view = ImportCudaIpcOn(spec, 1);
      REQUIRE(view.ok());
      CHECK((*view)->device() == 1);
      REQUIRE(cudaSetDevice(0) == cudaSuccess);
      view->reset();
      CHECK(CurrentDevice() == 0);
      REQUIRE(cudaSetDevice(own) == cudaSuccess);
    }
  }  // the last reference to GPU 0's mapping goes here, on GPU `own`'s thread
  CHECK(CurrentDevice() == own);
  StopExporter(exporter);
}

// The library region holds the session's done words, which the GPU writes: it is pinned for the
// GPUs when it is registered, so the session's first GPU transfer does not pin it on the
// dispatcher's thread (its first launch waited 0.4-0.7 ms for that on an H100 host).
TEST_CASE("a library host region is pinned for the GPUs at registration") {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (!gpu_test::HaveGpus(1, count)) return;
  testing::Tables tables;
  const uint64_t session = tables.sessions->BeginSession();
  const int fd = memfd_create("library", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, kBytes) == 0);
  absl::StatusOr<std::string> token = tables.sessions->AddFd(session, UniqueFd(fd));
  REQUIRE(token.ok());
  v1::RegionSpec spec;
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.set_size_bytes(kBytes);
  spec.mutable_bytes();
  spec.set_writable(true);
  spec.mutable_share()->set_fd_token(*token);
  spec.set_library_region(true);
  absl::StatusOr<std::shared_ptr<Region>> region = tables.regions->Register(spec, session);
  REQUIRE(region.ok());
  cudaPointerAttributes attributes{};
  REQUIRE(cudaPointerGetAttributes(&attributes, (*region)->data()) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeHost);  // registered, not cudaMemoryTypeUnregistered
  CHECK(attributes.devicePointer != nullptr);

  // An ordinary host region is not pinned until a GPU transfer needs it.
  const int plain_fd = memfd_create("plain", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(plain_fd >= 0);
  REQUIRE(ftruncate(plain_fd, kBytes) == 0);
  absl::StatusOr<std::string> plain_token = tables.sessions->AddFd(session, UniqueFd(plain_fd));
  REQUIRE(plain_token.ok());
  spec.set_library_region(false);
  spec.mutable_share()->set_fd_token(*plain_token);
  absl::StatusOr<std::shared_ptr<Region>> plain = tables.regions->Register(spec, session);
  REQUIRE(plain.ok());
  cudaPointerAttributes plain_attributes{};
  REQUIRE(cudaPointerGetAttributes(&plain_attributes, (*plain)->data()) == cudaSuccess);
  CHECK(plain_attributes.type == cudaMemoryTypeUnregistered);
}

}  // namespace
}  // namespace kvrail::regions

// Internal to regions/: importing CUDA virtual memory (RegionShare.cuda_vmm) - cuMem chunks a
// client exported as POSIX file descriptors, mapped back to back into one range of the daemon's
// address space on the region's GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/unique_fd.h"
#include "daemon/regions/cuda_import.h"

namespace kvrail::regions {

// At most this many chunks per share (INVALID_ARGUMENT beyond).
inline constexpr int kMaxVmmChunks = 4096;

// One imported chain of chunks. Unmapped, released and its range freed when the last region
// using it drops it. Thread contract: immutable but for the set of GPUs granted access (mu_).
class VmmMapping final : public CudaMapping {
 public:
  // Imports `chunks` (fd, mapped bytes; the fds may be closed afterwards) on GPU `device`, maps
  // them at consecutive addresses and grants `device` read/write access. Errors name `field`
  // ("spec.share.cuda_vmm.chunks[2]: ..."); nothing stays imported or mapped after an error.
  static absl::StatusOr<std::shared_ptr<VmmMapping>> Import(
      int device, const std::vector<std::pair<int, uint64_t>>& chunks, const std::string& field);
  ~VmmMapping() override;

  int device() const override { return device_; }
  uint8_t* base() const override { return reinterpret_cast<uint8_t*>(base_); }
  uint64_t allocation_bytes() const override { return bytes_; }
  // Lets kernels and copies on GPU `accessor` reach the range (a peer over NVLink/PCIe): the
  // same addresses serve every GPU granted access. Once per accessor. Thread-safe.
  absl::Status GrantAccess(int accessor) ABSL_LOCKS_EXCLUDED(mu_);

  VmmMapping(int device, uint64_t base, uint64_t bytes,
             std::vector<std::pair<uint64_t, uint64_t>> handles)
      : device_(device), base_(base), bytes_(bytes), handles_(std::move(handles)) {}

 private:
  const int device_;
  const uint64_t base_;
  const uint64_t bytes_;
  // (CUmemGenericAllocationHandle, mapped bytes), in address order.
  const std::vector<std::pair<uint64_t, uint64_t>> handles_;
  absl::Mutex mu_;
  std::set<int> granted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvrail::regions

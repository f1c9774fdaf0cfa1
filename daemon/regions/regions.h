// Regions: memory the daemon may read or write, registered by clients, mapped once, leased to
// transfers. A region lives until it is unregistered or its session ends; a transfer holds a
// shared_ptr so a mapping outlives an unregister until the transfer ends.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/unique_fd.h"
#include "daemon/planner/planner.h"
#include "proto/kvrail/v1/region.pb.h"

namespace kvrail::regions {

// One registered region. Immutable after creation except the active-transfer counter; safe to
// share across threads.
class Region {
 public:
  virtual ~Region() = default;
  virtual uint64_t id() const = 0;
  virtual uint64_t session_id() const = 0;
  // Address of the region's first byte in the daemon: a host address for MEMORY_KIND_HOST, a
  // device address (in spec().device's context, valid on every GPU through UVA) for
  // MEMORY_KIND_CUDA.
  virtual uint8_t* data() const = 0;
  // The address CUDA kernels and copies running on GPU `accessor` use: for CUDA regions data()
  // on the region's own GPU, and on a peer GPU the allocation mapped into that GPU's context
  // (opened on first use, kept until the region is released); for host regions the mapping is
  // pinned and mapped into every GPU (cudaHostRegister) on the first call and stays so until the
  // region is released. FAILED_PRECONDITION without a CUDA device. Thread-safe.
  virtual absl::StatusOr<uint8_t*> DeviceAddress(int accessor) const = 0;
  virtual const v1::RegionSpec& spec() const = 0;
  // The geometry the planner checks transfers against.
  virtual const planner::RegionView& view() const = 0;
  // The region as shown to clients (active transfer count read now).
  virtual v1::RegionInfo Info() const = 0;
  // Counts transfers using the region (for ListRegions); callers pair Acquire/Release.
  virtual void AcquireUse() = 0;
  virtual void ReleaseUse() = 0;
};

// The daemon's region registry. Thread-safe.
class RegionTable {
 public:
  virtual ~RegionTable() = default;
  static std::unique_ptr<RegionTable> Create(Clock* clock);

  // Validates `spec` (errors name the field, e.g. "spec.paged_kv.block_stride: ...") and maps
  // the memory. fd tokens are consumed and must belong to `session_id`.
  virtual absl::StatusOr<std::shared_ptr<Region>> Register(const v1::RegionSpec& spec,
                                                           uint64_t session_id) = 0;
  // NOT_FOUND for unknown ids.
  virtual absl::Status Unregister(uint64_t region_id) = 0;
  virtual absl::StatusOr<std::shared_ptr<Region>> Get(uint64_t region_id) const = 0;
  virtual std::vector<v1::RegionInfo> List() const = 0;
  virtual size_t size() const = 0;

  // Sessions (see daemon/session): a session's fds wait under one-use tokens; ending the
  // session drops its unused tokens and unregisters its regions.
  virtual uint64_t BeginSession() = 0;
  virtual absl::StatusOr<std::string> AddFd(uint64_t session_id, UniqueFd fd) = 0;
  virtual void EndSession(uint64_t session_id) = 0;
};

}  // namespace kvrail::regions

// Regions: memory the daemon may read or write, registered by clients, mapped once, leased to
// transfers. A region lives until it is unregistered or its session ends; a transfer holds a
// shared_ptr so a mapping outlives an unregister until the transfer ends.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/clock.h"
#include "base/unique_fd.h"
#include "daemon/handover/state.pb.h"
#include "daemon/planner/planner.h"
#include "daemon/regions/device_uuid.h"
#include "daemon/sessions/sessions.h"
#include "proto/kvrail/v1/region.pb.h"
#include "proto/kvrail/v1/transfer.pb.h"

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
  // Per-layer regions (RegionSpec.layer_shares): entry L is layer L's first byte as CUDA code on
  // GPU `accessor` addresses it (made on first use per accessor, as DeviceAddress). nullptr for
  // regions of one base (their layers are at DeviceAddress + L * layer_stride). Thread-safe.
  virtual absl::StatusOr<std::shared_ptr<const planner::LayerBases>> DeviceLayerBases(
      int accessor) const {
    return std::shared_ptr<const planner::LayerBases>();
  }
  virtual const v1::RegionSpec& spec() const = 0;
  // The geometry the planner checks transfers against.
  virtual const planner::RegionView& view() const = 0;
  // The region as shown to clients (active transfer count read now).
  virtual v1::RegionInfo Info() const = 0;
  // Counts transfers using the region (for ListRegions); callers pair Acquire/Release.
  virtual void AcquireUse() = 0;
  virtual void ReleaseUse() = 0;
  // OK unless the region's host memory faulted under kvraild (its owner truncated it; the
  // daemon survives on zero pages: docs/security.md, "Memory"): then FAILED_PRECONDITION naming
  // `field`.region_id and the region. Cheap (atomic loads); checked after every tile, so a
  // transfer that touched a poisoned region fails. Thread-safe.
  virtual absl::Status Health(absl::string_view field) const { return absl::OkStatus(); }
};

// The text of Health's error for region `id` (shared by both region kinds).
absl::Status PoisonedError(absl::string_view field, uint64_t id);

// Caps on what clients may have registered at once (docs/security.md, "Memory"; kvraild takes
// them from DaemonConfig fields of the same names). A region counts one mapping per layer share
// (one for a region of one base). RESOURCE_EXHAUSTED naming the cap beyond each.
struct RegionLimits {
  size_t max_regions_per_session = 4096;
  size_t max_regions_per_uid = 16384;     // mappings
  uint64_t max_mapped_bytes_per_uid = 0;  // host bytes; 0: the node's physical memory
  size_t max_region_mappings = 0;         // every uid together; 0: half of vm.max_map_count
};

// The daemon's region registry: memory only. Who may use a region is daemon/access's business;
// sessions, their uids and fd tokens are daemon/sessions'. Thread-safe.
class RegionTable {
 public:
  virtual ~RegionTable() = default;
  // `sessions`: fd tokens and uids of the registering sessions; a session's end unregisters its
  // regions (the table hooks it: create it before sessions begin; it must outlive the last
  // EndSession of `sessions`). Region ids count from `first_region_id` (1 for tests; kvraild
  // passes sessions::RandomIdBase()). `gpus`: the node's GPUs by UUID (from its topology), for
  // RegionSpec.device_uuid.
  static std::unique_ptr<RegionTable> Create(Clock* clock, sessions::SessionTable* sessions,
                                             uint64_t first_region_id = 1,
                                             std::vector<GpuName> gpus = {},
                                             RegionLimits limits = {});

  // Validates `spec` (errors name the field, e.g. "spec.paged_kv.block_stride: ...") and maps
  // the memory. fd tokens are consumed and must belong to `session_id`. Host memory comes as fds
  // (docs/security.md, "Memory"); a share.shm_name is opened only for a session whose uid
  // (SessionTable::SetSessionPeer) owns the object, with the mode the access needs.
  // RESOURCE_EXHAUSTED naming the cap beyond RegionLimits; FAILED_PRECONDITION naming the field for
  // hugetlbfs and non-tmpfs fds.
  virtual absl::StatusOr<std::shared_ptr<Region>> Register(const v1::RegionSpec& spec,
                                                           uint64_t session_id) = 0;
  // NOT_FOUND for unknown ids. The daemon's own use (no caller check).
  virtual absl::Status Unregister(uint64_t region_id) = 0;
  // As a caller: only the owning session (PERMISSION_DENIED naming region_id).
  virtual absl::Status Unregister(uint64_t region_id, const sessions::Caller& caller) = 0;
  // NOT_FOUND for unknown ids, FAILED_PRECONDITION for a poisoned region (it refuses new use).
  virtual absl::StatusOr<std::shared_ptr<Region>> Get(uint64_t region_id) const = 0;
  // The region, poisoned or not; nullptr for unknown ids.
  virtual std::shared_ptr<Region> Find(uint64_t region_id) const = 0;
  virtual std::vector<v1::RegionInfo> List() const = 0;
  virtual size_t size() const = 0;

  // Adds `hook`, called with a region's id after Unregister removed it (outside the table's
  // lock, on the thread unregistering it, before Unregister returns; not for the regions a
  // session's end drops). For wiring (daemon/access drops the region's grants); hooks live as
  // long as the table.
  virtual void AddUnregisterHook(std::function<void(uint64_t region_id)> hook) = 0;

  // --- Hot restart (daemon/handover) ---
  // The regions as a successor rebuilds them (spec, id, owner, with duplicates of their
  // descriptors appended to `fds` and named by index) and the region id counter. The table is
  // unchanged and keeps serving. Sessions and fd tokens are the session table's part of `out`,
  // grants daemon/access's.
  virtual absl::Status ExportState(handover::RegionTableState* out,
                                   std::vector<UniqueFd>* fds) const = 0;
  // Rebuilds an empty table from a predecessor's state (after the session table imported its
  // part): every region mapped again under its id from its descriptors (taken out of `fds`;
  // CUDA IPC handles opened again). An error names the region; the table is then to be dropped.
  virtual absl::Status ImportState(const handover::RegionTableState& state,
                                   std::vector<UniqueFd>* fds) = 0;
};

}  // namespace kvrail::regions

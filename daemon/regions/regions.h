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
#include "daemon/planner/planner.h"
#include "daemon/handover/state.pb.h"
#include "daemon/regions/device_uuid.h"
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
  size_t max_regions_per_uid = 16384;  // mappings
  uint64_t max_mapped_bytes_per_uid = 0;  // host bytes; 0: the node's physical memory
  size_t max_region_mappings = 0;  // every uid together; 0: half of vm.max_map_count
};

// Where a table's region and session ids start counting (each id is then used once).
struct IdBases {
  uint64_t first_region_id = 1;
  uint64_t first_session_id = 1;
};
// Bases for a daemon process: each a random multiple of 2^32 in [2^32, 2^63) (31 random bits;
// below 2^63 so signed 64-bit consumers read ids as positive). A daemon that restarts counts
// from new bases, so a client still holding an id of the previous instance gets NOT_FOUND rather
// than naming another client's region or session (the chance of a clash is 2^-31 per restart,
// until an instance has issued 2^32 ids). Thread-safe (std::random_device).
IdBases RandomIdBases();

// Who is calling (docs/security.md). A session is a connection to the session socket; calls
// over gRPC are bound to one by their `kvrail-session` metadata (wire/session_wire.h).
struct Caller {
  uint64_t session_id = 0;  // 0: anonymous (owns nothing)
  // SO_PEERCRED uid of the session's connection; -1 unknown (anonymous, or no credentials).
  // Named in audit lines (an operator cancelling another session's transfer).
  int64_t uid = -1;
  // Whether `uid` is 0 or the daemon's own (::geteuid()): may list every region and transfer;
  // root alone, from a session that owns no regions (the CLI), may cancel any transfer
  // (server/operator_cancel.h; an audit line). Changes nothing else it does not own (unregister,
  // grants, MarkReady) and moves no bytes without ownership or a grant either.
  bool operator_role() const;
};

// The daemon's region registry. Thread-safe.
class RegionTable {
 public:
  virtual ~RegionTable() = default;
  // `bases`: ids count from 1 by default (tests); kvraild passes RandomIdBases(). `gpus`: the
  // node's GPUs by UUID (from its topology), for RegionSpec.device_uuid.
  static std::unique_ptr<RegionTable> Create(Clock* clock, IdBases bases = {},
                                             std::vector<GpuName> gpus = {},
                                             RegionLimits limits = {});

  // Validates `spec` (errors name the field, e.g. "spec.paged_kv.block_stride: ...") and maps
  // the memory. fd tokens are consumed and must belong to `session_id`. Host memory comes as fds
  // (docs/security.md, "Memory"); a share.shm_name is opened only for a session whose uid
  // (SetSessionPeer) owns the object, with the mode the access needs. RESOURCE_EXHAUSTED naming
  // the cap beyond RegionLimits; FAILED_PRECONDITION naming the field for hugetlbfs and
  // non-tmpfs fds.
  virtual absl::StatusOr<std::shared_ptr<Region>> Register(const v1::RegionSpec& spec,
                                                           uint64_t session_id) = 0;
  // NOT_FOUND for unknown ids. The daemon's own use (no caller check).
  virtual absl::Status Unregister(uint64_t region_id) = 0;
  // As a caller: only the owning session (PERMISSION_DENIED naming region_id).
  virtual absl::Status Unregister(uint64_t region_id, const Caller& caller) = 0;
  virtual absl::StatusOr<std::shared_ptr<Region>> Get(uint64_t region_id) const = 0;
  virtual std::vector<v1::RegionInfo> List() const = 0;
  virtual size_t size() const = 0;

  // Sessions (see daemon/session): a session's fds wait under one-use tokens; ending the
  // session drops its unused tokens and unregisters its regions.
  virtual uint64_t BeginSession() = 0;
  virtual absl::StatusOr<std::string> AddFd(uint64_t session_id, UniqueFd fd) = 0;
  virtual void EndSession(uint64_t session_id) = 0;
  // Whether `session_id` was begun and has not ended.
  virtual bool SessionOpen(uint64_t session_id) const = 0;
  // Adds `hook`, called with a session's id after EndSession dropped its regions (outside the
  // table's lock, on the thread ending the session). For daemon wiring (notification queues):
  // add hooks before sessions begin; they live as long as the table.
  virtual void AddSessionEndHook(std::function<void(uint64_t)> hook) = 0;
  // Adds `hook`, called whenever access that was granted may have ended: after RevokeGrant,
  // Unregister (its grants go with the region) and EndSession (the owner's grants go with it),
  // outside the table's lock, on the thread that made the change, before that call returns. The
  // transfer manager rechecks its transfers' grants there. Hooks live as long as the table.
  virtual void AddAccessHook(std::function<void()> hook) = 0;

  // --- Hot restart (daemon/handover) ---
  // The table as a successor rebuilds it: open sessions (ids, secrets, uids), unused fd tokens,
  // regions (spec, id, owner, with duplicates of their descriptors appended to `fds` and named
  // by index), grants and the id counters. The table is unchanged and keeps serving.
  virtual absl::Status ExportState(handover::RegionTableState* out,
                                   std::vector<UniqueFd>* fds) const = 0;
  // Rebuilds an empty table from a predecessor's state: the same session ids and secrets, fd
  // tokens and grants, and every region mapped again under its id from its descriptors (taken
  // out of `fds`; CUDA IPC handles opened again). An error names the region; the table is then
  // to be dropped.
  virtual absl::Status ImportState(const handover::RegionTableState& state,
                                   std::vector<UniqueFd>* fds) = 0;

  // --- Identity and grants (docs/security.md) ---
  // The session's secret (128 random bits, hex), drawn at BeginSession; "" for unknown sessions.
  virtual std::string SessionSecret(uint64_t session_id) const = 0;
  // The uid of the process on the session's connection (SO_PEERCRED), which decides whether the
  // session is the operator's.
  virtual void SetSessionPeer(uint64_t session_id, uint32_t uid) = 0;
  // The caller a `kvrail-session` credential names: UNAUTHENTICATED when the session is not
  // open or the secret differs.
  virtual absl::StatusOr<Caller> Authenticate(uint64_t session_id,
                                              absl::string_view secret) const = 0;
  // A grant of `request.region_id` by its owner. INVALID_ARGUMENT naming the
  // field (access, ttl_ms, layer range), NOT_FOUND for unknown regions, PERMISSION_DENIED when
  // the caller does not own the region, RESOURCE_EXHAUSTED beyond 4096 live grants per session.
  virtual absl::StatusOr<v1::Grant> CreateGrant(const v1::CreateGrantRequest& request,
                                                const Caller& caller) = 0;
  // NOT_FOUND naming token for unknown or expired grants; PERMISSION_DENIED unless the caller
  // owns the grant's region.
  virtual absl::Status RevokeGrant(const std::string& token, const Caller& caller) = 0;
  // When the live grant `token` expires (unix microseconds by the table's clock); 0 when it is
  // unknown, revoked or expired.
  virtual int64_t GrantExpiresUs(absl::string_view token) const = 0;
  // OK when session `session_id` (0: none) owns `region`, or `grant` is a live grant of
  // `access` for it covering layers [layer_begin, layer_end) (both 0: the transfer's layers are
  // not known or the region is a bytes region: only whole-region grants pass). Otherwise
  // PERMISSION_DENIED naming `field` (".grant" or ".region_id"); its message never contains the
  // region's contents.
  virtual absl::Status CheckAccess(const Region& region, uint64_t session_id,
                                   const std::string& grant, v1::GrantAccess access,
                                   uint32_t layer_begin, uint32_t layer_end,
                                   absl::string_view field) const = 0;
};

}  // namespace kvrail::regions

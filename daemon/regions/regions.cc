#include "daemon/regions/regions.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/cuda/cuda_util.h"
#include "base/status.h"
#include "daemon/regions/cuda_import.h"
#include "daemon/regions/cuda_vmm.h"
#include "daemon/regions/host_mapping.h"
#include "daemon/regions/layered_region.h"

namespace kvrail::regions {

absl::Status PoisonedError(absl::string_view field, uint64_t id) {
  return absl::FailedPreconditionError(absl::StrCat(
      field, field.empty() ? "" : ".region_id: ", "region ", id,
      ": its host memory faulted under kvraild (the owner truncated or removed it while "
      "registered); the region is poisoned: transfers that touched it fail and new ones are "
      "refused; unregister it"));
}

namespace {

// Mappings and host bytes held per uid and in all, against RegionLimits. Shared by the table and
// every region's charge (a region may outlive the table: a transfer holds it). Thread-safe.
class Usage : public std::enable_shared_from_this<Usage> {
 public:
  explicit Usage(RegionLimits limits) : limits_(limits) {}

  // Takes `mappings` and `bytes` for `uid` (-1: unknown) until the returned charge is dropped
  // (with the region). RESOURCE_EXHAUSTED naming the cap.
  absl::StatusOr<std::shared_ptr<void>> Reserve(int64_t uid, uint64_t mappings, uint64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      Held& held = by_uid_[uid];
      if (mappings > limits_.max_region_mappings - total_mappings_) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "max_region_mappings: kvraild holds ", total_mappings_,
            " region mappings of every uid; "
            "this region needs ",
            mappings, " more (at most ", limits_.max_region_mappings, " in all); unregister some"));
      }
      if (mappings > limits_.max_regions_per_uid - held.mappings) {
        return absl::ResourceExhaustedError(
            absl::StrCat("max_regions_per_uid: uid ", uid, " holds ", held.mappings,
                         " region mappings; this region needs ", mappings, " more (at most ",
                         limits_.max_regions_per_uid, " per uid); unregister some"));
      }
      if (bytes > limits_.max_mapped_bytes_per_uid - held.bytes) {
        return absl::ResourceExhaustedError(
            absl::StrCat("max_mapped_bytes_per_uid: uid ", uid, " has ", held.bytes,
                         " host bytes mapped; this region needs ", bytes, " more (at most ",
                         limits_.max_mapped_bytes_per_uid, " per uid); unregister some"));
      }
      held.mappings += mappings;
      held.bytes += bytes;
      total_mappings_ += mappings;
    }
    std::shared_ptr<Usage> self = shared_from_this();
    return std::shared_ptr<void>(
        nullptr, [self, uid, mappings, bytes](void*) { self->Release(uid, mappings, bytes); });
  }

 private:
  struct Held {
    uint64_t mappings = 0;
    uint64_t bytes = 0;
  };
  void Release(int64_t uid, uint64_t mappings, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    Held& held = by_uid_[uid];
    held.mappings -= mappings;
    held.bytes -= bytes;
    total_mappings_ -= mappings;
    if (held.mappings == 0 && held.bytes == 0) by_uid_.erase(uid);
  }

  const RegionLimits limits_;
  absl::Mutex mu_;
  absl::flat_hash_map<int64_t, Held> by_uid_ ABSL_GUARDED_BY(mu_);
  uint64_t total_mappings_ ABSL_GUARDED_BY(mu_) = 0;
};

// 0 fields of `limits` made concrete for this node.
RegionLimits Concrete(RegionLimits limits) {
  if (limits.max_mapped_bytes_per_uid == 0) {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page = ::sysconf(_SC_PAGESIZE);
    limits.max_mapped_bytes_per_uid =
        pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                              : (uint64_t{1} << 40);
  }
  if (limits.max_region_mappings == 0) {
    uint64_t max_map_count = 65530;
    std::ifstream in("/proc/sys/vm/max_map_count");
    uint64_t read = 0;
    if (in >> read && read > 0) max_map_count = read;
    limits.max_region_mappings = static_cast<size_t>(std::max<uint64_t>(1, max_map_count / 2));
  }
  return limits;
}

// Thread-safe: the spec, view and memory are immutable after construction; the host pin and the
// peer-GPU views are made on first use under pin_mu_; the use count is atomic.
class RegionImpl final : public Region {
 public:
  // `backing` keeps the memory mapped (a host Mapping or a CudaMapping); `host_mapping` is the
  // host Mapping to pin for CUDA engines (nullptr for CUDA regions).
  RegionImpl(uint64_t id, uint64_t session_id, v1::RegionSpec spec, planner::RegionView view,
             std::shared_ptr<void> backing, const Mapping* host_mapping, uint8_t* data,
             int64_t registered_us, std::shared_ptr<VmmMapping> vmm, std::shared_ptr<void> charge)
      : charge_(std::move(charge)),
        vmm_(std::move(vmm)),
        id_(id),
        session_id_(session_id),
        spec_(std::move(spec)),
        view_(view),
        backing_(std::move(backing)),
        host_mapping_(host_mapping),
        data_(data),
        registered_us_(registered_us) {}

  uint64_t id() const override { return id_; }
  uint64_t session_id() const override { return session_id_; }
  uint8_t* data() const override { return data_; }
  // Holds pin_mu_ while it pins or maps (milliseconds), so a pin or peer view is made once.
  absl::StatusOr<uint8_t*> DeviceAddress(int accessor) const override ABSL_LOCKS_EXCLUDED(pin_mu_) {
    if (host_mapping_ == nullptr) {
      if (accessor == spec_.device()) return data_;
      if (vmm_ != nullptr) {  // cuMem memory: one range, access granted per GPU
        absl::Status granted = vmm_->GrantAccess(accessor);
        if (!granted.ok()) {
          return absl::Status(granted.code(),
                              absl::StrCat("region ", id_, ": ", granted.message()));
        }
        return data_;
      }
      absl::MutexLock lock(&pin_mu_);
      std::shared_ptr<CudaMapping>& view = peer_views_[accessor];
      if (view == nullptr) {
        absl::StatusOr<std::shared_ptr<CudaMapping>> opened = ImportCudaIpcOn(spec_, accessor);
        if (!opened.ok()) {
          peer_views_.erase(accessor);
          return absl::Status(
              opened.status().code(),
              absl::StrCat("region ", id_, ": mapping GPU", spec_.device(), " memory into GPU",
                           accessor, ": ", opened.status().message()));
        }
        view = *std::move(opened);
      }
      return view->base() + spec_.share().offset();
    }
    absl::MutexLock lock(&pin_mu_);
    if (!pin_.has_value()) {
      absl::StatusOr<cuda::HostRegistration> pin = cuda::HostRegistration::Register(
          host_mapping_->base(), host_mapping_->length(), !spec_.writable());
      if (!pin.ok()) {
        return absl::Status(pin.status().code(),
                            absl::StrCat("region ", id_, ": pinning host memory for the GPU: ",
                                         pin.status().message()));
      }
      pin_.emplace(*std::move(pin));
    }
    return pin_->DevicePointer(data_);
  }
  const v1::RegionSpec& spec() const override { return spec_; }
  const planner::RegionView& view() const override { return view_; }
  v1::RegionInfo Info() const override {
    v1::RegionInfo info = RegionInfoOf(id_, spec_, session_id_,
                                       active_.load(std::memory_order_relaxed), registered_us_);
    if (host_mapping_ != nullptr) {
      info.set_host_sealed(host_mapping_->sealed());
      info.set_poisoned(host_mapping_->poisoned());
    }
    return info;
  }
  void AcquireUse() override { active_.fetch_add(1, std::memory_order_relaxed); }
  void ReleaseUse() override { active_.fetch_sub(1, std::memory_order_relaxed); }
  absl::Status Health(absl::string_view field) const override {
    if (host_mapping_ != nullptr && host_mapping_->poisoned()) return PoisonedError(field, id_);
    return absl::OkStatus();
  }

 private:
  // What the region counts against RegionLimits, given back when the region (and its mapping)
  // goes. Declared first: released last.
  const std::shared_ptr<void> charge_;
  // cuMem regions: the imported chain (also held by backing_). nullptr otherwise.
  const std::shared_ptr<VmmMapping> vmm_;
  const uint64_t id_;
  const uint64_t session_id_;
  const v1::RegionSpec spec_;
  const planner::RegionView view_;
  const std::shared_ptr<void> backing_;
  const Mapping* const host_mapping_;
  uint8_t* const data_;
  const int64_t registered_us_;
  std::atomic<uint32_t> active_{0};
  // Declared after backing_: unpinned before the memory is unmapped.
  mutable absl::Mutex pin_mu_;
  mutable std::optional<cuda::HostRegistration> pin_ ABSL_GUARDED_BY(pin_mu_);
  // CUDA regions: the allocation mapped into peer GPUs' contexts, by GPU.
  mutable std::map<int, std::shared_ptr<CudaMapping>> peer_views_ ABSL_GUARDED_BY(pin_mu_);
};

// Thread-safe: the id counters, regions and pending fd tokens are guarded by mu_. Mapping and
// CUDA imports happen outside mu_; Add takes it for the table updates only. fd tokens are the
// session table's.
class RegionTableImpl final : public RegionTable {
 public:
  RegionTableImpl(Clock* clock, sessions::SessionTable* sessions, uint64_t first_region_id,
                  std::vector<GpuName> gpus, RegionLimits limits)
      : clock_(clock),
        sessions_(sessions),
        gpus_(std::move(gpus)),
        limits_(Concrete(limits)),
        usage_(std::make_shared<Usage>(limits_)),
        next_id_(first_region_id) {}

  absl::StatusOr<std::shared_ptr<Region>> Register(const v1::RegionSpec& given,
                                                   uint64_t session_id) override {
    return RegisterImpl(given, session_id, nullptr);
  }

 private:
  // A region re-registered from a predecessor's state (ImportState): its id, its registration
  // time and its descriptors, taken in the order the spec names them instead of fd tokens.
  struct Restore {
    uint64_t id = 0;
    int64_t registered_us = 0;
    std::vector<UniqueFd> fds;
    size_t next = 0;
  };

  // The descriptor for the share named `token`: the session's fd token, or while restoring the
  // next handed-over descriptor.
  absl::StatusOr<UniqueFd> TakeFd(const std::string& token, uint64_t session_id, Restore* restore) {
    if (restore == nullptr) return sessions_->TakeFd(token, session_id);
    if (restore->next >= restore->fds.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("region ", restore->id, ": ", restore->fds.size(),
                       " descriptors handed over, the spec needs more"));
    }
    return std::move(restore->fds[restore->next++]);
  }

  // Register's work; `restore` (ImportState) names the id and supplies the descriptors.
  absl::StatusOr<std::shared_ptr<Region>> RegisterImpl(const v1::RegionSpec& given,
                                                       uint64_t session_id, Restore* restore) {
    int64_t uid = -1;
    if (given.library_region()) KVRAIL_RETURN_IF_ERROR(CheckLibraryRegion(given, session_id));
    bool library_pending = false;
    // A library registration in progress is pending until Register returns (then its region,
    // if any, is in regions_): a second one of the session meanwhile is refused.
    absl::Cleanup end_pending = [&] {
      if (!library_pending) return;
      absl::MutexLock lock(&mu_);
      library_pending_.erase(session_id);
    };
    {
      // Checked before any mapping work (two racing registers may pass it by one).
      absl::MutexLock lock(&mu_);
      KVRAIL_RETURN_IF_ERROR(CheckSessionRegionsLocked(session_id, given.library_region()));
      if (given.library_region()) {
        library_pending_.insert(session_id);
        library_pending = true;
      }
    }
    uid = sessions_->CallerOf(session_id).uid;
    // The caps on mappings and host bytes (per uid, and every uid together), taken before any
    // mapping work and given back when the region goes (or now, on an error).
    const bool host = given.memory_kind() == v1::MEMORY_KIND_HOST;
    const uint64_t mappings = std::max<uint64_t>(1, given.layer_shares_size());
    const uint64_t size = given.size_bytes();
    const uint64_t bytes = !host                          ? 0
                           : size > UINT64_MAX / mappings ? UINT64_MAX  // refused below
                                                          : size * mappings;
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<void> charge, usage_->Reserve(uid, mappings, bytes));
    // A GPU named by UUID becomes this daemon's ordinal before anything reads spec.device.
    v1::RegionSpec resolved;
    if (!given.device_uuid().empty()) {
      resolved = given;
      KVRAIL_RETURN_IF_ERROR(ResolveDeviceUuid(gpus_, &resolved));
    }
    const v1::RegionSpec& spec = given.device_uuid().empty() ? given : resolved;
    if (spec.layer_shares_size() > 0) {
      return RegisterLayered(spec, session_id, std::move(charge), restore);
    }
    KVRAIL_ASSIGN_OR_RETURN(planner::RegionView view, Validate(spec, false));
    if (spec.memory_kind() == v1::MEMORY_KIND_CUDA) {
      std::shared_ptr<CudaMapping> cuda;
      std::shared_ptr<VmmMapping> vmm;
      std::vector<UniqueFd> kept;
      if (spec.share().via_case() == v1::RegionShare::kCudaVmm) {
        std::vector<std::pair<std::string, UniqueFd>> taken;
        absl::StatusOr<std::shared_ptr<VmmMapping>> imported =
            ImportVmm(spec.share(), spec.device(), spec.size_bytes(), session_id,
                      "spec.share.cuda_vmm", &taken, restore);
        if (!imported.ok()) {
          if (restore == nullptr) GiveBack(session_id, &taken);  // a mistake costs no fds
          return imported.status();
        }
        // The import holds its own references; the fds are kept for a successor (handover).
        vmm = *imported;
        cuda = vmm;
        for (auto& [token, fd] : taken) kept.push_back(std::move(fd));
      } else {
        KVRAIL_ASSIGN_OR_RETURN(cuda, ImportCudaIpc(spec));
      }
      uint8_t* data = cuda->base() + spec.share().offset();
      std::shared_ptr<Region> region =
          Add(spec, session_id, view, std::move(cuda), nullptr, data, std::move(charge),
              std::move(kept), restore, std::move(vmm));
      // Map it into the peer GPUs now: opening an IPC handle takes milliseconds, which would
      // otherwise land on the first peer transfer. A GPU that cannot map it is tried again (and
      // the error reported) when a transfer needs it.
      const absl::StatusOr<int> count = cuda::DeviceCount();
      for (int d = 0; count.ok() && d < *count; ++d) {
        if (d != spec.device()) (void)region->DeviceAddress(d);
      }
      return region;
    }
    UniqueFd fd;
    const char* field = nullptr;
    switch (spec.share().via_case()) {
      case v1::RegionShare::kFdToken: {
        // Sealed against shrinking where the kernel allows, guarded either way (MapFd).
        field = "spec.share.fd_token";
        KVRAIL_ASSIGN_OR_RETURN(fd, TakeFd(spec.share().fd_token(), session_id, restore));
        break;
      }
      case v1::RegionShare::kShmName: {
        field = "spec.share.shm_name";
        if (restore != nullptr) {  // the object may be unlinked by now: its descriptor came
          KVRAIL_ASSIGN_OR_RETURN(fd, TakeFd("", session_id, restore));
          break;
        }
        KVRAIL_ASSIGN_OR_RETURN(fd, OpenShmAs(spec.share().shm_name(), spec.writable(), uid));
        break;
      }
      case v1::RegionShare::kCudaIpcHandle:
        return absl::InvalidArgumentError(
            "spec.share.cuda_ipc_handle: CUDA IPC handles share CUDA memory, not host memory "
            "(set spec.memory_kind = MEMORY_KIND_CUDA)");
      case v1::RegionShare::kCudaVmm:
        return absl::InvalidArgumentError(
            "spec.share.cuda_vmm: cuMem chunks share CUDA memory, not host memory (set "
            "spec.memory_kind = MEMORY_KIND_CUDA)");
      case v1::RegionShare::VIA_NOT_SET:
        return absl::InvalidArgumentError(
            "spec.share: say how the memory is shared (fd_token or shm_name)");
    }
    auto mapped_or =
        MapFd(fd.get(), spec.share().offset(), spec.size_bytes(), spec.writable(), field);
    if (!mapped_or.ok()) {
      // A size or permission mistake should not cost the client its fd: the token stays valid.
      if (spec.share().via_case() == v1::RegionShare::kFdToken && restore == nullptr) {
        sessions_->ReturnFd(spec.share().fd_token(), session_id, std::move(fd));
      }
      return mapped_or.status();
    }
    auto mapped = *std::move(mapped_or);
    const Mapping* host_mapping = mapped.first.get();
    // Small host regions (block tables among them, read on every large submit): their pages go
    // into the daemon's page tables now, not in the first transfer's accept.
    if (spec.size_bytes() <= kPrefaultMaxBytes) {
      PrefaultResident(*host_mapping);
    }
    std::vector<UniqueFd> kept;
    kept.push_back(std::move(fd));  // for a successor (handover)
    std::shared_ptr<Region> region =
        Add(spec, session_id, view, std::shared_ptr<Mapping>(std::move(mapped.first)), host_mapping,
            mapped.second, std::move(charge), std::move(kept), restore);
    // The library region holds the session's done words, which the GPU writes at a transfer's
    // end: pinned for the GPUs now (cudaHostRegister, 0.4-0.7 ms on an H100 host), not by the
    // dispatcher inside the session's first GPU transfer (its first launch waited for it). A
    // daemon without GPUs pins nothing; a pin that fails here is tried again (and reported)
    // when a transfer needs it.
    if (spec.library_region()) {
      const absl::StatusOr<int> count = cuda::DeviceCount();
      if (count.ok() && *count > 0) (void)region->DeviceAddress(0);
    }
    return region;
  }

 public:
  absl::Status Unregister(uint64_t region_id) override {
    std::shared_ptr<Region> dropped;  // unmapped outside the lock
    {
      absl::MutexLock lock(&mu_);
      auto it = regions_.find(region_id);
      if (it == regions_.end()) {
        return absl::NotFoundError(absl::StrCat("region_id: no region ", region_id));
      }
      region_fds_.erase(region_id);
      dropped = std::move(it->second);
      regions_.erase(it);
    }
    RunUnregisterHooks(region_id);
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<Region>> Get(uint64_t region_id) const override {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(region_id);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("region ", region_id, " is not registered"));
    }
    // A poisoned region refuses further use (docs/security.md, "Memory").
    KVRAIL_RETURN_IF_ERROR(it->second->Health(""));
    return it->second;
  }

  std::vector<v1::RegionInfo> List() const override {
    std::vector<v1::RegionInfo> out;
    absl::MutexLock lock(&mu_);
    out.reserve(regions_.size());
    for (const auto& [id, region] : regions_) out.push_back(region->Info());
    std::sort(out.begin(), out.end(), [](const v1::RegionInfo& a, const v1::RegionInfo& b) {
      return a.region_id() < b.region_id();
    });
    return out;
  }

  size_t size() const override {
    absl::MutexLock lock(&mu_);
    return regions_.size();
  }

  absl::Status Unregister(uint64_t region_id, const sessions::Caller& caller) override {
    std::shared_ptr<Region> dropped;  // unmapped outside the lock
    {
      absl::MutexLock lock(&mu_);
      auto it = regions_.find(region_id);
      if (it == regions_.end()) {
        return absl::NotFoundError(absl::StrCat("region_id: no region ", region_id));
      }
      if (caller.session_id == 0 || it->second->session_id() != caller.session_id) {
        return absl::PermissionDeniedError(
            absl::StrCat("region_id: region ", region_id,
                         " belongs to another session; only its owner may unregister it"));
      }
      dropped = std::move(it->second);
      regions_.erase(it);
      region_fds_.erase(region_id);
    }
    RunUnregisterHooks(region_id);
    return absl::OkStatus();
  }

  std::shared_ptr<Region> Find(uint64_t region_id) const override {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(region_id);
    return it == regions_.end() ? nullptr : it->second;
  }

  void AddUnregisterHook(std::function<void(uint64_t)> hook) override {
    absl::MutexLock lock(&mu_);
    unregister_hooks_.push_back(std::move(hook));
  }

  absl::Status ExportState(handover::RegionTableState* out,
                           std::vector<UniqueFd>* fds) const override {
    // Duplicates, so this table keeps serving unchanged if the successor never commits.
    auto dup = [fds](int fd) -> absl::StatusOr<int32_t> {
      UniqueFd copy(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
      if (!copy.valid()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("handover: cannot duplicate a region descriptor: ", ErrnoText(errno)));
      }
      fds->push_back(std::move(copy));
      return static_cast<int32_t>(fds->size() - 1);
    };
    absl::MutexLock lock(&mu_);
    out->set_next_region_id(next_id_);
    for (const auto& [id, region] : regions_) {
      handover::RegionRecord* record = out->add_regions();
      record->set_region_id(id);
      record->set_session_id(region->session_id());
      *record->mutable_spec() = region->spec();
      record->set_registered_unix_us(region->Info().registered_unix_us());
      auto kept = region_fds_.find(id);
      if (kept == region_fds_.end()) continue;
      for (const UniqueFd& fd : kept->second) {
        KVRAIL_ASSIGN_OR_RETURN(const int32_t index, dup(fd.get()));
        record->add_fds(index);
      }
    }
    return absl::OkStatus();
  }

  absl::Status ImportState(const handover::RegionTableState& state,
                           std::vector<UniqueFd>* fds) override {
    // Each index names a descriptor of the bundle, used once.
    auto take = [fds](int32_t index, absl::string_view field) -> absl::StatusOr<UniqueFd> {
      if (index < 0 || static_cast<size_t>(index) >= fds->size() || !(*fds)[index].valid()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": descriptor ", index, " is not in the bundle (or used twice)"));
      }
      return std::move((*fds)[index]);
    };
    {
      absl::MutexLock lock(&mu_);
      if (!regions_.empty()) {
        return absl::FailedPreconditionError("handover: the region table is not empty");
      }
      next_id_ = std::max(next_id_, state.next_region_id());
    }
    for (const handover::RegionRecord& record : state.regions()) {
      Restore restore;
      restore.id = record.region_id();
      restore.registered_us = record.registered_unix_us();
      for (int32_t index : record.fds()) {
        KVRAIL_ASSIGN_OR_RETURN(UniqueFd fd,
                                take(index, absl::StrCat("regions[", record.region_id(), "].fds")));
        restore.fds.push_back(std::move(fd));
      }
      absl::StatusOr<std::shared_ptr<Region>> region =
          RegisterImpl(record.spec(), record.session_id(), &restore);
      if (!region.ok()) {
        return absl::Status(region.status().code(),
                            absl::StrCat("handover: region ", record.region_id(), " (session ",
                                         record.session_id(), "): ", region.status().message()));
      }
    }
    return absl::OkStatus();
  }

  // The session table's end hook: the session's regions go (unmapped once no transfer holds
  // them).
  void EndSession(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::shared_ptr<Region>> dropped;  // unmapped outside the lock
    absl::MutexLock lock(&mu_);
    for (auto it = regions_.begin(); it != regions_.end();) {
      if (it->second->session_id() == session_id) {
        dropped.push_back(std::move(it->second));
        region_fds_.erase(it->first);
        regions_.erase(it++);
      } else {
        ++it;
      }
    }
  }

 private:
  void RunUnregisterHooks(uint64_t region_id) ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::function<void(uint64_t)>> hooks;
    {
      absl::MutexLock lock(&mu_);
      hooks = unregister_hooks_;
    }
    for (const auto& hook : hooks) hook(region_id);
  }

  // RegionSpec.library_region: the client library's block-table region grows by doubling from
  // 1 MiB; a Submit whose tables need more than this sends them in the message instead.
  static constexpr uint64_t kMaxLibraryRegionBytes = uint64_t{64} << 20;

  // RegionSpec.library_region's limits that the spec alone decides (region.proto): a session's
  // host memory of one allocation, a bytes layout, at most kMaxLibraryRegionBytes.
  static absl::Status CheckLibraryRegion(const v1::RegionSpec& spec, uint64_t session_id) {
    if (session_id == 0) {
      return absl::InvalidArgumentError(
          "spec.library_region: a library region belongs to a session (register it over the "
          "session socket's session)");
    }
    if (spec.memory_kind() != v1::MEMORY_KIND_HOST) {
      return absl::InvalidArgumentError(
          "spec.library_region: a library region is host memory (MEMORY_KIND_HOST)");
    }
    if (spec.layer_shares_size() > 0 || !spec.has_bytes()) {
      return absl::InvalidArgumentError(
          "spec.library_region: a library region is one allocation with a bytes layout (no "
          "paged_kv, no layer_shares)");
    }
    if (spec.size_bytes() > kMaxLibraryRegionBytes) {
      return absl::InvalidArgumentError(absl::StrCat("spec.library_region: ", spec.size_bytes(),
                                                     " bytes; a library region holds at most ",
                                                     kMaxLibraryRegionBytes, " (64 MiB)"));
    }
    return absl::OkStatus();
  }

  // One pass over the session's regions: RESOURCE_EXHAUSTED naming the cap when `session_id`
  // already holds max_regions_per_session; then, for a `library` region, ALREADY_EXISTS naming
  // spec.library_region when the session holds (or is registering) one.
  absl::Status CheckSessionRegionsLocked(uint64_t session_id, bool library) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (session_id == 0 && !library) return absl::OkStatus();
    size_t held = 0;
    bool holds_library = false;
    uint64_t library_id = 0;
    for (const auto& [id, region] : regions_) {
      if (region->session_id() != session_id) continue;
      ++held;
      if (!holds_library && region->spec().library_region()) {
        holds_library = true;
        library_id = id;
      }
    }
    if (session_id != 0 && held >= limits_.max_regions_per_session) {
      return absl::ResourceExhaustedError(
          absl::StrCat("max_regions_per_session: the session holds ", held, " regions (at most ",
                       limits_.max_regions_per_session, " per session); unregister some"));
    }
    if (!library) return absl::OkStatus();
    if (holds_library) {
      return absl::AlreadyExistsError(
          absl::StrCat("spec.library_region: the session already holds library region ", library_id,
                       " (at most one per session; unregister it first)"));
    }
    if (library_pending_.contains(session_id)) {
      return absl::AlreadyExistsError(
          "spec.library_region: the session is registering a library region now (at most one "
          "per session)");
    }
    return absl::OkStatus();
  }

  // A POSIX shm object opened by name for a caller of uid `uid` (docs/security.md, "Memory"):
  // the name is '/' and one component of [A-Za-z0-9._-] (not "." or ".."), opened under
  // /dev/shm without following links, and it must be a regular file the caller owns, with the
  // owner permission the access needs. Everything else is refused before its contents or
  // metadata are reported. Clients of the library never come here: it opens the object itself
  // and passes the fd.
  static absl::StatusOr<UniqueFd> OpenShmAs(const std::string& name, bool writable, int64_t uid) {
    const absl::string_view rest = absl::string_view(name).substr(name.empty() ? 0 : 1);
    const bool valid_chars = std::all_of(rest.begin(), rest.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    });
    if (name.size() < 2 || name.size() > 255 || name[0] != '/' || !valid_chars || rest == "." ||
        rest == "..") {
      return absl::InvalidArgumentError(
          "spec.share.shm_name: must be '/' and one name of letters, digits, '.', '_' and '-' "
          "(not '.' or '..'), at most 255 characters");
    }
    if (uid < 0) {
      return absl::PermissionDeniedError(
          "spec.share.shm_name: kvraild opens shared memory by name only for a session whose "
          "uid it knows (the session socket's SO_PEERCRED); pass the object's fd instead "
          "(fd_token)");
    }
    const std::string path = absl::StrCat("/dev/shm/", rest);
    UniqueFd fd(::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC |
                                         O_NOCTTY | O_NONBLOCK));
    if (!fd.valid()) {
      const int err = errno;
      if (err == ENOENT) {
        return absl::NotFoundError(
            absl::StrCat("spec.share.shm_name: no shared memory object ", name));
      }
      // ELOOP: a symbolic link; anything else is refused without detail.
      return absl::PermissionDeniedError(absl::StrCat("spec.share.shm_name: cannot open ", name,
                                                      err == ELOOP ? ": it is a symbolic link" : "",
                                                      " for this caller"));
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<int64_t>(st.st_uid) != uid ||
        (st.st_mode & (writable ? (S_IRUSR | S_IWUSR) : S_IRUSR)) !=
            (writable ? (S_IRUSR | S_IWUSR) : S_IRUSR)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "spec.share.shm_name: ", name, " is not a shared memory object the caller (uid ", uid,
          ") owns with ", writable ? "read and write" : "read",
          " permission; kvraild opens only the caller's own objects by name (or pass the fd)"));
    }
    return fd;
  }
  std::shared_ptr<Region> Add(const v1::RegionSpec& spec, uint64_t session_id,
                              const planner::RegionView& view, std::shared_ptr<void> backing,
                              const Mapping* host_mapping, uint8_t* data,
                              std::shared_ptr<void> charge, std::vector<UniqueFd> kept,
                              const Restore* restore, std::shared_ptr<VmmMapping> vmm = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const uint64_t id = restore != nullptr ? restore->id : next_id_++;
    const int64_t registered_us =
        restore != nullptr ? restore->registered_us : clock_->NowUnixMicros();
    auto region =
        std::make_shared<RegionImpl>(id, session_id, spec, view, std::move(backing), host_mapping,
                                     data, registered_us, std::move(vmm), std::move(charge));
    regions_[id] = region;
    if (!kept.empty()) region_fds_[id] = std::move(kept);
    return region;
  }

  // Fds taken for a registration that failed go back to their tokens, so a mistake does not cost
  // the client its fds.
  void GiveBack(uint64_t session_id, std::vector<std::pair<std::string, UniqueFd>>* taken)
      ABSL_LOCKS_EXCLUDED(mu_) {
    for (auto& [token, fd] : *taken) sessions_->ReturnFd(token, session_id, std::move(fd));
    taken->clear();
  }

  // A RegionShare.cuda_vmm imported on `device`: every chunk's fd token taken (appended to
  // `taken`: the caller gives them back), the chunks mapped, and [offset, offset + size) checked
  // against the chain. Errors name `field`.
  absl::StatusOr<std::shared_ptr<VmmMapping>> ImportVmm(
      const v1::RegionShare& share, int device, uint64_t size, uint64_t session_id,
      const std::string& field, std::vector<std::pair<std::string, UniqueFd>>* taken,
      Restore* restore) {
    absl::StatusOr<int> count = cuda::DeviceCount();
    if (!count.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "spec.memory_kind: MEMORY_KIND_CUDA needs a CUDA device and this daemon has none (",
          count.status().message(), ")"));
    }
    if (device < 0 || device >= *count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.device: GPU", device, " does not exist (this daemon sees ", *count, " GPUs)"));
    }
    if (share.cuda_vmm().chunks_size() > kMaxVmmChunks) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".chunks: ", share.cuda_vmm().chunks_size(), " chunks; at most ", kMaxVmmChunks));
    }
    std::vector<std::pair<int, uint64_t>> chunks;
    for (int i = 0; i < share.cuda_vmm().chunks_size(); ++i) {
      const v1::CudaVmmChunk& chunk = share.cuda_vmm().chunks(i);
      absl::StatusOr<UniqueFd> fd = TakeFd(chunk.fd_token(), session_id, restore);
      if (!fd.ok()) {
        return absl::Status(
            fd.status().code(),
            absl::StrCat(field, ".chunks[", i, "].fd_token: ", fd.status().message()));
      }
      taken->emplace_back(chunk.fd_token(), *std::move(fd));
      chunks.emplace_back(taken->back().second.get(), chunk.size_bytes());
    }
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<VmmMapping> vmm,
                            VmmMapping::Import(device, chunks, field));
    if (share.offset() > vmm->allocation_bytes() ||
        size > vmm->allocation_bytes() - share.offset()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.size_bytes: region [", share.offset(), ", ", share.offset() + size,
          ") does not fit the ", vmm->allocation_bytes(), " bytes of ", field, ".chunks"));
    }
    return vmm;
  }

  // A per-layer region (spec.layer_shares): validated, each layer imported (host fd tokens are
  // all taken or, on any error, all given back), then added.
  absl::StatusOr<std::shared_ptr<Region>> RegisterLayered(const v1::RegionSpec& spec,
                                                          uint64_t session_id,
                                                          std::shared_ptr<void> charge,
                                                          Restore* restore) {
    if (spec.share().via_case() != v1::RegionShare::VIA_NOT_SET) {
      return absl::InvalidArgumentError(
          "spec.share: a per-layer region shares each layer in spec.layer_shares; leave "
          "spec.share unset");
    }
    if (spec.layout_case() != v1::RegionSpec::kPagedKv) {
      return absl::InvalidArgumentError(
          "spec.layer_shares: per-layer regions are paged KV (set spec.paged_kv)");
    }
    if (static_cast<uint32_t>(spec.layer_shares_size()) != spec.paged_kv().num_layers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.layer_shares: ", spec.layer_shares_size(), " shares for ",
                       spec.paged_kv().num_layers(), " layers (spec.paged_kv.num_layers)"));
    }
    KVRAIL_ASSIGN_OR_RETURN(planner::RegionView view, Validate(spec, true));
    const bool cuda = spec.memory_kind() == v1::MEMORY_KIND_CUDA;
    std::vector<LayerMemory> layers(spec.layer_shares_size());
    std::vector<std::pair<std::string, UniqueFd>> taken;  // given back unless all layers map
    absl::Status failed;
    for (int l = 0; l < spec.layer_shares_size() && failed.ok(); ++l) {
      const v1::RegionShare& share = spec.layer_shares(l);
      const std::string field = absl::StrCat("spec.layer_shares[", l, "]");
      LayerMemory& layer = layers[l];
      layer.spec = LayerSpec(spec, l);
      if (cuda && share.via_case() == v1::RegionShare::kCudaVmm) {
        absl::StatusOr<std::shared_ptr<VmmMapping>> imported =
            ImportVmm(share, spec.device(), spec.size_bytes(), session_id, field + ".cuda_vmm",
                      &taken, restore);
        if (!imported.ok()) {
          failed = imported.status();
          break;
        }
        layer.vmm = *imported;
        layer.cuda = layer.vmm;
        layer.data = layer.cuda->base() + share.offset();
        continue;
      }
      if (cuda) {
        if (share.via_case() != v1::RegionShare::kCudaIpcHandle) {
          failed = absl::InvalidArgumentError(
              absl::StrCat(field, ": a CUDA layer is shared with cuda_ipc_handle or cuda_vmm"));
          break;
        }
        absl::StatusOr<std::shared_ptr<CudaMapping>> mapped = ImportCudaIpc(layer.spec);
        if (!mapped.ok()) {
          failed = absl::Status(mapped.status().code(),
                                absl::StrCat(field, ": ", mapped.status().message()));
          break;
        }
        layer.cuda = *std::move(mapped);
        layer.data = layer.cuda->base() + share.offset();
        continue;
      }
      if (share.via_case() != v1::RegionShare::kFdToken) {
        failed = absl::InvalidArgumentError(absl::StrCat(
            field, ": a host layer is shared with fd_token (the daemon opens nothing by name)"));
        break;
      }
      absl::StatusOr<UniqueFd> fd = TakeFd(share.fd_token(), session_id, restore);
      if (!fd.ok()) {
        failed = absl::Status(fd.status().code(),
                              absl::StrCat(field, ".fd_token: ", fd.status().message()));
        break;
      }
      taken.emplace_back(share.fd_token(), *std::move(fd));
      const int raw = taken.back().second.get();  // sealed where possible, guarded (MapFd)
      const std::string fd_field = field + ".fd_token";
      auto mapped =
          MapFd(raw, share.offset(), spec.size_bytes(), spec.writable(), fd_field.c_str());
      if (!mapped.ok()) {
        failed = absl::Status(mapped.status().code(),
                              absl::StrCat(field, ": ", mapped.status().message()));
        break;
      }
      layer.host = std::shared_ptr<Mapping>(std::move(mapped->first));
      layer.data = mapped->second;
    }
    if (!failed.ok()) {
      if (restore == nullptr) GiveBack(session_id, &taken);
      return failed;
    }
    absl::MutexLock lock(&mu_);
    const uint64_t id = restore != nullptr ? restore->id : next_id_++;
    std::shared_ptr<Region> region = MakeLayeredRegion(
        id, session_id, spec, std::move(view), std::move(layers),
        restore != nullptr ? restore->registered_us : clock_->NowUnixMicros(), std::move(charge));
    regions_[id] = region;
    std::vector<UniqueFd> kept;  // for a successor (handover)
    for (auto& [token, fd] : taken) kept.push_back(std::move(fd));
    if (!kept.empty()) region_fds_[id] = std::move(kept);
    return region;
  }

  static absl::StatusOr<planner::RegionView> Validate(const v1::RegionSpec& spec, bool per_layer) {
    if (spec.memory_kind() == v1::MEMORY_KIND_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          "spec.memory_kind: must be MEMORY_KIND_HOST or MEMORY_KIND_CUDA");
    }
    if (spec.size_bytes() == 0) {
      return absl::InvalidArgumentError("spec.size_bytes: must be > 0");
    }
    if (spec.size_bytes() > (uint64_t{1} << 48)) {
      return absl::InvalidArgumentError("spec.size_bytes: larger than 256 TiB");
    }
    planner::RegionView view{};
    view.size_bytes = spec.size_bytes();
    view.writable = spec.writable();
    switch (spec.layout_case()) {
      case v1::RegionSpec::kPagedKv: {
        view.paged = true;
        KVRAIL_ASSIGN_OR_RETURN(view.layout,
                                planner::ResolveLayout(spec.paged_kv(), spec.size_bytes(),
                                                       "spec.paged_kv.", per_layer));
        break;
      }
      case v1::RegionSpec::kBytes:
        view.paged = false;
        break;
      case v1::RegionSpec::LAYOUT_NOT_SET:
        return absl::InvalidArgumentError("spec.layout: set paged_kv or bytes");
    }
    return view;
  }

  Clock* const clock_;
  sessions::SessionTable* const sessions_;
  const std::vector<GpuName> gpus_;  // RegionSpec.device_uuid lookups
  const RegionLimits limits_;        // zeros made concrete
  const std::shared_ptr<Usage> usage_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Sessions registering a RegionSpec.library_region right now (at most one per session).
  absl::flat_hash_set<uint64_t> library_pending_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(uint64_t)>> unregister_hooks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Region>> regions_ ABSL_GUARDED_BY(mu_);
  // Each region's descriptors (host fds, cuMem chunk fds), kept while it is registered so that a
  // hot restart can hand them to the successor (ExportState). One per share or layer.
  absl::flat_hash_map<uint64_t, std::vector<UniqueFd>> region_fds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<RegionTable> RegionTable::Create(Clock* clock, sessions::SessionTable* sessions,
                                                 uint64_t first_region_id,
                                                 std::vector<GpuName> gpus, RegionLimits limits) {
  auto table =
      std::make_unique<RegionTableImpl>(clock, sessions, first_region_id, std::move(gpus), limits);
  sessions->AddSessionEndHook([raw = table.get()](uint64_t session) { raw->EndSession(session); });
  return table;
}

}  // namespace kvrail::regions

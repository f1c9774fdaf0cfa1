#include "daemon/regions/regions.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "base/cuda/cuda_util.h"
#include "daemon/regions/cuda_import.h"

namespace kvrail::regions {
namespace {

// Owns one mmap. Not thread-safe to move; the mapping itself is shared read/write memory.
class Mapping {
 public:
  Mapping(void* base, size_t length) : base_(base), length_(length) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base_ != nullptr) ::munmap(base_, length_);
  }
  uint8_t* at(size_t offset) const { return static_cast<uint8_t*>(base_) + offset; }
  void* base() const { return base_; }
  size_t length() const { return length_; }

 private:
  void* base_;
  size_t length_;
};

// Thread-safe: the spec, view and memory are immutable after construction; the host pin and the
// peer-GPU views are made on first use under pin_mu_; the use count is atomic.
class RegionImpl final : public Region {
 public:
  // `backing` keeps the memory mapped (a host Mapping or a CudaMapping); `host_mapping` is the
  // host Mapping to pin for CUDA engines (nullptr for CUDA regions).
  RegionImpl(uint64_t id, uint64_t session_id, v1::RegionSpec spec, planner::RegionView view,
             std::shared_ptr<void> backing, const Mapping* host_mapping, uint8_t* data,
             int64_t registered_us)
      : id_(id),
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
      absl::MutexLock lock(&pin_mu_);
      std::shared_ptr<CudaMapping>& view = peer_views_[accessor];
      if (view == nullptr) {
        absl::StatusOr<std::shared_ptr<CudaMapping>> opened = ImportCudaIpcOn(spec_, accessor);
        if (!opened.ok()) {
          peer_views_.erase(accessor);
          return absl::Status(opened.status().code(),
                              absl::StrCat("region ", id_, ": mapping GPU", spec_.device(),
                                           " memory into GPU", accessor, ": ",
                                           opened.status().message()));
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
    v1::RegionInfo info;
    info.set_region_id(id_);
    *info.mutable_spec() = spec_;
    info.set_session_id(session_id_);
    info.set_active_transfers(active_.load(std::memory_order_relaxed));
    info.set_registered_unix_us(registered_us_);
    return info;
  }
  void AcquireUse() override { active_.fetch_add(1, std::memory_order_relaxed); }
  void ReleaseUse() override { active_.fetch_sub(1, std::memory_order_relaxed); }

 private:
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

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

// Maps [offset, offset + size) of `fd` (file size checked first), read-only unless writable.
absl::StatusOr<std::pair<std::unique_ptr<Mapping>, uint8_t*>> MapFd(int fd, uint64_t offset,
                                                                    uint64_t size,
                                                                    bool writable,
                                                                    const char* field) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": fstat failed: ", ErrnoText(errno)));
  }
  if (offset > static_cast<uint64_t>(st.st_size) ||
      size > static_cast<uint64_t>(st.st_size) - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.size_bytes: region [", offset, ", ", offset + size, ") does not fit the shared object of ",
        st.st_size, " bytes"));
  }
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t aligned = offset - offset % page;
  const size_t length = size + (offset - aligned);
  // MAP_POPULATE: fault the pages in at registration, so the first transfer does not pay for
  // page-table set-up on the hot path.
  void* base = ::mmap(nullptr, length, PROT_READ | (writable ? PROT_WRITE : 0),
                      MAP_SHARED | MAP_POPULATE, fd, static_cast<off_t>(aligned));
  if (base == MAP_FAILED) {
    const int err = errno;
    if (err == EACCES && writable) {
      return absl::PermissionDeniedError(absl::StrCat(
          "spec.writable: the shared object cannot be mapped for writing: ", ErrnoText(err)));
    }
    return absl::InternalError(absl::StrCat(field, ": mmap failed: ", ErrnoText(err)));
  }
  auto mapping = std::make_unique<Mapping>(base, length);
  uint8_t* data = mapping->at(offset - aligned);
  return std::make_pair(std::move(mapping), data);
}

// Thread-safe: the id counters, regions and pending fd tokens are guarded by mu_. Mapping and
// CUDA imports happen outside mu_; Add and TakeToken take it for the table updates only.
class RegionTableImpl final : public RegionTable {
 public:
  explicit RegionTableImpl(Clock* clock) : clock_(clock) {}

  absl::StatusOr<std::shared_ptr<Region>> Register(const v1::RegionSpec& spec,
                                                   uint64_t session_id) override {
    KVRAIL_ASSIGN_OR_RETURN(planner::RegionView view, Validate(spec));
    if (spec.memory_kind() == v1::MEMORY_KIND_CUDA) {
      KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<CudaMapping> cuda, ImportCudaIpc(spec));
      uint8_t* data = cuda->base() + spec.share().offset();
      std::shared_ptr<Region> region = Add(spec, session_id, view, std::move(cuda), nullptr, data);
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
        field = "spec.share.fd_token";
        KVRAIL_ASSIGN_OR_RETURN(fd, TakeToken(spec.share().fd_token(), session_id));
        // A client that shrinks the file after registration would make the daemon's accesses
        // fault; sealing it against shrinking removes that hazard.
        if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
          const int seals = ::fcntl(fd.get(), F_GET_SEALS);
          if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
            return absl::FailedPreconditionError(
                "spec.share.fd_token: the fd must be a memfd created with MFD_ALLOW_SEALING so "
                "the daemon can seal it against shrinking");
          }
        }
        break;
      }
      case v1::RegionShare::kShmName: {
        field = "spec.share.shm_name";
        const std::string& name = spec.share().shm_name();
        if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos) {
          return absl::InvalidArgumentError(
              "spec.share.shm_name: must be '/' followed by a name without further '/'");
        }
        fd.Reset(::shm_open(name.c_str(), spec.writable() ? O_RDWR : O_RDONLY, 0));
        if (!fd.valid()) {
          const int err = errno;
          if (err == ENOENT) {
            return absl::NotFoundError(absl::StrCat("spec.share.shm_name: no shared memory object ", name));
          }
          return absl::PermissionDeniedError(
              absl::StrCat("spec.share.shm_name: cannot open ", name, ": ", ErrnoText(err)));
        }
        break;
      }
      case v1::RegionShare::kCudaIpcHandle:
        return absl::InvalidArgumentError(
            "spec.share.cuda_ipc_handle: CUDA IPC handles share CUDA memory, not host memory "
            "(set spec.memory_kind = MEMORY_KIND_CUDA)");
      case v1::RegionShare::VIA_NOT_SET:
        return absl::InvalidArgumentError(
            "spec.share: say how the memory is shared (fd_token or shm_name)");
    }
    auto mapped_or = MapFd(fd.get(), spec.share().offset(), spec.size_bytes(), spec.writable(), field);
    if (!mapped_or.ok()) {
      // A size or permission mistake should not cost the client its fd: the token stays valid.
      if (spec.share().via_case() == v1::RegionShare::kFdToken) {
        absl::MutexLock lock(&mu_);
        tokens_.emplace(spec.share().fd_token(), PendingFd{session_id, std::move(fd)});
      }
      return mapped_or.status();
    }
    auto mapped = *std::move(mapped_or);
    const Mapping* host_mapping = mapped.first.get();
    return Add(spec, session_id, view, std::shared_ptr<Mapping>(std::move(mapped.first)),
               host_mapping, mapped.second);
  }

  absl::Status Unregister(uint64_t region_id) override {
    absl::MutexLock lock(&mu_);
    if (regions_.erase(region_id) == 0) {
      return absl::NotFoundError(absl::StrCat("region_id: no region ", region_id));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<Region>> Get(uint64_t region_id) const override {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(region_id);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("region ", region_id, " is not registered"));
    }
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

  uint64_t BeginSession() override {
    absl::MutexLock lock(&mu_);
    return next_session_++;
  }

  absl::StatusOr<std::string> AddFd(uint64_t session_id, UniqueFd fd) override {
    absl::MutexLock lock(&mu_);
    if (tokens_.size() >= kMaxTokens) {
      return absl::ResourceExhaustedError("too many unused fd tokens; register or close them");
    }
    std::string token;
    do {
      token = absl::StrCat(absl::Hex(rng_(), absl::kZeroPad16), absl::Hex(rng_(), absl::kZeroPad16));
    } while (tokens_.contains(token));
    tokens_.emplace(token, PendingFd{session_id, std::move(fd)});
    return token;
  }

  void EndSession(uint64_t session_id) override {
    std::vector<std::shared_ptr<Region>> dropped;  // unmapped outside the lock
    absl::MutexLock lock(&mu_);
    for (auto it = tokens_.begin(); it != tokens_.end();) {
      if (it->second.session_id == session_id) {
        tokens_.erase(it++);
      } else {
        ++it;
      }
    }
    for (auto it = regions_.begin(); it != regions_.end();) {
      if (it->second->session_id() == session_id) {
        dropped.push_back(std::move(it->second));
        regions_.erase(it++);
      } else {
        ++it;
      }
    }
  }

 private:
  static constexpr size_t kMaxTokens = 4096;
  struct PendingFd {
    uint64_t session_id;
    UniqueFd fd;
  };

  std::shared_ptr<Region> Add(const v1::RegionSpec& spec, uint64_t session_id,
                              const planner::RegionView& view, std::shared_ptr<void> backing,
                              const Mapping* host_mapping, uint8_t* data) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_id_++;
    auto region = std::make_shared<RegionImpl>(id, session_id, spec, view, std::move(backing),
                                               host_mapping, data, clock_->NowUnixMicros());
    regions_[id] = region;
    return region;
  }

  absl::StatusOr<UniqueFd> TakeToken(const std::string& token, uint64_t session_id)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = tokens_.find(token);
    if (it == tokens_.end()) {
      return absl::NotFoundError("spec.share.fd_token: unknown or already used token");
    }
    if (it->second.session_id != session_id) {
      return absl::PermissionDeniedError(
          "spec.share.fd_token: the token belongs to another session (session_id must be the "
          "session that passed the fd)");
    }
    UniqueFd fd = std::move(it->second.fd);
    tokens_.erase(it);
    return fd;
  }

  static absl::StatusOr<planner::RegionView> Validate(const v1::RegionSpec& spec) {
    if (spec.memory_kind() == v1::MEMORY_KIND_UNSPECIFIED) {
      return absl::InvalidArgumentError("spec.memory_kind: must be MEMORY_KIND_HOST or MEMORY_KIND_CUDA");
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
                         planner::ResolveLayout(spec.paged_kv(), spec.size_bytes(), "spec.paged_kv."));
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
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<RegionImpl>> regions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, PendingFd> tokens_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_){std::random_device{}()};
};

}  // namespace

std::unique_ptr<RegionTable> RegionTable::Create(Clock* clock) {
  return std::make_unique<RegionTableImpl>(clock);
}

}  // namespace kvrail::regions

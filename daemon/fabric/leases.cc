#include "daemon/fabric/leases.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "spdlog/spdlog.h"

namespace kvrail::fabric {
namespace {

// Thread contract: immutable after construction; thread-safe.
class LeasedRegion final : public regions::Region {
 public:
  LeasedRegion(v1::RegionLease lease, planner::RegionView view, const std::string& what)
      : lease_(std::move(lease)), view_(std::move(view)) {
    spec_.set_name(
        absl::StrCat(what, " region ", lease_.region_id(), " on '", lease_.owner_node_id(), "'"));
    spec_.set_memory_kind(v1::MEMORY_KIND_HOST);
    spec_.set_size_bytes(lease_.size_bytes());
    spec_.set_writable(lease_.writable());
    if (lease_.has_paged_kv()) *spec_.mutable_paged_kv() = lease_.paged_kv();
  }
  uint64_t id() const override { return lease_.region_id(); }
  uint64_t session_id() const override { return 0; }
  uint8_t* data() const override { return nullptr; }
  absl::StatusOr<uint8_t*> DeviceAddress(int /*accessor*/) const override {
    return absl::FailedPreconditionError("a leased remote region has no local address");
  }
  const v1::RegionSpec& spec() const override { return spec_; }
  const planner::RegionView& view() const override { return view_; }
  v1::RegionInfo Info() const override {
    v1::RegionInfo info;
    info.set_region_id(id());
    *info.mutable_spec() = spec_;
    return info;
  }
  void AcquireUse() override {}
  void ReleaseUse() override {}

 private:
  const v1::RegionLease lease_;
  const planner::RegionView view_;
  v1::RegionSpec spec_;
};

}  // namespace

absl::StatusOr<v1::RegionLease> Leases::Export(uint64_t region_id, const std::string& peer_node) {
  if (peers_->Find(peer_node) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("peer_node_id: '", peer_node, "' is not in this daemon's peer directory"));
  }
  auto region = regions_->Get(region_id);
  if (!region.ok())
    return absl::NotFoundError(absl::StrCat("region_id: ", region.status().message()));
  // Host and GPU regions alike: arriving tiles are scattered by the host twin or, for GPU memory,
  // by the copy engines from the pinned staging slots (tile_copy.h).
  {
    absl::MutexLock lock(&mu_);
    exports_[region_id].insert(peer_node);
  }
  spdlog::info("fabric: region {} exported to '{}'", region_id, peer_node);
  return Get(region_id, peer_node);
}

absl::StatusOr<v1::RegionLease> Leases::Get(uint64_t region_id,
                                            const std::string& requester) const {
  auto region = regions_->Get(region_id);
  if (!region.ok())
    return absl::NotFoundError(absl::StrCat("region_id: ", region.status().message()));
  {
    absl::MutexLock lock(&mu_);
    auto it = exports_.find(region_id);
    if (it == exports_.end() || !it->second.count(requester)) {
      return absl::PermissionDeniedError(absl::StrCat("region ", region_id, " of node '", node_id_,
                                                      "' is not exported to '", requester, "'"));
    }
  }
  const v1::RegionSpec& spec = (*region)->spec();
  v1::RegionLease lease;
  lease.set_region_id(region_id);
  lease.set_owner_node_id(node_id_);
  lease.set_holder_node_id(requester);
  lease.set_size_bytes(spec.size_bytes());
  lease.set_writable(spec.writable());
  if (spec.has_paged_kv()) *lease.mutable_paged_kv() = spec.paged_kv();
  return lease;
}

std::shared_ptr<regions::Region> MakeLeasedRegion(v1::RegionLease lease, planner::RegionView view,
                                                  const std::string& what) {
  return std::make_shared<LeasedRegion>(std::move(lease), std::move(view), what);
}

absl::StatusOr<planner::RegionView> RemoteViewOf(uint64_t size, bool writable,
                                                 const v1::PagedKvLayout* paged,
                                                 const std::string& field) {
  planner::RegionView view;
  view.size_bytes = size;
  view.writable = writable;
  if (paged != nullptr) {
    view.paged = true;
    KVRAIL_ASSIGN_OR_RETURN(view.layout, planner::ResolveLayout(*paged, size, field));
  }
  return view;
}

}  // namespace kvrail::fabric

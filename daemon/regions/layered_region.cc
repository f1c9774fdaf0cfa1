#include "daemon/regions/layered_region.h"

#include <atomic>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/cuda/cuda_util.h"
#include "base/status.h"

namespace kvrail::regions {
namespace {

// Thread-safe: spec, view and layers are immutable after construction; per-accessor tables
// (pins of host layers, peer-GPU imports of CUDA layers) are made once under mu_.
class LayeredRegion final : public Region {
 public:
  LayeredRegion(uint64_t id, uint64_t session_id, v1::RegionSpec spec, planner::RegionView view,
                std::vector<LayerMemory> layers, int64_t registered_us,
                std::shared_ptr<void> charge)
      : charge_(std::move(charge)),
        id_(id),
        session_id_(session_id),
        spec_(std::move(spec)),
        layers_(std::move(layers)),
        view_(WithBases(std::move(view), layers_)),
        registered_us_(registered_us) {}

  uint64_t id() const override { return id_; }
  uint64_t session_id() const override { return session_id_; }
  uint8_t* data() const override { return layers_.front().data; }

  absl::StatusOr<uint8_t*> DeviceAddress(int accessor) const override {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<const planner::LayerBases> bases,
                            DeviceLayerBases(accessor));
    return reinterpret_cast<uint8_t*>(bases->front());
  }

  absl::StatusOr<std::shared_ptr<const planner::LayerBases>> DeviceLayerBases(
      int accessor) const override ABSL_LOCKS_EXCLUDED(mu_) {
    const bool cuda = spec_.memory_kind() == v1::MEMORY_KIND_CUDA;
    if (cuda && accessor == spec_.device()) return view_.layer_bases;
    absl::MutexLock lock(&mu_);
    auto& cached = by_accessor_[cuda ? accessor : -1];  // host pins serve every GPU
    if (cached != nullptr) return cached;
    // Made into locals first: a layer that fails leaves nothing half pinned or mapped.
    auto bases = std::make_shared<planner::LayerBases>();
    bases->reserve(layers_.size());
    std::vector<cuda::HostRegistration> pins;
    std::vector<std::shared_ptr<CudaMapping>> views;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LayerMemory& layer = layers_[l];
      if (cuda && layer.vmm != nullptr) {
        absl::Status granted = layer.vmm->GrantAccess(accessor);
        if (!granted.ok()) {
          return absl::Status(granted.code(),
                              absl::StrCat("region ", id_, " layer ", l, ": ", granted.message()));
        }
        bases->push_back(reinterpret_cast<uint64_t>(layer.data));
      } else if (cuda) {
        absl::StatusOr<std::shared_ptr<CudaMapping>> opened = ImportCudaIpcOn(layer.spec, accessor);
        if (!opened.ok()) {
          return absl::Status(
              opened.status().code(),
              absl::StrCat("region ", id_, " layer ", l, ": mapping GPU", spec_.device(),
                           " memory into GPU", accessor, ": ", opened.status().message()));
        }
        bases->push_back(
            reinterpret_cast<uint64_t>((*opened)->base() + layer.spec.share().offset()));
        views.push_back(*std::move(opened));
      } else {
        absl::StatusOr<cuda::HostRegistration> pin = cuda::HostRegistration::Register(
            layer.host->base(), layer.host->length(), !spec_.writable());
        if (!pin.ok()) {
          return absl::Status(
              pin.status().code(),
              absl::StrCat("region ", id_, " layer ", l,
                           ": pinning host memory for the GPU: ", pin.status().message()));
        }
        bases->push_back(reinterpret_cast<uint64_t>(pin->DevicePointer(layer.data)));
        pins.push_back(*std::move(pin));
      }
    }
    for (auto& pin : pins) pins_.push_back(std::move(pin));
    for (auto& view : views) peer_views_.push_back(std::move(view));
    cached = std::move(bases);
    return cached;
  }

  const v1::RegionSpec& spec() const override { return spec_; }
  const planner::RegionView& view() const override { return view_; }
  v1::RegionInfo Info() const override {
    v1::RegionInfo info = RegionInfoOf(id_, spec_, session_id_,
                                       active_.load(std::memory_order_relaxed), registered_us_);
    if (spec_.memory_kind() == v1::MEMORY_KIND_HOST) {
      bool sealed = true;
      for (const LayerMemory& layer : layers_) sealed = sealed && layer.host->sealed();
      info.set_host_sealed(sealed);
      info.set_poisoned(Poisoned());
    }
    return info;
  }
  void AcquireUse() override { active_.fetch_add(1, std::memory_order_relaxed); }
  void ReleaseUse() override { active_.fetch_sub(1, std::memory_order_relaxed); }
  absl::Status Health(absl::string_view field) const override {
    return Poisoned() ? PoisonedError(field, id_) : absl::OkStatus();
  }

 private:
  bool Poisoned() const {
    for (const LayerMemory& layer : layers_) {
      if (layer.host != nullptr && layer.host->poisoned()) return true;
    }
    return false;
  }
  static planner::RegionView WithBases(planner::RegionView view,
                                       const std::vector<LayerMemory>& layers) {
    auto bases = std::make_shared<planner::LayerBases>();
    for (const LayerMemory& layer : layers)
      bases->push_back(reinterpret_cast<uint64_t>(layer.data));
    view.layer_bases = std::move(bases);
    return view;
  }

  // What the region counts against RegionLimits; given back last.
  const std::shared_ptr<void> charge_;
  const uint64_t id_;
  const uint64_t session_id_;
  const v1::RegionSpec spec_;
  const std::vector<LayerMemory> layers_;
  const planner::RegionView view_;
  const int64_t registered_us_;
  std::atomic<uint32_t> active_{0};
  // Declared after layers_: unpinned and unmapped from peers before the layers' memory goes.
  mutable absl::Mutex mu_;
  mutable std::map<int, std::shared_ptr<const planner::LayerBases>> by_accessor_
      ABSL_GUARDED_BY(mu_);
  mutable std::vector<cuda::HostRegistration> pins_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::shared_ptr<CudaMapping>> peer_views_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

v1::RegionInfo RegionInfoOf(uint64_t id, const v1::RegionSpec& spec, uint64_t session_id,
                            uint32_t active, int64_t registered_us) {
  v1::RegionInfo info;
  info.set_region_id(id);
  *info.mutable_spec() = spec;
  info.set_session_id(session_id);
  info.set_active_transfers(active);
  info.set_registered_unix_us(registered_us);
  return info;
}

v1::RegionSpec LayerSpec(const v1::RegionSpec& spec, int index) {
  v1::RegionSpec layer = spec;
  layer.clear_layer_shares();
  *layer.mutable_share() = spec.layer_shares(index);
  return layer;
}

std::shared_ptr<Region> MakeLayeredRegion(uint64_t id, uint64_t session_id, v1::RegionSpec spec,
                                          planner::RegionView view, std::vector<LayerMemory> layers,
                                          int64_t registered_us, std::shared_ptr<void> charge) {
  return std::make_shared<LayeredRegion>(id, session_id, std::move(spec), std::move(view),
                                         std::move(layers), registered_us, std::move(charge));
}

}  // namespace kvrail::regions

#include "daemon/scheduler/route.h"

#include "absl/strings/str_cat.h"
#include "topology/topology.h"

namespace kvrail::scheduler {

std::vector<int> GpuIndexByOrdinal(const v1::TopologyDesc& desc) {
  std::vector<int> out;
  for (const auto& gpu : desc.gpus()) {
    const int ordinal = gpu.cuda_ordinal();
    if (ordinal < 0) continue;
    if (static_cast<size_t>(ordinal) >= out.size()) out.resize(ordinal + 1, -1);
    out[ordinal] = gpu.index();
  }
  return out;
}

namespace {

int IndexOf(int ordinal, const std::vector<int>& index_by_ordinal) {
  if (index_by_ordinal.empty()) return ordinal;
  if (ordinal < 0 || static_cast<size_t>(ordinal) >= index_by_ordinal.size()) return -1;
  return index_by_ordinal[ordinal];
}

std::string Where(const Placement& p) {
  return p.cuda ? absl::StrCat("GPU", p.device) : std::string("host memory");
}

}  // namespace

absl::StatusOr<Route> ChooseRoute(const Placement& src, const Placement& dst,
                                  const v1::TopologyGraph& graph,
                                  const std::vector<int>& index_by_ordinal, bool have_cuda_engine,
                                  const std::string& src_field, const std::string& dst_field) {
  Route route;
  if (!src.cuda && !dst.cuda) {
    route.engine = EngineKind::kHost;
    route.path = v1::PATH_HOST_LOCAL;
    route.reason = "source and destination are host memory of this node";
    return route;
  }
  if (!have_cuda_engine) {
    return absl::FailedPreconditionError(
        absl::StrCat(src.cuda ? src_field : dst_field,
                     ": the region is GPU memory and this daemon has no CUDA "
                     "engine (no GPU or driver, or cuda_max_ctas/cuda engine disabled)"));
  }
  route.engine = EngineKind::kCuda;
  if (!src.cuda || !dst.cuda) {
    route.path = v1::PATH_CUDA_LOCAL;
    route.reason = absl::StrCat(Where(src), " -> ", Where(dst),
                                ": the GPU reaches pinned, mapped host memory over PCIe");
    return route;
  }
  if (src.device == dst.device) {
    route.path = v1::PATH_CUDA_LOCAL;
    route.reason = absl::StrCat("GPU", src.device, " -> GPU", dst.device, ": same GPU");
    return route;
  }
  const int a = IndexOf(src.device, index_by_ordinal), b = IndexOf(dst.device, index_by_ordinal);
  absl::StatusOr<v1::GpuRoute> gpu_route = topology::ChoosePath(graph, a, b);
  const std::string pair = absl::StrCat("GPU", src.device, "-GPU", dst.device);
  if (!gpu_route.ok()) {
    route.path = v1::PATH_UNSPECIFIED;
    route.reason = absl::StrCat(pair, ": not in the topology graph (", gpu_route.status().message(),
                                "); peer access if the driver grants it, else staged copies");
    return route;
  }
  switch (gpu_route->path()) {
    case v1::TRANSFER_PATH_NVLINK_P2P:
      route.path = v1::PATH_NVLINK_P2P;
      break;
    case v1::TRANSFER_PATH_PCIE_P2P:
      route.path = v1::PATH_PCIE_P2P;
      break;
    case v1::TRANSFER_PATH_LOCAL:  // two ordinals of one GPU (should not happen)
      route.path = v1::PATH_CUDA_LOCAL;
      break;
    default:
      route.path = v1::PATH_PCIE_STAGED;
      route.reason = absl::StrCat(pair, " ", gpu_route->why(),
                                  "; copy engines (the driver stages through host memory)");
      return route;
  }
  route.reason = absl::StrCat(pair, " ", gpu_route->why());
  return route;
}

}  // namespace kvrail::scheduler

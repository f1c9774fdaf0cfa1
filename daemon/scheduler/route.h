// Scheduler: where a transfer goes. Pure functions of the two regions' placements and the
// node's topology graph (no I/O, no CUDA), so fixtures of real machines give the same answers
// in CI as on the machines.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/job/job.h"
#include "proto/kvrail/v1/topology.pb.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::scheduler {

// Where one side of a transfer lives (only the memory's kind and GPU matter here).
using job::Placement;

enum class EngineKind { kHost, kCuda };

struct Route {
  EngineKind engine = EngineKind::kHost;
  v1::Path path = v1::PATH_UNSPECIFIED;
  std::string reason;  // for TransferStatus.path_reason, e.g. "GPU0-GPU1 NV18: direct peer ..."
};

// Maps CUDA ordinals to the graph's GPU indexes (TopologyDesc.gpus[].cuda_ordinal); ordinals
// missing from `desc` map to -1.
std::vector<int> GpuIndexByOrdinal(const v1::TopologyDesc& desc);

// host + host: the host engine, PATH_HOST_LOCAL. Anything with GPU memory: the CUDA engine
// (FAILED_PRECONDITION naming `src_field`/`dst_field` without one): the same GPU or a GPU and
// host memory PATH_CUDA_LOCAL; two GPUs as topology::ChoosePath says (NV# with P2P:
// PATH_NVLINK_P2P; PIX/PXB with P2P: PATH_PCIE_P2P; otherwise PATH_PCIE_STAGED, copy engines that
// the driver stages through host memory). GPUs the graph does not know get PATH_UNSPECIFIED with
// a reason (the engine still uses peer access when the driver grants it).
// `index_by_ordinal` empty: ordinals are graph indexes.
absl::StatusOr<Route> ChooseRoute(const Placement& src, const Placement& dst,
                                  const v1::TopologyGraph& graph,
                                  const std::vector<int>& index_by_ordinal, bool have_cuda_engine,
                                  const std::string& src_field = "spec.src.region_id",
                                  const std::string& dst_field = "spec.dst.region_id");

}  // namespace kvrail::scheduler

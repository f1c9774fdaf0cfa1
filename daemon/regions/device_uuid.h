// GPUs named by UUID (RegionSpec.device_uuid): a pod's GPU0 may be the host's GPU5, so a client
// names the GPU by the UUID nvidia-smi prints and the daemon finds its own CUDA ordinal for it.
// Pure functions over the daemon's GPU list (from its topology); thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/kvrail/v1/region.pb.h"

namespace kvrail::regions {

// One GPU of the daemon's node: its UUID as the topology holds it and the daemon's CUDA ordinal
// for it (-1: the daemon's CUDA runtime does not see it).
struct GpuName {
  std::string uuid;
  int cuda_ordinal = -1;
};

// "GPU-" + 8-4-4-4-12 lowercase hex digits, from `text` with or without the "GPU-" prefix and
// in either case. INVALID_ARGUMENT naming `field` otherwise (MIG instances, "MIG-...", are not
// whole GPUs and are refused with a message saying so).
absl::StatusOr<std::string> NormalizeGpuUuid(absl::string_view text, absl::string_view field);

// When spec->device_uuid() is set: checks it (see region.proto's RegionSpec.device_uuid for
// every error) and stores the GPU's ordinal in spec->device, replacing the client's ordinal
// (which may number GPUs differently), and the canonical UUID in spec->device_uuid. A no-op
// when it is empty.
absl::Status ResolveDeviceUuid(const std::vector<GpuName>& gpus, v1::RegionSpec* spec);

}  // namespace kvrail::regions

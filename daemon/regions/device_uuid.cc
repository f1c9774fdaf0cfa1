#include "daemon/regions/device_uuid.h"

#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvrail::regions {

absl::StatusOr<std::string> NormalizeGpuUuid(absl::string_view text, absl::string_view field) {
  if (absl::StartsWithIgnoreCase(text, "MIG-")) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", text, "' names a MIG instance; kvraild maps whole GPUs (name the GPU)"));
  }
  absl::string_view body = text;
  if (absl::StartsWithIgnoreCase(body, "GPU-")) body.remove_prefix(4);
  // 8-4-4-4-12: dashes at 8, 13, 18, 23 of 36 characters.
  bool ok = body.size() == 36;
  for (size_t i = 0; ok && i < body.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    ok = dash ? body[i] == '-' : std::isxdigit(static_cast<unsigned char>(body[i])) != 0;
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", text,
        "' is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi -L prints)"));
  }
  return absl::StrCat("GPU-", absl::AsciiStrToLower(body));
}

absl::Status ResolveDeviceUuid(const std::vector<GpuName>& gpus, v1::RegionSpec* spec) {
  if (spec->device_uuid().empty()) return absl::OkStatus();
  if (spec->memory_kind() != v1::MEMORY_KIND_CUDA) {
    return absl::InvalidArgumentError(
        "spec.device_uuid: names a GPU; only MEMORY_KIND_CUDA regions live on one");
  }
  auto wanted = NormalizeGpuUuid(spec->device_uuid(), "spec.device_uuid");
  if (!wanted.ok()) return wanted.status();
  for (const GpuName& gpu : gpus) {
    auto have = NormalizeGpuUuid(gpu.uuid, "topology");
    if (!have.ok() || *have != *wanted) continue;
    if (gpu.cuda_ordinal < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("spec.device_uuid: ", *wanted,
                       " is a GPU of this node but kvraild's CUDA runtime does not see it "
                       "(CUDA_VISIBLE_DEVICES of the daemon?)"));
    }
    spec->set_device(gpu.cuda_ordinal);
    spec->set_device_uuid(*wanted);
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("spec.device_uuid: kvraild has no GPU ", *wanted,
                                          " (kvrail topo lists this node's GPUs)"));
}

}  // namespace kvrail::regions

#include "daemon/regions/device_uuid.h"

#include <catch2/catch.hpp>

namespace kvrail::regions {
namespace {

const std::vector<GpuName> kGpus = {
    {"GPU-8c1a9e2f-1111-2222-3333-444455556666", 0},
    {"GPU-DEADBEEF-0000-1111-2222-333344445555", 1},   // topology spelled in upper case
    {"GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", -1},  // not visible to the daemon's CUDA
};

v1::RegionSpec Cuda(const std::string& uuid, int device = 0) {
  v1::RegionSpec spec;
  spec.set_memory_kind(v1::MEMORY_KIND_CUDA);
  spec.set_device(device);
  spec.set_device_uuid(uuid);
  return spec;
}

TEST_CASE("NormalizeGpuUuid accepts both spellings and refuses the rest") {
  CHECK(*NormalizeGpuUuid("GPU-8C1A9E2F-1111-2222-3333-444455556666", "f") ==
        "GPU-8c1a9e2f-1111-2222-3333-444455556666");
  CHECK(*NormalizeGpuUuid("8c1a9e2f-1111-2222-3333-444455556666", "f") ==
        "GPU-8c1a9e2f-1111-2222-3333-444455556666");
  for (const char* bad :
       {"", "GPU-", "GPU-8c1a9e2f-1111-2222-3333-44445555666",
        "GPU-8c1a9e2f-1111-2222-3333-4444555566667", "GPU-8c1a9e2f_1111-2222-3333-444455556666",
        "GPU-8c1a9e2g-1111-2222-3333-444455556666", "0"}) {
    auto r = NormalizeGpuUuid(bad, "spec.device_uuid");
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(r.status().message().find("spec.device_uuid") != std::string::npos);
  }
  auto mig = NormalizeGpuUuid("MIG-8c1a9e2f-1111-2222-3333-444455556666", "spec.device_uuid");
  CHECK(mig.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(mig.status().message().find("MIG") != std::string::npos);
}

TEST_CASE("ResolveDeviceUuid stores the daemon's ordinal") {
  v1::RegionSpec spec = Cuda("deadbeef-0000-1111-2222-333344445555");
  REQUIRE(ResolveDeviceUuid(kGpus, &spec).ok());
  CHECK(spec.device() == 1);
  CHECK(spec.device_uuid() == "GPU-deadbeef-0000-1111-2222-333344445555");

  // The client's own ordinal (another numbering, e.g. a pod's CUDA_VISIBLE_DEVICES) is replaced.
  v1::RegionSpec pod = Cuda("GPU-8c1a9e2f-1111-2222-3333-444455556666", 5);
  REQUIRE(ResolveDeviceUuid(kGpus, &pod).ok());
  CHECK(pod.device() == 0);

  v1::RegionSpec none;  // no uuid: untouched
  none.set_device(3);
  CHECK(ResolveDeviceUuid(kGpus, &none).ok());
  CHECK(none.device() == 3);
}

TEST_CASE("ResolveDeviceUuid errors name the field") {
  v1::RegionSpec unknown = Cuda("GPU-00000000-0000-0000-0000-000000000000");
  auto s = ResolveDeviceUuid(kGpus, &unknown);
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(s.message().find("spec.device_uuid") != std::string::npos);
  CHECK(unknown.device() == 0);

  v1::RegionSpec hidden = Cuda("GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee");
  CHECK(ResolveDeviceUuid(kGpus, &hidden).code() == absl::StatusCode::kFailedPrecondition);

  v1::RegionSpec host = Cuda("GPU-8c1a9e2f-1111-2222-3333-444455556666");
  host.set_memory_kind(v1::MEMORY_KIND_HOST);
  s = ResolveDeviceUuid(kGpus, &host);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("spec.device_uuid") != std::string::npos);
}

}  // namespace
}  // namespace kvrail::regions

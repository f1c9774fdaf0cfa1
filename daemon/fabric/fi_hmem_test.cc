// FI_HMEM selection: a provider without FI_HMEM (tcp;ofi_rxm here) still opens
// (the fi_getinfo without FI_HMEM), reports hmem() false, refuses device-memory registration with
// an error naming the provider and FI_HMEM, and registers host memory as before. The FI_HMEM
// registration itself (fi_mr_regattr, FI_HMEM_CUDA) needs a provider that offers it: not here.
#include <catch2/catch.hpp>
#include <vector>

#include "daemon/fabric/fi.h"

namespace kvrail::fabric {
namespace {

TEST_CASE("a provider without FI_HMEM opens, says so and refuses GPU memory registration") {
  Nic::Options options;
  options.provider = "tcp;ofi_rxm";
  options.address = "127.0.0.1";
  options.name = "nic0@127.0.0.1";
  options.hmem = true;
  absl::StatusOr<std::unique_ptr<Nic>> nic = Nic::Open(options);
  REQUIRE(nic.ok());
  CHECK_FALSE((*nic)->hmem());
  std::vector<uint8_t> memory(1 << 16);
  absl::StatusOr<std::unique_ptr<MemoryRegion>> device =
      (*nic)->RegisterDeviceMemory(memory.data(), memory.size(), 0, 77, FI_WRITE | FI_READ);
  REQUIRE_FALSE(device.ok());
  CHECK(device.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(device.status().message().find("FI_HMEM") != absl::string_view::npos);
  CHECK(device.status().message().find("fabric.provider") != absl::string_view::npos);
  absl::StatusOr<std::unique_ptr<MemoryRegion>> host =
      (*nic)->RegisterMemory(memory.data(), memory.size(), 78, FI_WRITE | FI_READ);
  REQUIRE(host.ok());
  CHECK((*host)->size() == memory.size());
}

TEST_CASE("FI_HMEM is not asked for unless the options say so") {
  Nic::Options options;
  options.provider = "tcp;ofi_rxm";
  options.address = "127.0.0.1";
  options.name = "nic0@127.0.0.1";
  absl::StatusOr<std::unique_ptr<Nic>> nic = Nic::Open(options);
  REQUIRE(nic.ok());
  CHECK_FALSE((*nic)->hmem());
  std::vector<uint8_t> memory(4096);
  CHECK(
      (*nic)->RegisterDeviceMemory(memory.data(), memory.size(), 0, 79, FI_WRITE).status().code() ==
      absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvrail::fabric

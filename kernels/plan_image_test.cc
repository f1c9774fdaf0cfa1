// The plan image the upload stages (plan_image.h): every part where the device header says it
// is, nothing written when the staging is too small.
#define CATCH_CONFIG_MAIN
#include "kernels/plan_image.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "kernels/device_abi.h"

namespace kvrail::kernels {
namespace {

template <typename T>
T At(const std::vector<uint8_t>& image, size_t offset) {
  T v;
  std::memcpy(&v, image.data() + offset, sizeof(T));
  return v;
}

TEST_CASE("the staged image holds header, tables and layer tables where its header points") {
  PlanHeader header{};
  header.num_layers = 2;
  header.num_tiles = 7;
  header.src.num_table_blocks = 3;  // 12 bytes: the layer tables start 8-byte aligned after
  header.dst.num_table_blocks = 2;
  const uint32_t src_blocks[3] = {5, 9, 1};
  const uint32_t dst_blocks[2] = {4, 8};
  const uint64_t dst_layers[3] = {0x1000, 0x2000, 0x3000};  // layer_begin 1 + 2 layers
  header.dst.layer_begin = 1;
  header.dst.layer_bases = reinterpret_cast<uint64_t>(dst_layers);
  const uint64_t device = 0x7f0000000000;

  const PlanImageLayout l = LayoutPlanImage(header);
  CHECK(l.src_l == 0);
  CHECK(l.dst_l == 3);
  CHECK(l.layers_at % 8 == 0);
  CHECK(l.bytes == l.layers_at + 24);

  std::vector<uint8_t> image(l.bytes + 16, 0xEE);
  REQUIRE(WritePlanImage(header, src_blocks, dst_blocks, 0xA000, 0, device, image.data(),
                         image.size()));
  const PlanHeader h = At<PlanHeader>(image, 0);
  CHECK(h.src.base == 0xA000);
  CHECK(h.dst.base == 0);
  CHECK(h.num_tiles == 7);
  REQUIRE(h.src.block_table >= device);
  REQUIRE(h.dst.block_table >= device);
  CHECK(At<uint32_t>(image, h.src.block_table - device) == 5);
  CHECK(At<uint32_t>(image, h.src.block_table - device + 8) == 1);
  CHECK(At<uint32_t>(image, h.dst.block_table - device) == 4);
  CHECK(At<uint32_t>(image, h.dst.block_table - device + 4) == 8);
  CHECK(h.src.layer_bases == 0);  // single-base side: untouched
  REQUIRE(h.dst.layer_bases >= device);
  CHECK(At<uint64_t>(image, h.dst.layer_bases - device) == 0x1000);
  CHECK(At<uint64_t>(image, h.dst.layer_bases - device + 16) == 0x3000);
  CHECK(image[l.bytes] == 0xEE);  // nothing past the image

  // The same header as the unstaged path writes it (DevicePlanHeader).
  const PlanHeader direct = DevicePlanHeader(header, l, device, 0xA000, 0);
  CHECK(std::memcmp(&direct, &h, sizeof(h)) == 0);
}

TEST_CASE("staging too small for the image: nothing written, the caller uploads unstaged") {
  PlanHeader header{};
  header.src.num_table_blocks = 1024;
  header.dst.num_table_blocks = 1024;
  std::vector<uint32_t> ids(1024, 3);
  const PlanImageLayout l = LayoutPlanImage(header);
  CHECK(l.bytes == sizeof(PlanHeader) + 8192);
  std::vector<uint8_t> small(l.bytes - 1, 0xEE);
  CHECK_FALSE(WritePlanImage(header, ids.data(), ids.data(), 1, 2, 3, small.data(), small.size()));
  CHECK(small[0] == 0xEE);
  CHECK_FALSE(WritePlanImage(header, ids.data(), ids.data(), 1, 2, 3, nullptr, 1 << 20));
  std::vector<uint8_t> fits(l.bytes);
  CHECK(WritePlanImage(header, ids.data(), ids.data(), 1, 2, 3, fits.data(), fits.size()));
}

}  // namespace
}  // namespace kvrail::kernels

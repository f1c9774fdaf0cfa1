// The plan image the upload stages (plan_image.h): every part where the device header says it
// is, nothing written when the staging is too small.
#include "kernels/plan_image.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
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

// A random header of a small plan: tables of 0-40 ids, per-layer sides sometimes.
PlanHeader RandomHeader(std::mt19937_64& rng, std::vector<uint64_t>* src_layers,
                        std::vector<uint64_t>* dst_layers) {
  PlanHeader h{};
  h.num_layers = 1 + rng() % 4;
  h.num_tiles = 1 + rng() % 9;
  h.num_tokens = rng() % 1000;
  h.tile_bytes = 512 * (1 + rng() % 8);
  h.src.num_table_blocks = rng() % 41;
  h.dst.num_table_blocks = rng() % 41;
  h.src.block_stride = 4096;
  h.dst.block_stride = 8192;
  for (auto [g, layers] : {std::pair{&h.src, src_layers}, std::pair{&h.dst, dst_layers}}) {
    if (rng() % 2 == 0) continue;
    g->layer_begin = rng() % 3;
    layers->resize(g->layer_begin + h.num_layers);
    for (uint64_t& a : *layers) a = rng();
    g->layer_bases = reinterpret_cast<uint64_t>(layers->data());
  }
  return h;
}

std::vector<uint8_t> Image(const PlanHeader& h, const std::vector<uint32_t>& src,
                           const std::vector<uint32_t>& dst, uint64_t src_base, uint64_t dst_base,
                           uint64_t device) {
  std::vector<uint8_t> image(LayoutPlanImage(h).bytes);
  REQUIRE(WritePlanImage(h, src.data(), dst.data(), src_base, dst_base, device, image.data(),
                         image.size()));
  return image;
}

TEST_CASE(
    "plans of one shape: their images differ in the id section only, which WritePlanIds "
    "writes") {
  std::mt19937_64 rng(31);
  for (int n = 0; n < 200; ++n) {
    std::vector<uint64_t> src_layers, dst_layers;
    const PlanHeader h = RandomHeader(rng, &src_layers, &dst_layers);
    const PlanImageLayout l = LayoutPlanImage(h);
    std::vector<uint32_t> a_src(l.src_n), a_dst(l.dst_n), b_src(l.src_n), b_dst(l.dst_n);
    for (auto* v : {&a_src, &a_dst, &b_src, &b_dst}) {
      for (uint32_t& id : *v) id = static_cast<uint32_t>(rng());
    }
    const uint64_t device = 0x7f0000000000 + 256 * (rng() % 1000);
    const uint64_t src_base = rng(), dst_base = rng();
    std::vector<uint8_t> a = Image(h, a_src, a_dst, src_base, dst_base, device);
    const std::vector<uint8_t> b = Image(h, b_src, b_dst, src_base, dst_base, device);
    // Same shape, whatever the ids.
    CHECK(PlanShapeKey(h, src_base, dst_base) == PlanShapeKey(h, src_base, dst_base));
    const PlanIdsSection ids = IdsSection(l);
    CHECK(ids.at == sizeof(PlanHeader));
    CHECK(ids.bytes == 4 * (l.src_n + l.dst_n));
    for (size_t i = 0; i < a.size(); ++i) {
      if (i >= ids.at && i < ids.at + ids.bytes) continue;
      INFO("byte " << i << " of " << a.size());
      REQUIRE(a[i] == b[i]);
    }
    // Rewriting a's id section with b's ids gives b's image byte for byte.
    std::vector<uint8_t> section(ids.bytes + 8, 0xEE);
    REQUIRE(WritePlanIds(l, b_src.data(), b_dst.data(), section.data(), section.size()));
    CHECK(section[ids.bytes] == 0xEE);
    std::memcpy(a.data() + ids.at, section.data(), ids.bytes);
    CHECK(a == b);
    if (ids.bytes > 0) {
      CHECK_FALSE(WritePlanIds(l, b_src.data(), b_dst.data(), section.data(), ids.bytes - 1));
    }
  }
}

TEST_CASE("the shape key changes with every part of the image but the ids") {
  std::mt19937_64 rng(32);
  std::vector<uint64_t> src_layers, dst_layers;
  PlanHeader h = RandomHeader(rng, &src_layers, &dst_layers);
  h.dst.layer_begin = 0;
  dst_layers.assign(h.num_layers, 0x5000);
  h.dst.layer_bases = reinterpret_cast<uint64_t>(dst_layers.data());
  const std::string key = PlanShapeKey(h, 0x1000, 0x2000);
  CHECK(PlanShapeKey(h, 0x1000, 0x2000) == key);
  CHECK(PlanShapeKey(h, 0x1008, 0x2000) != key);  // another source region (or offset)
  CHECK(PlanShapeKey(h, 0x1000, 0x2010) != key);
  PlanHeader more = h;
  ++more.dst.num_table_blocks;
  CHECK(PlanShapeKey(more, 0x1000, 0x2000) != key);
  PlanHeader tiles = h;
  tiles.tile_bytes *= 2;
  CHECK(PlanShapeKey(tiles, 0x1000, 0x2000) != key);
  PlanHeader tokens = h;
  ++tokens.num_tokens;
  CHECK(PlanShapeKey(tokens, 0x1000, 0x2000) != key);
  // A per-layer side's layer moved (the region replaced): another shape.
  dst_layers.back() += 64;
  CHECK(PlanShapeKey(h, 0x1000, 0x2000) != key);
}

}  // namespace
}  // namespace kvrail::kernels

// Host-side checks of the device ABI and of plan_math.h (the kernel runs the same code).
#include "kernels/plan_math.h"

#include <catch2/catch.hpp>
#include <cstddef>
#include <vector>

namespace kvrail::kernels {

TEST_CASE("ABI structs are POD with fixed layouts") {
  static_assert(sizeof(NicCommand) == 32, "");
  static_assert(offsetof(PlanHeader, dst) == 104, "");
  static_assert(alignof(PlanHeader) == 8, "");
  CHECK(sizeof(PlanHeader) == 312);
}

TEST_CASE("a per-layer side takes layer_bases[layer_begin + l] instead of the layer stride") {
  SideGeometry g{};
  g.part_stride = 100000;
  g.block_stride = 1000;
  g.token_stride = 100;
  g.head_stride = 10;
  g.origin = 7;
  g.layer_begin = 1;
  g.tokens_per_block = MakeFastDiv(4);
  const std::vector<uint64_t> table = {11000000, 55000003, 33000000};
  g.layer_bases = reinterpret_cast<uint64_t>(table.data());
  const std::vector<uint32_t> blocks = {5, 2, 9};
  CHECK(LayerOffset(g, 0) == 55000003);
  CHECK(LayerOffset(g, 1) == 33000000);
  CHECK(SideBase(g, 4096) == 0);
  CHECK(ElementOffset(g, blocks.data(), 1, 1, 6, 4) == 7 + 33000000 + 100000 + 2000 + 200 + 40);
  g.layer_bases = 0;
  g.layer_stride = 1000000;
  CHECK(SideBase(g, 4096) == 4096);
  CHECK(LayerOffset(g, 2) == 2000000);
}

TEST_CASE("ElementOffset follows the documented formula") {
  SideGeometry g{};
  g.layer_stride = 1000000;
  g.part_stride = 100000;
  g.block_stride = 1000;
  g.token_stride = 100;
  g.head_stride = 10;
  g.origin = 7;
  g.tokens_per_block = MakeFastDiv(4);
  const std::vector<uint32_t> blocks = {5, 2, 9};
  // token 6 -> blocks[1] = 2, slot 2.
  CHECK(ElementOffset(g, blocks.data(), 3, 1, 6, 4) == 7 + 3000000 + 100000 + 2000 + 200 + 40);
  CHECK(ElementOffset(g, blocks.data(), 0, 0, 11, 0) == 7 + 9000 + 300);
}

TEST_CASE("TileAt walks layers, then parts, then byte ranges") {
  PlanHeader h{};
  h.num_layers = 3;
  h.num_parts = 2;
  h.part_bytes = 1000;
  h.tile_bytes = 400;
  h.tiles_per_part = 3;
  h.num_tiles = 18;
  const TileDesc t = TileAt(h, 8);  // layer 1, part 0, third tile
  CHECK(t.layer == 1);
  CHECK(t.part == 0);
  CHECK(t.byte_begin == 800);
  CHECK(t.byte_end == 1000);
  const TileDesc u = TileAt(h, 17);
  CHECK(u.layer == 2);
  CHECK(u.part == 1);
  CHECK(u.byte_begin == 800);
}

TEST_CASE("AdvanceChunkPos matches 64-bit division") {
  PlanHeader h{};
  for (uint32_t chunk : {1u, 16u, 48u, 4096u, 12345u, 1u << 30}) {
    h.chunk_bytes = chunk;
    h.chunk_div = MakeFastDiv(chunk);
    for (uint64_t q0 : {0ull, 5ull, 123456789ull}) {
      const ChunkPos p0{static_cast<uint32_t>(q0 / chunk), static_cast<uint32_t>(q0 % chunk)};
      for (uint32_t delta : {0u, 1u, 15u, 4096u, 999999u, 1u << 30}) {
        const ChunkPos p = AdvanceChunkPos(h, p0, delta);
        CHECK(p.chunk == (q0 + delta) / chunk);
        CHECK(p.offset == (q0 + delta) % chunk);
      }
    }
  }
}

}  // namespace kvrail::kernels

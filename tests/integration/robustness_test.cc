// Bad input never crashes the daemon and never writes outside a transfer's destination: many
// random, mostly invalid, requests against a live kvraild. Every rejection names a field; every
// accepted transfer ends, and the bytes it may not touch stay poisoned.
#include <signal.h>

#include <catch2/catch.hpp>
#include <random>
#include <set>

#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

TEST_CASE("random transfer specs: clear errors or clean transfers; the daemon stays up") {
  LiveDaemon live({"--tile-bytes", "16384"});
  const auto a =
      MakeLayout(3, 2, 24, 16, 4, 32, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const auto b =
      MakeLayout(4, 2, 20, 8, 2, 32, v1::DTYPE_BF16, v1::LAYOUT_ORDER_BLOCK_LAYER_PART_HND);
  Pool src = MakePool(*live.client, a, false, "src");
  Pool dst = MakePool(*live.client, b, true, "dst");
  Pool ro = MakePool(*live.client, b, false, "read-only");
  FillPool(src, 1, ScatteredBlocks(24, 24, 0), 24 * 16);
  std::mt19937 rng(20261129);
  auto pick = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
  const std::vector<uint64_t> regions = {src.id(), dst.id(), ro.id(), 0, 999};
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 400; ++i) {
    v1::TransferSpec spec;
    spec.mutable_src()->set_region_id(regions[pick(3) == 0 ? pick(5) : 0]);
    spec.mutable_dst()->set_region_id(regions[pick(3) == 0 ? pick(5) : 1]);
    const uint32_t n_src = pick(6), n_dst = pick(8);
    for (uint32_t k = 0; k < n_src; ++k)
      spec.mutable_src()->add_block_ids(pick(10) == 0 ? pick(100) : pick(24));
    // Destination ids without repeats mostly, so some transfers are valid.
    std::set<uint32_t> used;
    for (uint32_t k = 0; k < n_dst; ++k) {
      uint32_t id = pick(10) == 0 ? pick(100) : pick(20);
      if (pick(8) != 0) {
        while (used.count(id) != 0) id = (id + 1) % 20;
      }
      used.insert(id);
      spec.mutable_dst()->add_block_ids(id);
    }
    if (pick(3) == 0) spec.set_num_layers(pick(5));
    if (pick(3) == 0) spec.mutable_src()->set_layer_begin(pick(4));
    if (pick(3) == 0) spec.mutable_dst()->set_layer_begin(pick(4));
    if (pick(3) == 0) spec.set_num_heads(pick(4));
    if (pick(3) == 0) spec.mutable_src()->set_head_begin(pick(4));
    if (pick(3) == 0) spec.mutable_dst()->set_head_begin(pick(3));
    if (pick(3) == 0) spec.set_num_tokens(pick(200));
    if (pick(10) == 0) spec.set_num_bytes(pick(1 << 20));
    if (pick(10) == 0) spec.mutable_src()->set_byte_offset(uint64_t{pick(1 << 30)} << 20);
    if (pick(8) == 0) spec.set_priority(static_cast<v1::Priority>(pick(6)));
    if (pick(10) == 0) spec.mutable_dst()->set_node_id("elsewhere");
    auto r = live.client->Submit(spec);
    if (!r.ok()) {
      ++rejected;
      const std::string msg(r.status().message());
      INFO(r.status().ToString());
      CHECK(msg.rfind("spec.", 0) == 0);
      CHECK(r.status().code() != absl::StatusCode::kInternal);
      CHECK(r.status().code() != absl::StatusCode::kUnknown);
      continue;
    }
    ++accepted;
    auto done = live.client->Wait(r->transfer_id(), absl::Seconds(10));
    REQUIRE(done.ok());
    CHECK(done->state() == v1::TRANSFER_STATE_SUCCEEDED);
  }
  CHECK(accepted > 3);  // the seed gives 6 valid ones among 400
  CHECK(rejected > 100);
  // Nothing was ever written into the read-only pool or the source.
  CHECK(CountWritten(ro) == 0);
  // The daemon serves; nothing accepted failed.
  auto stats = live.client->GetStats();
  REQUIRE(stats.ok());
  CHECK(stats->transfers_failed() == 0);
}

TEST_CASE("random region specs: clear errors, nothing registered by a rejection") {
  LiveDaemon live;
  auto buffer = live.client->CreateHostBuffer(1 << 20);
  REQUIRE(buffer.ok());
  std::mt19937 rng(7);
  auto pick = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
  int ok = 0;
  for (int i = 0; i < 300; ++i) {
    v1::RegionSpec spec;
    spec.set_memory_kind(static_cast<v1::MemoryKind>(pick(4)));
    spec.set_size_bytes(pick(4) == 0 ? 0 : (pick(2) ? (1u << 20) : pick(2u << 20)));
    spec.set_writable(pick(2));
    if (pick(5) != 0) {
      auto* l = spec.mutable_paged_kv();
      l->set_num_layers(pick(5));
      l->set_num_parts(pick(4));
      l->set_num_blocks(pick(64));
      l->set_tokens_per_block(pick(32));
      l->set_num_heads(pick(8));
      l->set_head_dim(pick(256));
      l->set_dtype(static_cast<v1::DType>(pick(9)));
      l->set_order(static_cast<v1::LayoutOrder>(pick(7)));
      if (pick(3) == 0) {
        l->set_head_stride(pick(1024));
        l->set_token_stride(pick(8192));
        l->set_block_stride(pick(1 << 16));
        l->set_part_stride(pick(1 << 18));
        l->set_layer_stride(pick(1 << 20));
      }
      if (pick(4) == 0) l->set_offset_bytes(pick(1 << 21));
    } else if (pick(2)) {
      spec.mutable_bytes();
    }
    if (pick(4) == 0) spec.mutable_share()->set_offset(pick(1 << 21));
    auto r = live.client->RegisterHostBuffer(**buffer, spec);
    if (r.ok()) {
      ++ok;
      REQUIRE(live.client->UnregisterRegion(r->region_id()).ok());
      continue;
    }
    INFO(r.status().ToString());
    CHECK(std::string(r.status().message()).rfind("spec", 0) == 0);
    CHECK(r.status().code() != absl::StatusCode::kInternal);
  }
  CHECK(ok > 5);
  auto listed = live.client->ListRegions();
  REQUIRE(listed.ok());
  CHECK(listed->regions_size() == 0);
}

}  // namespace
}  // namespace kvrail::testing

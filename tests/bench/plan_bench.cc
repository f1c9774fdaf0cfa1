// Planner cost: MakePlan for transfers of 1k..262k scattered blocks (validation + the compact
// plan), beside the cost of only copying the block ids, in one run. "deferred": MakePlan with
// PlanOptions::defer_checks_from (the ids only copied), then the checks CheckTiles does as tiles
// start, all tiles at once.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "daemon/planner/planner.h"

int main() {
  using Clock = std::chrono::steady_clock;
  std::printf("%-10s %14s %16s %16s %14s %14s %14s\n", "blocks", "MakePlan us", "deferred: plan us",
              "then checks us", "copy ids us", "serialize us", "parse us");
  for (uint32_t n : {1000u, 10000u, 100000u, 262144u}) {
    kvrail::v1::PagedKvLayout proto;
    proto.set_num_layers(1);
    proto.set_num_parts(1);
    proto.set_num_blocks(2 * n);
    proto.set_tokens_per_block(16);
    proto.set_num_heads(1);
    proto.set_head_dim(8);
    proto.set_dtype(kvrail::v1::DTYPE_BF16);
    proto.set_order(kvrail::v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
    const uint64_t bytes = uint64_t{2} * n * 16 * 8 * 2;
    auto layout = kvrail::planner::ResolveLayout(proto, bytes, "x.");
    if (!layout.ok()) return 1;
    kvrail::planner::RegionView view{bytes, true, true, *layout};
    std::vector<uint32_t> ids(2 * n);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(1));
    kvrail::v1::TransferSpec spec;
    for (uint32_t i = 0; i < n; ++i) spec.mutable_src()->add_block_ids(ids[i]);
    for (uint32_t i = n; i < 2 * n; ++i) spec.mutable_dst()->add_block_ids(ids[i]);
    double best_plan = 1e9, best_copy = 1e9, best_ser = 1e9, best_parse = 1e9;
    double best_deferred = 1e9, best_checks = 1e9;
    for (int rep = 0; rep < 20; ++rep) {
      auto t0 = Clock::now();
      auto plan = kvrail::planner::MakePlan(spec, view, view, {});
      auto t1 = Clock::now();
      if (!plan.ok()) return 1;
      kvrail::v1::TransferSpec copy = spec;
      auto t2 = Clock::now();
      best_plan = std::min(best_plan, std::chrono::duration<double, std::micro>(t1 - t0).count());
      best_copy = std::min(best_copy, std::chrono::duration<double, std::micro>(t2 - t1).count());
      if (copy.src().block_ids_size() != static_cast<int>(n)) return 1;
      kvrail::planner::PlanOptions deferred_options;
      deferred_options.defer_checks_from = 1;
      auto t6 = Clock::now();
      auto deferred = kvrail::planner::MakePlan(spec, view, view, deferred_options);
      auto t7 = Clock::now();
      if (!deferred.ok() || !deferred->checks_deferred()) return 1;
      if (!deferred->CheckTiles(0, deferred->num_tiles()).ok()) return 1;
      auto t8 = Clock::now();
      best_deferred =
          std::min(best_deferred, std::chrono::duration<double, std::micro>(t7 - t6).count());
      best_checks =
          std::min(best_checks, std::chrono::duration<double, std::micro>(t8 - t7).count());
      // The wire cost on both ends of SubmitTransfer: protobuf encode and decode of the spec.
      auto t3 = Clock::now();
      const std::string wire = spec.SerializeAsString();
      auto t4 = Clock::now();
      kvrail::v1::TransferSpec parsed;
      if (!parsed.ParseFromString(wire)) return 1;
      auto t5 = Clock::now();
      best_ser = std::min(best_ser, std::chrono::duration<double, std::micro>(t4 - t3).count());
      best_parse = std::min(best_parse, std::chrono::duration<double, std::micro>(t5 - t4).count());
    }
    std::printf("%-10u %14.1f %16.1f %16.1f %14.1f %14.1f %14.1f\n", n, best_plan, best_deferred,
                best_checks, best_copy, best_ser, best_parse);
  }
  return 0;
}

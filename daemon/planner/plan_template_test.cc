// PlanTemplate: a prepared transfer's shape planned once; each post's plan checks only its ids
// and equals MakePlan's for the same spec and ids.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "daemon/planner/planner.h"
#include "daemon/planner/testing/plan_fixtures.h"

namespace kvrail::planner {
namespace {

using kvrail::v1::TransferSpec;
using testing::Bytes;
using testing::ExpectError;
using testing::kNhd;
using testing::Paged;
using testing::Proto;
using testing::Spec;

TableRef Ref(const std::vector<uint32_t>& ids, const char* field) {
  return TableRef{ids.data(), ids.size(), field};
}

// 2 layers x 2 parts, 4096 blocks of 16 tokens, 4 heads x 64 bf16 (2 KiB a block and part).
RegionView Pool() { return Paged(Proto(2, 2, 4096, 16, 4, 64, kNhd)); }

}  // namespace

TEST_CASE("a post's plan equals MakePlan's for the same spec and ids") {
  const RegionView src = Pool(), dst = Pool();
  absl::StatusOr<PlanTemplate> t = PlanTemplate::Make(Spec({}, {}), src, dst, PlanOptions(), 3, 0);
  REQUIRE(t.ok());
  CHECK(t->src_count() == 3);
  CHECK(t->dst_count() == 3);
  for (const auto& [s, d] :
       {std::pair{std::vector<uint32_t>{7, 8, 9}, std::vector<uint32_t>{1, 2, 3}},
        std::pair{std::vector<uint32_t>{4095, 0, 17}, std::vector<uint32_t>{9, 4095, 0}}}) {
    absl::StatusOr<Plan> posted =
        t->Instantiate(Ref(s, "post.src_block_ids"), Ref(d, "post.dst_block_ids"), PlanOptions());
    REQUIRE(posted.ok());
    absl::StatusOr<Plan> made = MakePlan(Spec(s, d), src, dst, PlanOptions());
    REQUIRE(made.ok());
    CHECK(std::memcmp(&posted->header(), &made->header(), sizeof(kernels::PlanHeader)) == 0);
    CHECK(posted->src_blocks() == made->src_blocks());
    CHECK(posted->dst_blocks() == made->dst_blocks());
    CHECK(posted->num_runs() == made->num_runs());
    CHECK(posted->Describe() == made->Describe());
  }
}

TEST_CASE("each post's ids are checked: num_blocks, a huge id, repeats, counts") {
  const RegionView src = Pool(), dst = Pool();
  absl::StatusOr<PlanTemplate> t = PlanTemplate::Make(Spec({}, {}), src, dst, PlanOptions(), 4, 4);
  REQUIRE(t.ok());
  auto post = [&](std::vector<uint32_t> s, std::vector<uint32_t> d, PlanOptions o = {}) {
    return t->Instantiate(Ref(s, "post.src_block_ids"), Ref(d, "post.dst_block_ids"), o).status();
  };
  CHECK(post({1, 2, 3, 4}, {5, 6, 7, 8}).ok());
  ExpectError(post({1, 2, 3, 4096}, {5, 6, 7, 8}), absl::StatusCode::kInvalidArgument,
              "post.src_block_ids[3]: block 4096 out of range [0, 4096)");
  ExpectError(post({1, 2, 3, 4}, {5, 0xffffffffu, 7, 8}), absl::StatusCode::kInvalidArgument,
              "post.dst_block_ids[1]: block 4294967295 out of range [0, 4096)");
  ExpectError(post({1, 2, 3, 4}, {5, 6, 5, 8}), absl::StatusCode::kInvalidArgument,
              "post.dst_block_ids[2]: block 5 repeats post.dst_block_ids[0]");
  ExpectError(post({1, 2, 3}, {5, 6, 7, 8}), absl::StatusCode::kInvalidArgument,
              "post.src_block_ids: 3 ids, the prepared transfer takes 4");
  ExpectError(post({1, 2, 3, 4}, {5, 6, 7, 8, 9}), absl::StatusCode::kInvalidArgument,
              "post.dst_block_ids: 5 ids, the prepared transfer takes 4");
  // Source ids may repeat (one block read twice), as in a request.
  CHECK(post({1, 1, 1, 1}, {5, 6, 7, 8}).ok());
  // Deferred: the plan is made, the bad id fails its tiles' check with the same message.
  PlanOptions deferred;
  deferred.defer_checks_from = 8;
  std::vector<uint32_t> s{1, 2, 3, 9000}, d{5, 6, 7, 8};
  absl::StatusOr<Plan> late =
      t->Instantiate(Ref(s, "post.src_block_ids"), Ref(d, "post.dst_block_ids"), deferred);
  REQUIRE(late.ok());
  CHECK(late->checks_deferred());
  ExpectError(late->CheckTiles(0, late->num_tiles()), absl::StatusCode::kInvalidArgument,
              "post.src_block_ids[3]: block 9000 out of range [0, 4096)");
}

TEST_CASE("a template is refused naming the field: ids in it, bad counts, bad shape") {
  const RegionView src = Pool(), dst = Pool();
  ExpectError(PlanTemplate::Make(Spec({1}, {}), src, dst, PlanOptions(), 1, 0).status(),
              absl::StatusCode::kInvalidArgument, "spec.src.block_ids: a prepared transfer's");
  ExpectError(PlanTemplate::Make(Spec({}, {}), src, dst, PlanOptions(), 0, 0).status(),
              absl::StatusCode::kInvalidArgument, "src_block_count: must be > 0");
  ExpectError(PlanTemplate::Make(Spec({}, {}), src, dst, PlanOptions(), 4097, 0).status(),
              absl::StatusCode::kInvalidArgument,
              "dst_block_count: 4097 distinct destination blocks per post");
  TransferSpec few = Spec({}, {});
  few.set_num_tokens(20);  // 2 blocks of 16
  ExpectError(PlanTemplate::Make(few, src, dst, PlanOptions(), 3, 0).status(),
              absl::StatusCode::kInvalidArgument, "src_block_count: 3 ids, but the transfer's 20");
  CHECK(PlanTemplate::Make(few, src, dst, PlanOptions(), 2, 2).ok());
  TransferSpec layers = Spec({}, {});
  layers.set_num_layers(3);
  ExpectError(PlanTemplate::Make(layers, src, dst, PlanOptions(), 2, 0).status(),
              absl::StatusCode::kInvalidArgument, "spec.num_layers");
  ExpectError(PlanTemplate::Make(Spec({}, {}), src, Paged(Proto(2, 2, 64, 16, 4, 64, kNhd), false),
                                 PlanOptions(), 2, 0)
                  .status(),
              absl::StatusCode::kFailedPrecondition, "spec.dst.region_id: region is not writable");
}

TEST_CASE("a bytes template takes no ids") {
  TransferSpec spec;
  spec.set_num_bytes(100);
  absl::StatusOr<PlanTemplate> t = PlanTemplate::Make(spec, Bytes(1000), Bytes(1000), {}, 0, 0);
  REQUIRE(t.ok());
  std::vector<uint32_t> none, one{1};
  CHECK(t->Instantiate(Ref(none, "post.src_block_ids"), Ref(none, "post.dst_block_ids"), {}).ok());
  ExpectError(
      t->Instantiate(Ref(one, "post.src_block_ids"), Ref(none, "post.dst_block_ids"), {}).status(),
      absl::StatusCode::kInvalidArgument,
      "post.src_block_ids: 1 ids, the prepared transfer takes 0");
  ExpectError(PlanTemplate::Make(spec, Bytes(1000), Bytes(1000), {}, 1, 0).status(),
              absl::StatusCode::kInvalidArgument, "src_block_count: a transfer between bytes");
}

}  // namespace kvrail::planner

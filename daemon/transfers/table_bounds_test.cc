// The work one submit may ask for is bounded before anything is read: a block table in shared
// memory (TransferEndpoint.block_table) longer than its transfer uses is refused, naming its
// count, without the daemon reading it (the planner used to copy every id - 256M of them for a
// 1-token transfer - and then use one); a grant limited to layers is not passed by a layer count
// that wraps 32 bits.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>

#include "daemon/transfers/manager_fixture.h"
#include "daemon/transfers/resolve.h"

namespace kvrail::transfers {
namespace {

using testing::ManagerFixture;

// A session's paged pools (8 blocks x 4 layers of 16 tokens) and a 64 MiB table region, zeroed
// (every id 0: a valid source block).
struct Tables {
  ManagerFixture f{Options(), nullptr};
  uint64_t me = f.regions.NewSession();
  std::shared_ptr<regions::Region> src = f.regions.PagedLayers(8, 4, false, me);
  std::shared_ptr<regions::Region> dst = f.regions.PagedLayers(8, 4, true, me);
  static constexpr uint64_t kTableBytes = uint64_t{64} << 20;
  std::shared_ptr<regions::Region> table = f.regions.Bytes(kTableBytes, true, me);

  // One token from src block `table[0]` into dst block 0, the source ids from `count` entries of
  // the shared table.
  v1::TransferSpec OneToken(uint64_t count) {
    v1::TransferSpec spec;
    spec.set_session_id(me);
    spec.set_num_tokens(1);
    spec.mutable_src()->set_region_id(src->id());
    auto* ref = spec.mutable_src()->mutable_block_table();
    ref->set_region_id(table->id());
    ref->set_count(count);
    spec.mutable_dst()->set_region_id(dst->id());
    spec.mutable_dst()->add_block_ids(0);
    return spec;
  }
};

void RequireRefusedCount(const absl::StatusOr<v1::SubmitTransferResponse>& r,
                         const std::string& at_most) {
  INFO(r.status().ToString());
  REQUIRE(!r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(r.status().message()).find("spec.src.block_table.count") != std::string::npos);
  CHECK(std::string(r.status().message()).find(at_most) != std::string::npos);
}

TEST_CASE("a shared table longer than its transfer uses is refused before it is read") {
  Tables t;
  // 16M ids (the whole 64 MiB region) for a 1-token transfer: refused, naming what it uses.
  const auto t0 = std::chrono::steady_clock::now();
  RequireRefusedCount(t.f.manager->Submit(t.OneToken(Tables::kTableBytes / 4)), "at most 1 ");
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  WARN("16M-id table for a 1-token transfer refused in " << ms << " ms");
  // Two ids for one token: still more than it uses.
  RequireRefusedCount(t.f.manager->Submit(t.OneToken(2)), "at most 1 ");
  CHECK(t.f.engine.enqueued() == 0);
  // Exactly what it uses: accepted and moved.
  auto ok = t.f.manager->Submit(t.OneToken(1));
  INFO(ok.status().ToString());
  REQUIRE(ok.ok());
  t.f.engine.RunAll();
  CHECK(t.f.Get(ok->transfer_id()).state() == v1::TRANSFER_STATE_SUCCEEDED);
}

TEST_CASE("a count up to 2^32-1 is refused by the bound, not after reading or sizing it") {
  Tables t;
  // Far beyond the region too: the bound names what the transfer uses, before any read.
  RequireRefusedCount(t.f.manager->Submit(t.OneToken(0xFFFFFFFFull)), "at most 1 ");
  // Without num_tokens the source table is the transfer: at most the destination's 8 blocks of
  // 16 tokens (source blocks of 16 tokens: 8 ids).
  v1::TransferSpec whole = t.OneToken(9);
  whole.clear_num_tokens();
  whole.mutable_dst()->clear_block_ids();
  for (uint32_t b = 0; b < 8; ++b) whole.mutable_dst()->add_block_ids(b);
  RequireRefusedCount(t.f.manager->Submit(whole), "at most 8 ");
  CHECK(t.f.engine.enqueued() == 0);
}

TEST_CASE("a layer count wrapping 32 bits does not pass a grant limited to layers") {
  Tables t;
  const uint64_t owner = t.f.regions.NewSession();
  auto theirs = t.f.regions.PagedLayers(8, 4, false, owner);
  v1::CreateGrantRequest request;
  request.set_region_id(theirs->id());
  request.set_access(v1::GRANT_ACCESS_READ);
  request.set_layer_begin(0);
  request.set_layer_end(2);
  sessions::Caller caller;
  caller.session_id = owner;
  auto grant = t.f.regions.grants()->CreateGrant(request, caller);
  REQUIRE(grant.ok());
  v1::TransferSpec spec;
  spec.set_session_id(t.me);
  spec.mutable_src()->set_region_id(theirs->id());
  spec.mutable_src()->set_grant(grant->token());
  spec.mutable_src()->add_block_ids(0);
  spec.mutable_dst()->set_region_id(t.dst->id());
  spec.mutable_dst()->add_block_ids(0);
  // Layers [3, 3 + 2^32 - 2): in 32 bits the end wraps to 1, inside [0, 2).
  spec.mutable_src()->set_layer_begin(3);
  spec.set_num_layers(0xFFFFFFFEu);
  auto refused = t.f.manager->Submit(spec);
  INFO(refused.status().ToString());
  REQUIRE(!refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(refused.status().message()).find("spec.src.grant") != std::string::npos);
  CHECK(t.f.engine.enqueued() == 0);
}

}  // namespace
}  // namespace kvrail::transfers

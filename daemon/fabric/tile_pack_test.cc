// Pack on the sender's plan side + unpack on the receiver's equals the naive reference copy, for
// random layouts (layout conversion included) and bytes transfers.
#include "daemon/fabric/tile_pack.h"

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "daemon/planner/testing/random_case.h"

namespace kvrail::fabric {
namespace {

using planner::testing::RandomCase;

void CheckCase(const RandomCase& c, std::mt19937_64& rng) {
  INFO(c.ToString());
  auto plan = planner::MakePlan(c.spec, c.src, c.dst, c.options);
  REQUIRE(plan.ok());
  std::vector<uint8_t> src(c.src.size_bytes), want(c.dst.size_bytes, 0xAB),
      got(c.dst.size_bytes, 0xAB);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  planner::testing::ReferenceCopy(c, src.data(), want.data());
  std::vector<uint8_t> staging;
  uint64_t total = 0;
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    const uint64_t n = TileBytes(*plan, t);
    REQUIRE(n == plan->tile(t).bytes);
    staging.assign(n, 0);
    PackTileHost(*plan, t, src.data(), staging.data());
    // spec.digest: hashing while packing packs the same bytes and gives the digest of the
    // source tile read in place (planner::TileDigestHost) and of the packed bytes.
    std::vector<uint8_t> hashed(n, 0);
    const uint64_t digest = PackTileHostWithDigest(*plan, t, src.data(), hashed.data());
    REQUIRE(hashed == staging);
    REQUIRE(digest == planner::TileDigestHost(*plan, t, src.data(), planner::DigestSide::kSource));
    REQUIRE(digest == planner::PackedTileDigest(*plan, t, staging.data()));
    UnpackTileHost(*plan, t, staging.data(), got.data());
    // The receiver's read-back after the scatter.
    REQUIRE(planner::TileDigestHost(*plan, t, got.data(), planner::DigestSide::kDestination) ==
            digest);
    total += n;
  }
  CHECK(total == plan->bytes_total());
  CHECK(got == want);
}

TEST_CASE("pack + unpack equals the reference copy on random paged cases") {
  std::mt19937_64 rng(5);
  for (int i = 0; i < 300; ++i) CheckCase(planner::testing::RandomPagedCase(rng), rng);
}

TEST_CASE("pack + unpack equals the reference copy on random bytes cases") {
  std::mt19937_64 rng(6);
  for (int i = 0; i < 100; ++i) CheckCase(planner::testing::RandomBytesCase(rng), rng);
}

}  // namespace
}  // namespace kvrail::fabric

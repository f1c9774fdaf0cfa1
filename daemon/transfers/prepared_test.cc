// Prepared transfers through the transfer manager: posts move exactly their blocks; what may have
// changed since Prepare (ids, regions, grants, the session) is checked on every post; prepared
// ids are their session's alone, capped, and freed with the session and with their regions.
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/transfers/manager_fixture.h"

namespace kvrail::transfers {
namespace {

using testing::ManagerFixture;

// TestRegions' paged layout: 1 layer, 2 parts, 16 tokens x 16 bytes a block (256 bytes).
constexpr uint32_t kBlocks = 64;
constexpr uint64_t kBlockBytes = 256;

uint8_t* Block(const regions::Region& r, uint32_t part, uint32_t block) {
  return r.data() + (uint64_t{part} * kBlocks + block) * kBlockBytes;
}

struct Pools {
  ManagerFixture f;
  std::shared_ptr<regions::Region> src, dst;
  explicit Pools(Options options = Options(), uint64_t owner = 0)
      : f(options),
        src(f.regions.PagedLayers(kBlocks, 1, true, owner)),
        dst(f.regions.PagedLayers(kBlocks, 1, true, owner)) {
    // The daemon's own wiring: a session's end reaches the manager.
    f.regions.sessions()->AddSessionEndHook(
        [m = f.manager.get()](uint64_t s) { m->EndSession(s); });
    for (uint32_t p = 0; p < 2; ++p) {
      for (uint32_t b = 0; b < kBlocks; ++b) std::memset(Block(*src, p, b), 1 + b + 64 * p, 256);
    }
    std::memset(dst->data(), 0, 2 * kBlocks * kBlockBytes);
  }
  v1::PrepareTransferRequest Shape(uint32_t src_count, uint32_t dst_count = 0) const {
    v1::PrepareTransferRequest request;
    request.mutable_spec()->mutable_src()->set_region_id(src->id());
    request.mutable_spec()->mutable_dst()->set_region_id(dst->id());
    request.set_src_block_count(src_count);
    request.set_dst_block_count(dst_count);
    return request;
  }
  uint64_t Prepare(uint32_t src_count, const sessions::Caller& as) {
    auto prepared = f.manager->Prepare(as, Shape(src_count));
    INFO(prepared.status().ToString());
    REQUIRE(prepared.ok());
    return prepared->prepared_id();
  }
};

v1::PostTransferRequest Post(uint64_t id, std::vector<uint32_t> s, std::vector<uint32_t> d) {
  v1::PostTransferRequest post;
  post.set_prepared_id(id);
  for (uint32_t b : s) post.add_src_block_ids(b);
  for (uint32_t b : d) post.add_dst_block_ids(b);
  return post;
}

void ExpectRefused(const absl::Status& s, absl::StatusCode code, const std::string& text) {
  INFO(s.ToString() << " (expected: " << text << ")");
  CHECK(s.code() == code);
  CHECK(std::string(s.message()).find(text) != std::string::npos);
}

TEST_CASE("posts with new ids move exactly their blocks, each one") {
  Pools p;
  const uint64_t id = p.Prepare(2, p.f.caller);
  std::vector<uint32_t> expect(kBlocks, 0);  // dst block -> src block (+1), 0: untouched
  const std::vector<std::pair<std::vector<uint32_t>, std::vector<uint32_t>>> posts = {
      {{3, 7}, {10, 1}}, {{63, 0}, {0, 63}}, {{5, 5}, {20, 21}}, {{9, 8}, {30, 31}}};
  for (const auto& [s, d] : posts) {
    auto posted = p.f.manager->Post(p.f.caller, Post(id, s, d));
    INFO(posted.status().ToString());
    REQUIRE(posted.ok());
    CHECK(posted->bytes_total() == 2 * 2 * kBlockBytes);
    p.f.engine.RunAll();
    CHECK(p.f.Get(posted->transfer_id()).state() == v1::TRANSFER_STATE_SUCCEEDED);
    for (size_t i = 0; i < s.size(); ++i) expect[d[i]] = s[i] + 1;
  }
  for (uint32_t part = 0; part < 2; ++part) {
    for (uint32_t b = 0; b < kBlocks; ++b) {
      INFO("part " << part << " block " << b);
      const uint8_t want = expect[b] == 0 ? 0 : static_cast<uint8_t>(expect[b] + 64 * part);
      const uint8_t* got = Block(*p.dst, part, b);
      CHECK(got[0] == want);
      CHECK(std::memcmp(got, got + 1, kBlockBytes - 1) == 0);  // the whole block alike
    }
  }
}

TEST_CASE("each post's ids are checked naming the field; a refused post moves nothing") {
  Pools p;
  const uint64_t id = p.Prepare(2, p.f.caller);
  auto refused = [&](std::vector<uint32_t> s, std::vector<uint32_t> d) {
    return p.f.manager->Post(p.f.caller, Post(id, s, d)).status();
  };
  ExpectRefused(refused({1, kBlocks}, {2, 3}), absl::StatusCode::kInvalidArgument,
                "post.src_block_ids[1]: block 64 out of range [0, 64)");
  ExpectRefused(refused({1, 2}, {0xfffffff0u, 3}), absl::StatusCode::kInvalidArgument,
                "post.dst_block_ids[0]: block 4294967280 out of range [0, 64)");
  ExpectRefused(refused({1, 2, 3}, {2, 3}), absl::StatusCode::kInvalidArgument,
                "post.src_block_ids: 3 ids, the prepared transfer takes 2");
  ExpectRefused(refused({1, 2}, {2}), absl::StatusCode::kInvalidArgument,
                "post.dst_block_ids: 1 ids, the prepared transfer takes 2");
  ExpectRefused(refused({1, 2}, {4, 4}), absl::StatusCode::kInvalidArgument,
                "post.dst_block_ids[1]: block 4 repeats post.dst_block_ids[0]");
  CHECK(p.f.engine.enqueued() == 0);
  for (uint64_t i = 0; i < 2 * kBlocks * kBlockBytes; ++i) REQUIRE(p.dst->data()[i] == 0);
}

TEST_CASE("a post's ids as little-endian bytes move the same blocks; bad encodings are named") {
  Pools p;
  const uint64_t id = p.Prepare(2, p.f.caller);
  auto le32 = [](std::vector<uint32_t> ids) {
    return std::string(reinterpret_cast<const char*>(ids.data()), 4 * ids.size());
  };
  v1::PostTransferRequest post;
  post.set_prepared_id(id);
  post.set_src_block_ids_le32(le32({4, 9}));
  post.add_dst_block_ids(30);  // the sides' encodings are independent
  post.add_dst_block_ids(2);
  auto posted = p.f.manager->Post(p.f.caller, post);
  INFO(posted.status().ToString());
  REQUIRE(posted.ok());
  p.f.engine.RunAll();
  CHECK(Block(*p.dst, 1, 30)[0] == 4 + 1 + 64);
  CHECK(Block(*p.dst, 0, 2)[0] == 9 + 1);
  v1::PostTransferRequest bad = post;
  bad.set_src_block_ids_le32(le32({4, 64}));
  ExpectRefused(p.f.manager->Post(p.f.caller, bad).status(), absl::StatusCode::kInvalidArgument,
                "post.src_block_ids_le32[1]: block 64 out of range [0, 64)");
  bad.set_src_block_ids_le32("12345");
  ExpectRefused(p.f.manager->Post(p.f.caller, bad).status(), absl::StatusCode::kInvalidArgument,
                "post.src_block_ids_le32: 5 bytes is not a whole number of uint32 ids");
  bad = post;
  bad.set_dst_block_ids_le32(le32({7, 8}));
  ExpectRefused(p.f.manager->Post(p.f.caller, bad).status(), absl::StatusCode::kInvalidArgument,
                "post.dst_block_ids_le32: set dst_block_ids or dst_block_ids_le32, not both");
}

TEST_CASE("another session's prepared id looks exactly like an unknown one") {
  Pools p;
  const uint64_t id = p.Prepare(1, p.f.caller);
  const sessions::Caller other = p.f.As(p.f.regions.NewSession());
  const absl::Status theirs = p.f.manager->Post(other, Post(id, {1}, {2})).status();
  const absl::Status unknown = p.f.manager->Post(p.f.caller, Post(id + 1000, {1}, {2})).status();
  ExpectRefused(theirs, absl::StatusCode::kNotFound, "prepared_id: no prepared transfer");
  CHECK(theirs.message() == absl::StrCat("prepared_id: no prepared transfer ", id));
  CHECK(unknown.code() == absl::StatusCode::kNotFound);
  ExpectRefused(p.f.manager->ReleasePrepared(other, id), absl::StatusCode::kNotFound,
                "prepared_id");
  // Anonymous callers hold none (and cannot post one).
  ExpectRefused(p.f.manager->Prepare(sessions::Caller(), p.Shape(1)).status(),
                absl::StatusCode::kPermissionDenied, "session_id:");
  ExpectRefused(p.f.manager->Post(sessions::Caller(), Post(id, {1}, {2})).status(),
                absl::StatusCode::kNotFound, "prepared_id");
  // Still the owner's.
  CHECK(p.f.manager->Post(p.f.caller, Post(id, {1}, {2})).ok());
  p.f.engine.RunAll();
  CHECK(p.f.manager->ReleasePrepared(p.f.caller, id).ok());
  ExpectRefused(p.f.manager->Post(p.f.caller, Post(id, {1}, {2})).status(),
                absl::StatusCode::kNotFound, "prepared_id");
}

TEST_CASE("a post after its region was unregistered is refused; the prepared id is gone") {
  Pools p;
  const uint64_t id = p.Prepare(1, p.f.caller);
  std::weak_ptr<regions::Region> held = p.dst;
  REQUIRE(p.f.regions.table()->Unregister(p.dst->id()).ok());
  p.dst.reset();
  ExpectRefused(p.f.manager->Post(p.f.caller, Post(id, {1}, {2})).status(),
                absl::StatusCode::kNotFound, "prepared_id: no prepared transfer");
  CHECK(held.expired());  // the prepared transfer held its mapping no longer
  CHECK(p.f.engine.enqueued() == 0);
}

TEST_CASE("a post on a revoked or expired grant is refused naming the grant") {
  Pools p;  // the fixture's session owns both pools
  const uint64_t user = p.f.regions.NewSession();
  const std::string read = p.f.Grant(*p.src, v1::GRANT_ACCESS_READ);
  const std::string write = p.f.Grant(*p.dst, v1::GRANT_ACCESS_WRITE);
  v1::PrepareTransferRequest shape = p.Shape(1);
  shape.mutable_spec()->mutable_src()->set_grant(read);
  shape.mutable_spec()->mutable_dst()->set_grant(write);
  auto prepared = p.f.manager->Prepare(p.f.As(user), shape);
  REQUIRE(prepared.ok());
  const uint64_t id = prepared->prepared_id();
  REQUIRE(p.f.manager->Post(p.f.As(user), Post(id, {1}, {2})).ok());
  p.f.engine.RunAll();
  REQUIRE(p.f.regions.grants()->RevokeGrant(write, p.f.caller).ok());
  ExpectRefused(p.f.manager->Post(p.f.As(user), Post(id, {1}, {3})).status(),
                absl::StatusCode::kPermissionDenied, "spec.dst.grant");
  CHECK(p.f.engine.queued() == 0);
  CHECK(Block(*p.dst, 0, 3)[0] == 0);

  // Expiry, by the injected clock.
  v1::CreateGrantRequest brief;
  brief.set_region_id(p.dst->id());
  brief.set_access(v1::GRANT_ACCESS_WRITE);
  brief.set_ttl_ms(1000);
  auto short_lived = p.f.regions.grants()->CreateGrant(brief, p.f.caller);
  REQUIRE(short_lived.ok());
  shape.mutable_spec()->mutable_dst()->set_grant(short_lived->token());
  auto again = p.f.manager->Prepare(p.f.As(user), shape);
  REQUIRE(again.ok());
  REQUIRE(p.f.manager->Post(p.f.As(user), Post(again->prepared_id(), {1}, {4})).ok());
  p.f.engine.RunAll();
  p.f.clock.Advance(absl::Seconds(2));
  ExpectRefused(p.f.manager->Post(p.f.As(user), Post(again->prepared_id(), {1}, {5})).status(),
                absl::StatusCode::kPermissionDenied, "spec.dst.grant");
}

TEST_CASE("prepared ids die with their session, and with the session owning their regions") {
  Pools p;
  const uint64_t owner = p.f.regions.NewSession();
  const uint64_t user = p.f.regions.NewSession();
  auto src = p.f.regions.PagedLayers(kBlocks, 1, true, owner);
  auto dst = p.f.regions.PagedLayers(kBlocks, 1, true, owner);
  v1::PrepareTransferRequest shape;
  shape.mutable_spec()->mutable_src()->set_region_id(src->id());
  shape.mutable_spec()->mutable_dst()->set_region_id(dst->id());
  shape.set_src_block_count(1);
  auto own = p.f.manager->Prepare(p.f.As(owner), shape);
  REQUIRE(own.ok());
  // The user prepares on the owner's regions by grants.
  for (const auto& [ep, region, access] :
       {std::tuple{shape.mutable_spec()->mutable_src(), src.get(), v1::GRANT_ACCESS_READ},
        std::tuple{shape.mutable_spec()->mutable_dst(), dst.get(), v1::GRANT_ACCESS_WRITE}}) {
    v1::CreateGrantRequest g;
    g.set_region_id(region->id());
    g.set_access(access);
    auto grant = p.f.regions.grants()->CreateGrant(g, p.f.As(owner));
    REQUIRE(grant.ok());
    ep->set_grant(grant->token());
  }
  auto theirs = p.f.manager->Prepare(p.f.As(user), shape);
  REQUIRE(theirs.ok());
  std::weak_ptr<regions::Region> src_held = src, dst_held = dst;
  src.reset();
  dst.reset();
  const sessions::Caller owner_caller = p.f.As(owner);
  p.f.regions.sessions()->EndSession(owner);
  // Nothing holds the owner's regions any more: both prepared transfers were freed.
  CHECK(src_held.expired());
  CHECK(dst_held.expired());
  ExpectRefused(p.f.manager->Post(p.f.As(user), Post(theirs->prepared_id(), {1}, {2})).status(),
                absl::StatusCode::kNotFound, "prepared_id");
  ExpectRefused(p.f.manager->Post(owner_caller, Post(own->prepared_id(), {1}, {2})).status(),
                absl::StatusCode::kNotFound, "prepared_id");
}

TEST_CASE("a session holds at most max_prepared_per_session; releasing one makes room") {
  Options options;
  options.max_prepared_per_session = 2;
  Pools p(options);
  const uint64_t a = p.Prepare(1, p.f.caller);
  p.Prepare(2, p.f.caller);
  ExpectRefused(p.f.manager->Prepare(p.f.caller, p.Shape(3)).status(),
                absl::StatusCode::kResourceExhausted, "max_prepared_per_session: session ");
  // Another session has its own count.
  const uint64_t other = p.f.regions.NewSession();
  auto mine = p.f.regions.PagedLayers(kBlocks, 1, true, other);
  v1::PrepareTransferRequest shape;
  shape.mutable_spec()->mutable_src()->set_region_id(mine->id());
  shape.mutable_spec()->mutable_dst()->set_region_id(mine->id());
  shape.set_src_block_count(1);
  CHECK(p.f.manager->Prepare(p.f.As(other), shape).ok());
  REQUIRE(p.f.manager->ReleasePrepared(p.f.caller, a).ok());
  CHECK(p.f.manager->Prepare(p.f.caller, p.Shape(3)).ok());
}

TEST_CASE("a shape is validated once, naming the field") {
  Pools p;
  v1::PrepareTransferRequest with_ids = p.Shape(1);
  with_ids.mutable_spec()->mutable_dst()->add_block_ids(3);
  ExpectRefused(p.f.manager->Prepare(p.f.caller, with_ids).status(),
                absl::StatusCode::kInvalidArgument, "spec.dst.block_ids: a prepared transfer's");
  v1::PrepareTransferRequest keyed = p.Shape(1);
  keyed.mutable_spec()->set_idempotency_key("k");
  ExpectRefused(p.f.manager->Prepare(p.f.caller, keyed).status(),
                absl::StatusCode::kInvalidArgument, "spec.idempotency_key");
  v1::PrepareTransferRequest layers = p.Shape(1);
  layers.mutable_spec()->set_num_layers(2);
  ExpectRefused(p.f.manager->Prepare(p.f.caller, layers).status(),
                absl::StatusCode::kInvalidArgument, "spec.num_layers");
  v1::PrepareTransferRequest theirs = p.Shape(1);
  theirs.mutable_spec()->mutable_src()->set_region_id(
      p.f.regions.PagedLayers(kBlocks, 1, true, p.f.regions.NewSession())->id());
  ExpectRefused(p.f.manager->Prepare(p.f.caller, theirs).status(),
                absl::StatusCode::kPermissionDenied, "spec.src");
}

}  // namespace
}  // namespace kvrail::transfers

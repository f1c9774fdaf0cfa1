// A grant's end ends the transfers moving bytes on it (docs/security.md, "Grants"): the holder
// submits a layer-wise transfer while its grant is live, the first layer moves, then the grant
// ends - revoked, expired, its region unregistered, its owner's session ended - and the holder
// marks the remaining layers ready. The transfer must have FAILED with PERMISSION_DENIED naming
// the grant's field, and no further tile may reach the engine or touch memory. A grant that did
// not end (another one revoked) changes nothing; the owner may cancel the holder's transfer, a
// third session may not.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/transfers/manager_fixture.h"

namespace kvrail::transfers {
namespace {

using testing::ManagerFixture;

constexpr uint32_t kLayers = 4;

// The owner's pool and the holder's (8 blocks x 4 layers each), access checks on.
struct Holder {
  ManagerFixture f{Options(), nullptr};
  uint64_t owner = f.regions.NewSession();
  uint64_t holder = f.regions.NewSession();
  uint64_t third = f.regions.NewSession();
  std::shared_ptr<regions::Region> owner_pool = f.regions.PagedLayers(8, kLayers, true, owner);
  std::shared_ptr<regions::Region> holder_pool = f.regions.PagedLayers(8, kLayers, true, holder);
  const uint64_t pool_bytes = owner_pool->spec().size_bytes();

  Holder() {
    std::memset(owner_pool->data(), 0x0A, pool_bytes);
    std::memset(holder_pool->data(), 0x0B, pool_bytes);
  }
  sessions::Caller As(uint64_t session) const {
    sessions::Caller c;
    c.session_id = session;
    return c;
  }
  std::string Grant(v1::GrantAccess access, uint64_t ttl_ms = 0) {
    v1::CreateGrantRequest request;
    request.set_region_id(owner_pool->id());
    request.set_access(access);
    request.set_ttl_ms(ttl_ms);
    auto grant = f.regions.grants()->CreateGrant(request, As(owner));
    REQUIRE(grant.ok());
    return grant->token();
  }
  // The holder reads the owner's pool (`read`) or writes it, on `grant`, layer-wise; layer 0 is
  // made ready and moved. Returns the transfer id.
  uint64_t Start(bool read, const std::string& grant) {
    v1::TransferSpec spec;
    spec.set_session_id(holder);
    spec.set_layerwise(true);
    spec.mutable_src()->set_region_id(read ? owner_pool->id() : holder_pool->id());
    spec.mutable_dst()->set_region_id(read ? holder_pool->id() : owner_pool->id());
    (read ? spec.mutable_src() : spec.mutable_dst())->set_grant(grant);
    for (uint32_t b = 0; b < 8; ++b) {
      spec.mutable_src()->add_block_ids(b);
      spec.mutable_dst()->add_block_ids(b);
    }
    auto submitted = f.manager->Submit(spec);
    INFO(submitted.status().ToString());
    REQUIRE(submitted.ok());
    const uint64_t id = submitted->transfer_id();
    REQUIRE(f.manager->MarkReady(As(holder), id, 0, 1).ok());
    f.engine.RunAll();
    REQUIRE(f.engine.enqueued() > 0);
    REQUIRE(f.Get(id).state() == v1::TRANSFER_STATE_RUNNING);
    return id;
  }
  // Bytes of `region` that differ from `fill`.
  static uint64_t Changed(const regions::Region& region, uint8_t fill) {
    uint64_t n = 0;
    for (uint64_t i = 0; i < region.spec().size_bytes(); ++i) n += region.data()[i] != fill;
    return n;
  }
  // After the grant ended: the transfer FAILED naming `field`; the holder marks the remaining
  // layers ready and nothing more reaches the engine or memory.
  void RequireStopped(uint64_t id, const std::string& field) {
    const v1::TransferStatus ended = f.Get(id);
    INFO(ended.DebugString());
    REQUIRE(ended.state() == v1::TRANSFER_STATE_FAILED);
    CHECK(ended.error_code() == static_cast<int>(absl::StatusCode::kPermissionDenied));
    CHECK(ended.error_message().find(field) != std::string::npos);
    const size_t enqueued = f.engine.enqueued();
    const uint64_t owner_changed = Changed(*owner_pool, 0x0A);
    const uint64_t holder_changed = Changed(*holder_pool, 0x0B);
    (void)f.manager->MarkReady(As(holder), id, 1, kLayers - 1);
    f.engine.RunAll();
    CHECK(f.engine.enqueued() == enqueued);
    CHECK(Changed(*owner_pool, 0x0A) == owner_changed);
    CHECK(Changed(*holder_pool, 0x0B) == holder_changed);
  }
};

TEST_CASE("a revoked read grant ends the holder's layer-wise transfer before its next layer") {
  Holder h;
  const std::string grant = h.Grant(v1::GRANT_ACCESS_READ);
  const uint64_t id = h.Start(true, grant);
  REQUIRE(h.f.regions.grants()->RevokeGrant(grant, h.As(h.owner)).ok());
  h.RequireStopped(id, "spec.src.grant");
}

TEST_CASE("a revoked write grant ends the holder's transfer into the owner's region") {
  Holder h;
  const std::string grant = h.Grant(v1::GRANT_ACCESS_WRITE);
  const uint64_t id = h.Start(false, grant);
  const uint64_t written = Holder::Changed(*h.owner_pool, 0x0A);
  CHECK(written > 0);  // layer 0 landed while the grant was live
  REQUIRE(h.f.regions.grants()->RevokeGrant(grant, h.As(h.owner)).ok());
  h.RequireStopped(id, "spec.dst.grant");
}

TEST_CASE("an expired grant ends the transfer by its expiry, not at the next submit") {
  Holder h;
  const std::string grant = h.Grant(v1::GRANT_ACCESS_READ, /*ttl_ms=*/1000);
  const uint64_t id = h.Start(true, grant);
  h.f.clock.Advance(absl::Milliseconds(999));
  h.f.manager->CheckDeadlines();
  CHECK(h.f.Get(id).state() == v1::TRANSFER_STATE_RUNNING);
  h.f.clock.Advance(absl::Milliseconds(2));
  h.f.manager->CheckDeadlines();  // the deadline loop's work, run here by the manual clock
  h.RequireStopped(id, "expired");
}

TEST_CASE("unregistering the granted region ends the holder's transfer") {
  Holder h;
  const uint64_t id = h.Start(true, h.Grant(v1::GRANT_ACCESS_READ));
  REQUIRE(h.f.regions.table()->Unregister(h.owner_pool->id(), h.As(h.owner)).ok());
  h.RequireStopped(id, "spec.src.grant");
}

TEST_CASE("the owner's session ending ends the holder's transfer") {
  Holder h;
  const uint64_t id = h.Start(false, h.Grant(v1::GRANT_ACCESS_WRITE));
  h.f.regions.sessions()->EndSession(h.owner);
  h.RequireStopped(id, "spec.dst.grant");
}

TEST_CASE("revoking another grant leaves the transfer running; it completes") {
  Holder h;
  const std::string used = h.Grant(v1::GRANT_ACCESS_READ);
  const std::string other = h.Grant(v1::GRANT_ACCESS_READ);
  const uint64_t id = h.Start(true, used);
  REQUIRE(h.f.regions.grants()->RevokeGrant(other, h.As(h.owner)).ok());
  CHECK(h.f.Get(id).state() == v1::TRANSFER_STATE_RUNNING);
  REQUIRE(h.f.manager->MarkReady(h.As(h.holder), id, 1, kLayers - 1).ok());
  h.f.engine.RunAll();
  CHECK(h.f.Get(id).state() == v1::TRANSFER_STATE_SUCCEEDED);
}

TEST_CASE("the owner may cancel a transfer using its region by a grant; a third session may not") {
  Holder h;
  const uint64_t id = h.Start(false, h.Grant(v1::GRANT_ACCESS_WRITE));
  const absl::Status third = h.f.manager->Cancel(h.As(h.third), id).status();
  // The third session has no part in it: told what an unknown id is told.
  CHECK(third.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(third.message()) == absl::StrCat("transfer_id: no transfer ", id));
  CHECK(h.f.Get(id).state() == v1::TRANSFER_STATE_RUNNING);
  // The owner may cancel, not mark layers ready (that stays the holder's).
  CHECK(h.f.manager->MarkReady(h.As(h.owner), id, 1, 1).code() ==
        absl::StatusCode::kPermissionDenied);
  auto cancelled = h.f.manager->Cancel(h.As(h.owner), id);
  REQUIRE(cancelled.ok());
  CHECK(cancelled->state() == v1::TRANSFER_STATE_CANCELLED);
  CHECK(h.f.manager->Cancel(h.As(h.holder), id).ok());  // ended: a no-op for its submitter
}

}  // namespace
}  // namespace kvrail::transfers

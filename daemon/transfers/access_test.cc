// Access control through the transfer manager (docs/security.md): a submitter reads and writes
// only regions its session owns, or holds a grant of the owner for; every check is tried from
// the other side - another session's source, destination, block table and flag words, grants of
// the wrong access, region or layers, expired and revoked - and a refused transfer moves nothing.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/handover/state.pb.h"
#include "daemon/transfers/manager_fixture.h"

namespace kvrail::transfers {
namespace {

using testing::kTile;
using testing::ManagerFixture;

// The victim's session owns `secret` (source) and `vault` (writable); the attacker's owns its
// own pair. Access checks on.
struct Tenants {
  ManagerFixture f{Options(), nullptr};
  uint64_t victim = f.regions.NewSession();
  uint64_t attacker = f.regions.NewSession();
  // Writable so the test can fill it through the daemon's mapping; read as a source.
  std::shared_ptr<regions::Region> secret = f.regions.Bytes(8 * kTile, true, victim);
  std::shared_ptr<regions::Region> vault = f.regions.Bytes(8 * kTile, true, victim);
  std::shared_ptr<regions::Region> mine = f.regions.Bytes(8 * kTile, true, attacker);
  std::shared_ptr<regions::Region> mine_src = f.regions.Bytes(8 * kTile, false, attacker);

  Tenants() {
    std::memset(secret->data(), 0x5E, 8 * kTile);
    std::memset(vault->data(), 0x77, 8 * kTile);
    std::memset(mine->data(), 0, 8 * kTile);
  }
  v1::TransferSpec Spec(const regions::Region& src, const regions::Region& dst,
                        uint64_t submitter) {
    v1::TransferSpec spec;
    spec.mutable_src()->set_region_id(src.id());
    spec.mutable_dst()->set_region_id(dst.id());
    spec.set_num_bytes(2 * kTile);
    spec.set_session_id(submitter);
    return spec;
  }
  std::string Grant(const regions::Region& region, v1::GrantAccess access, uint64_t ttl_ms = 0,
                    uint32_t layer_begin = 0, uint32_t layer_end = 0) {
    v1::CreateGrantRequest request;
    request.set_region_id(region.id());
    request.set_access(access);
    request.set_ttl_ms(ttl_ms);
    request.set_layer_begin(layer_begin);
    request.set_layer_end(layer_end);
    sessions::Caller owner;
    owner.session_id = region.session_id();
    auto grant = f.regions.grants()->CreateGrant(request, owner);
    REQUIRE(grant.ok());
    CHECK(grant->token().rfind("kvg1.", 0) == 0);
    CHECK(grant->token().size() == 5 + 32);
    return grant->token();
  }
  bool MineUntouched() const {
    for (uint64_t i = 0; i < 8 * kTile; ++i) {
      if (mine->data()[i] != 0) return false;
    }
    return true;
  }
};

void RequireDenied(const absl::StatusOr<v1::SubmitTransferResponse>& r, const std::string& field) {
  INFO(r.status().ToString());
  REQUIRE(!r.ok());
  CHECK(r.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(r.status().message()).find(field) != std::string::npos);
}

TEST_CASE("another session's region can be neither read nor written without a grant") {
  Tenants t;
  RequireDenied(t.f.manager->Submit(t.Spec(*t.secret, *t.mine, t.attacker)), "spec.src.region_id");
  RequireDenied(t.f.manager->Submit(t.Spec(*t.mine_src, *t.vault, t.attacker)),
                "spec.dst.region_id");
  // Anonymous (no session) owns nothing, not even regions registered without one.
  RequireDenied(t.f.manager->Submit(t.Spec(*t.secret, *t.vault, 0)), "spec.src.region_id");
  // Claiming the victim's session id is the server's business (it sets spec.session_id from the
  // credentials); here the owner's own transfer passes.
  CHECK(t.f.manager->Submit(t.Spec(*t.secret, *t.vault, t.victim)).ok());
  t.f.engine.RunAll();
  CHECK(t.MineUntouched());
  CHECK(t.f.engine.enqueued() == 2);  // only the owner's two tiles ever reached the engine
}

TEST_CASE("a read grant lets the holder read, not write; a write grant the other way") {
  Tenants t;
  v1::TransferSpec read = t.Spec(*t.secret, *t.mine, t.attacker);
  read.mutable_src()->set_grant(t.Grant(*t.secret, v1::GRANT_ACCESS_READ));
  auto ok = t.f.manager->Submit(read);
  INFO(ok.status().ToString());
  REQUIRE(ok.ok());
  t.f.engine.RunAll();
  CHECK(t.mine->data()[0] == 0x5E);

  // The same read grant does not open the victim's writable region for writing...
  v1::TransferSpec write = t.Spec(*t.mine_src, *t.vault, t.attacker);
  write.mutable_dst()->set_grant(read.src().grant());
  RequireDenied(t.f.manager->Submit(write), "spec.dst.grant");
  // ...a read grant of the vault is still not a write grant...
  write.mutable_dst()->set_grant(t.Grant(*t.vault, v1::GRANT_ACCESS_READ));
  RequireDenied(t.f.manager->Submit(write), "spec.dst.grant: the grant lets the holder read");
  // ...and a write grant of the vault works.
  write.mutable_dst()->set_grant(t.Grant(*t.vault, v1::GRANT_ACCESS_WRITE));
  CHECK(t.f.manager->Submit(write).ok());
  t.f.engine.RunAll();
}

TEST_CASE("grants of another region, expired, revoked or unknown are refused") {
  Tenants t;
  v1::TransferSpec spec = t.Spec(*t.secret, *t.mine, t.attacker);
  spec.mutable_src()->set_grant(t.Grant(*t.vault, v1::GRANT_ACCESS_READ));  // the other region
  RequireDenied(t.f.manager->Submit(spec), "spec.src.grant: the grant is for region");
  spec.mutable_src()->set_grant("kvg1.00000000000000000000000000000000");
  RequireDenied(t.f.manager->Submit(spec), "spec.src.grant: unknown, revoked or expired");

  spec.mutable_src()->set_grant(t.Grant(*t.secret, v1::GRANT_ACCESS_READ, /*ttl_ms=*/1000));
  t.f.clock.Advance(absl::Milliseconds(999));
  CHECK(t.f.manager->Submit(spec).ok());
  t.f.clock.Advance(absl::Milliseconds(1));
  RequireDenied(t.f.manager->Submit(spec), "unknown, revoked or expired");

  spec.mutable_src()->set_grant(t.Grant(*t.secret, v1::GRANT_ACCESS_READ));
  sessions::Caller attacker;
  attacker.session_id = t.attacker;
  CHECK(t.f.regions.grants()->RevokeGrant(spec.src().grant(), attacker).code() ==
        absl::StatusCode::kPermissionDenied);  // only the owner revokes
  sessions::Caller victim;
  victim.session_id = t.victim;
  REQUIRE(t.f.regions.grants()->RevokeGrant(spec.src().grant(), victim).ok());
  RequireDenied(t.f.manager->Submit(spec), "unknown, revoked or expired");
  t.f.engine.RunAll();
}

TEST_CASE("only the owner creates grants; a session's grants end with it") {
  Tenants t;
  v1::CreateGrantRequest request;
  request.set_region_id(t.secret->id());
  request.set_access(v1::GRANT_ACCESS_READ);
  sessions::Caller attacker;
  attacker.session_id = t.attacker;
  CHECK(t.f.regions.grants()->CreateGrant(request, attacker).status().code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(t.f.regions.grants()->CreateGrant(request, sessions::Caller{}).status().code() ==
        absl::StatusCode::kPermissionDenied);
  sessions::Caller op;  // the operator lists everything but grants nothing it does not own
  op.uid = static_cast<int64_t>(::geteuid());  // kvraild's own uid
  REQUIRE(op.operator_role());
  CHECK(t.f.regions.grants()->CreateGrant(request, op).status().code() ==
        absl::StatusCode::kPermissionDenied);
  // A read-only region is never granted for writing, even by its owner.
  v1::CreateGrantRequest write_ro;
  write_ro.set_region_id(t.mine_src->id());
  write_ro.set_access(v1::GRANT_ACCESS_WRITE);
  CHECK(t.f.regions.grants()->CreateGrant(write_ro, attacker).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  sessions::Caller victim;
  victim.session_id = t.victim;
  request.set_access(v1::GRANT_ACCESS_UNSPECIFIED);
  CHECK(t.f.regions.grants()->CreateGrant(request, victim).status().code() ==
        absl::StatusCode::kInvalidArgument);

  v1::TransferSpec spec = t.Spec(*t.secret, *t.mine, t.attacker);
  spec.mutable_src()->set_grant(t.Grant(*t.secret, v1::GRANT_ACCESS_READ));
  t.f.regions.sessions()->EndSession(t.victim);  // the victim exits: its regions and grants go
  auto refused = t.f.manager->Submit(spec);
  CHECK(!refused.ok());
}

TEST_CASE("layer-limited grants cover only their layers") {
  ManagerFixture f{Options(), nullptr};
  const uint64_t owner = f.regions.NewSession(), other = f.regions.NewSession();
  // Two sessions' paged pools of 4 layers.
  v1::RegionSpec layout;
  auto paged = [&](uint64_t session, bool writable) {
    return f.regions.PagedLayers(8, 4, writable, session);
  };
  auto src = paged(owner, false);
  auto dst = paged(other, true);
  v1::CreateGrantRequest request;
  request.set_region_id(src->id());
  request.set_access(v1::GRANT_ACCESS_READ);
  request.set_layer_begin(1);
  request.set_layer_end(3);
  sessions::Caller caller;
  caller.session_id = owner;
  auto grant = f.regions.grants()->CreateGrant(request, caller);
  REQUIRE(grant.ok());
  v1::TransferSpec spec;
  spec.set_session_id(other);
  spec.mutable_src()->set_region_id(src->id());
  spec.mutable_src()->set_grant(grant->token());
  spec.mutable_dst()->set_region_id(dst->id());
  spec.mutable_src()->add_block_ids(0);
  spec.mutable_dst()->add_block_ids(1);
  spec.mutable_src()->set_layer_begin(1);
  spec.set_num_layers(2);  // layers 1..2: inside
  auto ok = f.manager->Submit(spec);
  INFO(ok.status().ToString());
  CHECK(ok.ok());
  spec.set_num_layers(3);  // layers 1..3: layer 3 is outside
  RequireDenied(f.manager->Submit(spec), "covers layers [1, 3), the transfer touches [1, 4)");
  spec.clear_num_layers();  // every layer from 1: outside too
  RequireDenied(f.manager->Submit(spec), "spec.src.grant");
  f.engine.RunAll();
}

TEST_CASE("block tables and flag words are read only from the submitter's regions") {
  Tenants t;
  // The victim's region used as a block table: refused before a single id is read, so the
  // error cannot echo its bytes.
  v1::TransferSpec spec = t.Spec(*t.mine_src, *t.mine, t.attacker);
  v1::BlockTableRef* table = spec.mutable_src()->mutable_block_table();
  table->set_region_id(t.secret->id());
  table->set_count(4);
  auto refused = t.f.manager->Submit(spec);
  INFO(refused.status().ToString());
  REQUIRE(refused.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(refused.status().message()).find("spec.src.block_table.region_id") !=
        std::string::npos);
  CHECK(std::string(refused.status().message()).find("1583242846") == std::string::npos);

  v1::TransferSpec flags = t.Spec(*t.mine_src, *t.mine, t.attacker);
  flags.mutable_arrival_flags()->set_region_id(t.vault->id());
  flags.mutable_arrival_flags()->set_value(1);
  RequireDenied(t.f.manager->Submit(flags), "spec.arrival_flags.region_id");
  flags.mutable_arrival_flags()->set_grant(t.Grant(*t.vault, v1::GRANT_ACCESS_WRITE));
  flags.mutable_arrival_flags()->set_byte_offset(0);
  CHECK(t.f.manager->Submit(flags).ok());
  v1::TransferSpec ready = t.Spec(*t.mine_src, *t.mine, t.attacker);
  ready.mutable_ready_flags()->set_region_id(t.secret->id());
  ready.mutable_ready_flags()->set_value(1);
  RequireDenied(t.f.manager->Submit(ready), "spec.ready_flags.region_id");
  t.f.engine.RunAll();
}

TEST_CASE("only a transfer's submitter reads and controls it; the operator reads it only") {
  // Every call of the manager's is tried as another tenant and as an anonymous caller: each is
  // refused by the manager itself (no front door in between), as an unknown id is (NOT_FOUND
  // naming transfer_id), and nothing about the transfer changes.
  Tenants t;
  auto submitted = t.f.manager->Submit(t.Spec(*t.secret, *t.vault, t.victim));
  REQUIRE(submitted.ok());
  const uint64_t id = submitted->transfer_id();
  const sessions::Caller victim = t.f.As(t.victim);
  const sessions::Caller attacker = t.f.As(t.attacker);
  const sessions::Caller anonymous{};
  // Another tenant's id answers exactly as an id nobody has: code and message (with the probed
  // id in both), so its existence cannot be probed.
  auto RequireUnknown = [id](const absl::Status& refused) {
    INFO(refused.ToString());
    CHECK(refused.code() == absl::StatusCode::kNotFound);
    CHECK(std::string(refused.message()) == absl::StrCat("transfer_id: no transfer ", id));
  };
  for (const sessions::Caller& other : {attacker, anonymous}) {
    RequireUnknown(t.f.manager->Get(other, id).status());
    RequireUnknown(t.f.manager->Wait(other, id, absl::ZeroDuration()).status());
    bool heard = false;
    RequireUnknown(
        t.f.manager->WhenEnded(other, id, [&](const v1::TransferStatus&) { heard = true; }));
    bool watched = false;
    RequireUnknown(t.f.manager->Watch(other, id, absl::Milliseconds(1),
                                      [&](const v1::TransferEvent&) { return watched = true; }));
    CHECK(!watched);
    WatchCursor cursor;
    std::vector<v1::TransferEvent> events;
    RequireUnknown(t.f.manager->WatchStep(other, id, absl::Milliseconds(1), &cursor, &events));
    CHECK(events.empty());
    RequireUnknown(t.f.manager->MarkReady(other, id, 0, 1));
    RequireUnknown(t.f.manager->Cancel(other, id).status());
    // Listing shows another tenant nothing of the victim's (anonymous callers nothing at all).
    for (const auto& listed : t.f.manager->List(other, {}, 100)) CHECK(listed.transfer_id() != id);
    ListFilter by_session;
    by_session.session_id = t.victim;
    auto page = t.f.manager->ListChecked(other, by_session);
    REQUIRE(page.ok());
    CHECK(page->empty());
    t.f.engine.RunAll();
    CHECK(!heard);  // the transfer ended; the refused follower heard nothing
    CHECK(t.f.manager->Get(victim, id)->state() == v1::TRANSFER_STATE_SUCCEEDED);
  }
  // The submitter reads and lists it; an unknown id is NOT_FOUND for everyone, with the message
  // another tenant got for this one.
  CHECK(t.f.manager->Wait(victim, id, absl::ZeroDuration()).ok());
  CHECK(t.f.manager->List(victim, {}, 100).size() == 1);
  for (const sessions::Caller& caller : {victim, attacker, anonymous}) {
    const absl::Status unknown = t.f.manager->Get(caller, id + 1000).status();
    CHECK(unknown.code() == absl::StatusCode::kNotFound);
    CHECK(std::string(unknown.message()) == absl::StrCat("transfer_id: no transfer ", id + 1000));
    CHECK(t.f.manager->Cancel(caller, id + 1000).status().code() == absl::StatusCode::kNotFound);
  }
}

TEST_CASE("the operator reads every transfer but controls none; root cancels from a bare session") {
  Tenants t;
  v1::TransferSpec spec = t.Spec(*t.secret, *t.vault, t.victim);
  auto submitted = t.f.manager->Submit(spec);
  REQUIRE(submitted.ok());
  const uint64_t id = submitted->transfer_id();
  // kvraild's own uid (this process's): operator_role(), reads and lists everything.
  const sessions::Caller own_uid{t.f.regions.NewSession(), static_cast<int64_t>(::geteuid())};
  CHECK(t.f.manager->Get(own_uid, id).ok());
  CHECK(t.f.manager->List(own_uid, {}, 100).size() == 1);
  CHECK(t.f.manager->MarkReady(own_uid, id, 0, 1).code() == absl::StatusCode::kPermissionDenied);
  if (::geteuid() != 0) {
    const absl::Status refused = t.f.manager->Cancel(own_uid, id).status();
    CHECK(refused.code() == absl::StatusCode::kPermissionDenied);
    CHECK(std::string(refused.message()).find("only root may cancel") != std::string::npos);
  }
  // Root from a session that owns regions is a tenant: refused.
  const sessions::Caller root_tenant{t.attacker, 0};
  CHECK(t.f.manager->Cancel(root_tenant, id).status().code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(t.f.Get(id).state() < v1::TRANSFER_STATE_SUCCEEDED);
  // Root from a region-less session (the CLI) cancels it (an audit line).
  const sessions::Caller root_cli{t.f.regions.NewSession(), 0};
  auto cancelled = t.f.manager->Cancel(root_cli, id);
  REQUIRE(cancelled.ok());
  CHECK(cancelled->state() == v1::TRANSFER_STATE_CANCELLED);
}

TEST_CASE("a pull's producer, the source region's owner, marks its layers ready; no one else") {
  // The decode (here: attacker's session) pulls the prefill's (victim's) blocks under its read
  // grant; the prefill writes its layers and says so itself, with no grant of the decode's.
  Tenants t;
  v1::TransferSpec spec = t.Spec(*t.secret, *t.mine, t.attacker);
  spec.mutable_src()->set_grant(t.Grant(*t.secret, v1::GRANT_ACCESS_READ));
  spec.set_layerwise(true);
  auto pull = t.f.manager->Submit(spec);
  REQUIRE(pull.ok());
  const uint64_t id = pull->transfer_id();
  const sessions::Caller producer = t.f.As(t.victim);
  // A stranger learns nothing (NOT_FOUND, as for an unknown id); the operator, which reads
  // every transfer, is told why it may not mark layers, and the producer why it may not read.
  const sessions::Caller stranger = t.f.As(t.f.regions.NewSession());
  const absl::Status refused = t.f.manager->MarkReady(stranger, id, 0, 1);
  CHECK(refused.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(refused.message()) == absl::StrCat("transfer_id: no transfer ", id));
  const sessions::Caller operator_session{t.f.regions.NewSession(),
                                          static_cast<int64_t>(::geteuid())};
  const absl::Status told = t.f.manager->MarkReady(operator_session, id, 0, 1);
  CHECK(told.code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(told.message()).find("source region's owner") != std::string::npos);
  // Owning the source lets the producer mark layers, not read another's transfer status.
  CHECK(t.f.manager->Get(producer, id).status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(t.f.Get(id).state() < v1::TRANSFER_STATE_SUCCEEDED);
  REQUIRE(t.f.manager->MarkReady(producer, id, 0, 1).ok());
  t.f.engine.RunAll();
  CHECK(t.f.Get(id).state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(!t.MineUntouched());
}

TEST_CASE("idempotency keys are the caller's and name one spec") {
  Tenants t;
  v1::TransferSpec first = t.Spec(*t.secret, *t.vault, t.victim);
  first.set_idempotency_key("request-7");
  auto a = t.f.manager->Submit(first);
  REQUIRE(a.ok());
  CHECK_FALSE(a->deduplicated());
  // The same spec again: the same transfer.
  auto again = t.f.manager->Submit(first);
  REQUIRE(again.ok());
  CHECK(again->deduplicated());
  CHECK(again->transfer_id() == a->transfer_id());
  // Another session's same key is another transfer (its own regions; nothing of the victim's is
  // reported to it as done).
  v1::TransferSpec theirs = t.Spec(*t.mine_src, *t.mine, t.attacker);
  theirs.set_idempotency_key("request-7");
  auto b = t.f.manager->Submit(theirs);
  REQUIRE(b.ok());
  CHECK_FALSE(b->deduplicated());
  CHECK(b->transfer_id() != a->transfer_id());
  // A different spec under a key already used by the same session is refused, naming the key.
  v1::TransferSpec changed = first;
  changed.set_num_bytes(kTile);
  auto refused = t.f.manager->Submit(changed);
  INFO(refused.status().ToString());
  CHECK(refused.status().code() == absl::StatusCode::kAlreadyExists);
  CHECK(std::string(refused.status().message()).find("idempotency_key") != std::string::npos);
  t.f.engine.RunAll();
  CHECK(t.f.Get(b->transfer_id()).spec().session_id() == t.attacker);
  CHECK(t.f.Get(a->transfer_id()).spec().session_id() == t.victim);
}

TEST_CASE("no status returns a grant token: not to the submitter, the operator or a waiter") {
  // A token is a bearer credential: whoever reads it may use the grant. The operator role reads
  // every transfer (under MPS that is every inference server's uid), so a status naming the
  // tokens a transfer was submitted with handed them out.
  Tenants t;
  const std::string read = t.Grant(*t.secret, v1::GRANT_ACCESS_READ);
  const std::string write = t.Grant(*t.vault, v1::GRANT_ACCESS_WRITE);
  v1::TransferSpec spec = t.Spec(*t.secret, *t.vault, t.attacker);
  spec.mutable_src()->set_grant(read);
  spec.mutable_dst()->set_grant(write);
  spec.set_layerwise(true);
  auto submitted = t.f.manager->Submit(spec);
  INFO(submitted.status().ToString());
  REQUIRE(submitted.ok());
  const uint64_t id = submitted->transfer_id();
  const sessions::Caller submitter = t.f.As(t.attacker);

  std::vector<v1::TransferStatus> seen;
  seen.push_back(t.f.Get(id));  // the operator's read
  ListFilter all;
  for (auto& listed : t.f.manager->List(t.f.reader, all)) seen.push_back(std::move(listed));
  for (auto& listed : t.f.manager->List(submitter, all)) seen.push_back(std::move(listed));
  auto waited = t.f.manager->Wait(submitter, id, absl::ZeroDuration());
  REQUIRE(waited.ok());
  seen.push_back(*waited);
  REQUIRE(t.f.manager
              ->Watch(submitter, id, absl::Milliseconds(1),
                      [&](const v1::TransferEvent& event) {
                        seen.push_back(event.status());
                        return false;  // the snapshot is enough
                      })
              .ok());
  v1::TransferStatus ended;
  REQUIRE(
      t.f.manager->WhenEnded(submitter, id, [&](const v1::TransferStatus& s) { ended = s; }).ok());
  REQUIRE(t.f.manager->MarkReady(submitter, id, 0, 1).ok());
  t.f.engine.RunAll();
  REQUIRE(ended.state() == v1::TRANSFER_STATE_SUCCEEDED);
  seen.push_back(ended);
  seen.push_back(t.f.Get(id));
  CHECK(seen.size() >= 7);
  for (const v1::TransferStatus& status : seen) {
    const std::string text = status.DebugString();
    INFO(text);
    CHECK(status.transfer_id() == id);
    CHECK(text.find(read) == std::string::npos);
    CHECK(text.find(write) == std::string::npos);
    CHECK(text.find("kvg1.") == std::string::npos);
  }
  // The grants still hold the transfer's uses: their revocation ends a live transfer as before
  // (grant_end_test), and the tokens still work for their holder.
  v1::TransferSpec again = t.Spec(*t.secret, *t.vault, t.attacker);
  again.mutable_src()->set_grant(read);
  again.mutable_dst()->set_grant(write);
  CHECK(t.f.manager->Submit(again).ok());
  t.f.engine.RunAll();
}

TEST_CASE("a transfer inherited from a predecessor is checked as one of this daemon's") {
  // A hot restart hands ended transfers over (ImportState); every call about one still names
  // its caller and is refused as for a transfer admitted here.
  Tenants t;
  constexpr uint64_t kId = 77;
  handover::TransferState state;
  state.set_next_transfer_id(kId + 1);
  handover::EndedTransfer* ended = state.add_ended();
  ended->mutable_status()->set_transfer_id(kId);
  ended->mutable_status()->set_state(v1::TRANSFER_STATE_SUCCEEDED);
  ended->set_submitter_session(t.victim);
  ended->set_src_owner_session(t.attacker);  // a pull of the attacker's blocks
  ended->set_dst_owner_session(t.victim);
  t.f.manager->ImportState(state);
  const sessions::Caller victim = t.f.As(t.victim);
  const sessions::Caller stranger = t.f.As(t.f.regions.NewSession());
  const sessions::Caller anonymous{};
  const std::string unknown = absl::StrCat("NOT_FOUND: transfer_id: no transfer ", kId);
  for (const sessions::Caller& other : {stranger, anonymous}) {
    CHECK(t.f.manager->Get(other, kId).status().ToString() == unknown);
    CHECK(t.f.manager->Wait(other, kId, absl::ZeroDuration()).status().ToString() == unknown);
    bool heard = false;
    CHECK(t.f.manager->WhenEnded(other, kId, [&](const v1::TransferStatus&) { heard = true; })
              .ToString() == unknown);
    CHECK(!heard);
    WatchCursor cursor;
    std::vector<v1::TransferEvent> events;
    CHECK(t.f.manager->WatchStep(other, kId, absl::Milliseconds(1), &cursor, &events).ToString() ==
          unknown);
    CHECK(events.empty());
    CHECK(t.f.manager->Cancel(other, kId).status().ToString() == unknown);
    CHECK(t.f.manager->MarkReady(other, kId, 0, 1).ToString() == unknown);
  }
  // The source's owner is a party: told why it may not read it.
  CHECK(t.f.manager->Get(t.f.As(t.attacker), kId).status().code() ==
        absl::StatusCode::kPermissionDenied);
  // Its submitter and the operator read it; it has ended, so no layer is marked ready.
  CHECK(t.f.manager->Get(victim, kId)->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(t.f.Get(kId).state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(t.f.manager->MarkReady(victim, kId, 0, 1).code() == absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvrail::transfers

// The identity and memory tables handed to a successor (each one's ExportState / ImportState,
// daemon/handover: the session table, the region table, the grants): the same sessions, secrets,
// fd tokens, region ids over the same memory, and grants; the exported state survives
// serialization; bad bundles are refused naming the field.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "base/clock.h"
#include "daemon/access/access.h"
#include "daemon/regions/regions.h"
#include "daemon/sessions/sessions.h"

namespace kvrail::regions {
namespace {

constexpr uint64_t kBytes = 64 << 10;

UniqueFd Memfd(size_t bytes) {
  UniqueFd fd(::memfd_create("handover_state_test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(fd.valid());
  REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(bytes)) == 0);
  return fd;
}

v1::RegionSpec BytesSpec(const std::string& token) {
  v1::RegionSpec spec;
  spec.set_name("pool");
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.set_size_bytes(kBytes);
  spec.set_writable(true);
  spec.mutable_bytes();
  spec.mutable_share()->set_fd_token(token);
  return spec;
}

struct Handed {
  handover::RegionTableState state;
  std::vector<UniqueFd> fds;
};

// The three tables as kvraild holds them (each outlives the ones that hook it).
struct Tables {
  explicit Tables(uint64_t first_session_id = 1, uint64_t first_region_id = 1)
      : sessions(sessions::SessionTable::Create({}, first_session_id)),
        regions(RegionTable::Create(Clock::Real(), sessions.get(), first_region_id)),
        grants(access::Grants::Create(Clock::Real(), sessions.get(), regions.get())) {}
  // As kvraild imports: sessions and fd tokens, then regions, then grants.
  absl::Status Import(const handover::RegionTableState& state, std::vector<UniqueFd>* fds) {
    if (absl::Status s = sessions->ImportState(state, fds); !s.ok()) return s;
    if (absl::Status s = regions->ImportState(state, fds); !s.ok()) return s;
    grants->ImportState(state);
    return absl::OkStatus();
  }
  std::unique_ptr<sessions::SessionTable> sessions;
  std::unique_ptr<RegionTable> regions;
  std::unique_ptr<access::Grants> grants;
};

Handed Export(const Tables& tables) {
  Handed handed;
  REQUIRE(tables.sessions->ExportState(&handed.state, &handed.fds).ok());
  REQUIRE(tables.regions->ExportState(&handed.state, &handed.fds).ok());
  tables.grants->ExportState(&handed.state);
  // What crosses the socket is bytes: the successor reads it back.
  std::string bytes;
  REQUIRE(handed.state.SerializeToString(&bytes));
  handover::RegionTableState parsed;
  REQUIRE(parsed.ParseFromString(bytes));
  handed.state = parsed;
  return handed;
}

TEST_CASE("a successor's table holds the same sessions, regions, tokens and grants") {
  auto old_tables = std::make_unique<Tables>(5000, 1000);
  Tables& old = *old_tables;
  const uint64_t owner = old.sessions->BeginSession();
  const uint64_t other = old.sessions->BeginSession();
  old.sessions->SetSessionPeer(owner, 1234);
  const std::string secret = old.sessions->SessionSecret(owner);

  UniqueFd memory = Memfd(kBytes);
  uint8_t* client_view = static_cast<uint8_t*>(
      ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, memory.get(), 0));
  REQUIRE(client_view != MAP_FAILED);
  auto token = old.sessions->AddFd(owner, UniqueFd(::dup(memory.get())));
  REQUIRE(token.ok());
  auto region = old.regions->Register(BytesSpec(*token), owner);
  REQUIRE(region.ok());
  const uint64_t region_id = (*region)->id();
  // An fd passed and not used yet, and a grant to the other session.
  auto unused = old.sessions->AddFd(owner, Memfd(kBytes));
  REQUIRE(unused.ok());
  v1::CreateGrantRequest grant_request;
  grant_request.set_region_id(region_id);
  grant_request.set_access(v1::GRANT_ACCESS_READ);
  auto grant = old.grants->CreateGrant(grant_request, sessions::Caller{owner, 1234});
  REQUIRE(grant.ok());

  Handed handed = Export(old);
  CHECK(handed.state.sessions_size() == 2);
  CHECK(handed.state.regions_size() == 1);
  CHECK(handed.state.pending_fds_size() == 1);
  CHECK(handed.state.grants_size() == 1);
  // The old table is unchanged: it serves on if the successor never commits.
  CHECK(old.regions->size() == 1);
  CHECK(old.sessions->Authenticate(owner, secret).ok());

  Tables successor(900000, 900000);
  REQUIRE(successor.Import(handed.state, &handed.fds).ok());
  auto caller = successor.sessions->Authenticate(owner, secret);
  REQUIRE(caller.ok());
  CHECK(caller->uid == 1234);
  CHECK(successor.sessions->SessionOpen(other));
  auto moved = successor.regions->Get(region_id);
  REQUIRE(moved.ok());
  CHECK((*moved)->session_id() == owner);
  CHECK((*moved)->spec().name() == "pool");
  // The same pages: what the client writes, the successor's mapping reads.
  std::memcpy(client_view, "handed over", 12);
  CHECK(std::memcmp((*moved)->data(), "handed over", 12) == 0);
  // The grant lets the other session read; the unused token registers in the successor.
  CHECK(successor.grants
            ->CheckAccess(**moved, other, grant->token(), v1::GRANT_ACCESS_READ, 0, 0, "spec.src")
            .ok());
  auto second = successor.regions->Register(BytesSpec(*unused), owner);
  REQUIRE(second.ok());
  // New ids continue past the predecessor's: none names an old session or region again.
  CHECK((*second)->id() > region_id);
  CHECK(successor.sessions->BeginSession() > other);
  // Dropping the old tables (the predecessor exits) leaves the successor's mapping intact.
  old_tables.reset();
  CHECK(std::memcmp((*moved)->data(), "handed over", 12) == 0);
  ::munmap(client_view, kBytes);
}

TEST_CASE("a bundle whose descriptors do not match is refused naming the field") {
  Tables old;
  const uint64_t session = old.sessions->BeginSession();
  auto token = old.sessions->AddFd(session, Memfd(kBytes));
  REQUIRE(token.ok());
  REQUIRE(old.regions->Register(BytesSpec(*token), session).ok());
  Handed handed = Export(old);
  SECTION("a region's descriptor is missing") {
    handed.fds.clear();
    Tables successor;
    const absl::Status status = successor.Import(handed.state, &handed.fds);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(status.message()).find(".fds") != std::string::npos);
  }
  SECTION("a table that already serves is not overwritten") {
    Tables successor;
    successor.sessions->BeginSession();
    CHECK(successor.Import(handed.state, &handed.fds).code() ==
          absl::StatusCode::kFailedPrecondition);
  }
  SECTION("a descriptor that is not the region's memory fails that region") {
    handed.fds[handed.state.regions(0).fds(0)] = UniqueFd(::open("/dev/null", O_RDWR | O_CLOEXEC));
    Tables successor;
    const absl::Status status = successor.Import(handed.state, &handed.fds);
    CHECK_FALSE(status.ok());
    CHECK(std::string(status.message()).find("handover: region") != std::string::npos);
  }
}

}  // namespace
}  // namespace kvrail::regions

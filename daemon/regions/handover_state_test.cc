// A region table handed to a successor (ExportState / ImportState, daemon/handover): the same
// sessions, secrets, fd tokens, region ids over the same memory, and grants; the exported state
// survives serialization; bad bundles are refused naming the field.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "base/clock.h"
#include "daemon/regions/regions.h"

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

Handed Export(const RegionTable& table) {
  Handed handed;
  REQUIRE(table.ExportState(&handed.state, &handed.fds).ok());
  // What crosses the socket is bytes: the successor reads it back.
  std::string bytes;
  REQUIRE(handed.state.SerializeToString(&bytes));
  handover::RegionTableState parsed;
  REQUIRE(parsed.ParseFromString(bytes));
  handed.state = parsed;
  return handed;
}

TEST_CASE("a successor's table holds the same sessions, regions, tokens and grants") {
  auto old_table = RegionTable::Create(Clock::Real(), IdBases{1000, 5000});
  const uint64_t owner = old_table->BeginSession();
  const uint64_t other = old_table->BeginSession();
  old_table->SetSessionPeer(owner, 1234);
  const std::string secret = old_table->SessionSecret(owner);

  UniqueFd memory = Memfd(kBytes);
  uint8_t* client_view = static_cast<uint8_t*>(
      ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, memory.get(), 0));
  REQUIRE(client_view != MAP_FAILED);
  auto token = old_table->AddFd(owner, UniqueFd(::dup(memory.get())));
  REQUIRE(token.ok());
  auto region = old_table->Register(BytesSpec(*token), owner);
  REQUIRE(region.ok());
  const uint64_t region_id = (*region)->id();
  // An fd passed and not used yet, and a grant to the other session.
  auto unused = old_table->AddFd(owner, Memfd(kBytes));
  REQUIRE(unused.ok());
  v1::CreateGrantRequest grant_request;
  grant_request.set_region_id(region_id);
  grant_request.set_access(v1::GRANT_ACCESS_READ);
  auto grant = old_table->CreateGrant(grant_request, Caller{owner, 1234});
  REQUIRE(grant.ok());

  Handed handed = Export(*old_table);
  CHECK(handed.state.sessions_size() == 2);
  CHECK(handed.state.regions_size() == 1);
  CHECK(handed.state.pending_fds_size() == 1);
  CHECK(handed.state.grants_size() == 1);
  // The old table is unchanged: it serves on if the successor never commits.
  CHECK(old_table->size() == 1);
  CHECK(old_table->Authenticate(owner, secret).ok());

  auto new_table = RegionTable::Create(Clock::Real(), IdBases{900000, 900000});
  REQUIRE(new_table->ImportState(handed.state, &handed.fds).ok());
  auto caller = new_table->Authenticate(owner, secret);
  REQUIRE(caller.ok());
  CHECK(caller->uid == 1234);
  CHECK(new_table->SessionOpen(other));
  auto moved = new_table->Get(region_id);
  REQUIRE(moved.ok());
  CHECK((*moved)->session_id() == owner);
  CHECK((*moved)->spec().name() == "pool");
  // The same pages: what the client writes, the successor's mapping reads.
  std::memcpy(client_view, "handed over", 12);
  CHECK(std::memcmp((*moved)->data(), "handed over", 12) == 0);
  // The grant lets the other session read; the unused token registers in the successor.
  CHECK(new_table
            ->CheckAccess(**moved, other, grant->token(), v1::GRANT_ACCESS_READ, 0, 0, "spec.src")
            .ok());
  auto second = new_table->Register(BytesSpec(*unused), owner);
  REQUIRE(second.ok());
  // New ids continue past the predecessor's: none names an old session or region again.
  CHECK((*second)->id() > region_id);
  CHECK(new_table->BeginSession() > other);
  // Dropping the old table (the predecessor exits) leaves the successor's mapping intact.
  old_table.reset();
  CHECK(std::memcmp((*moved)->data(), "handed over", 12) == 0);
  ::munmap(client_view, kBytes);
}

TEST_CASE("a bundle whose descriptors do not match is refused naming the field") {
  auto old_table = RegionTable::Create(Clock::Real());
  const uint64_t session = old_table->BeginSession();
  auto token = old_table->AddFd(session, Memfd(kBytes));
  REQUIRE(token.ok());
  REQUIRE(old_table->Register(BytesSpec(*token), session).ok());
  Handed handed = Export(*old_table);
  SECTION("a region's descriptor is missing") {
    handed.fds.clear();
    auto table = RegionTable::Create(Clock::Real());
    const absl::Status status = table->ImportState(handed.state, &handed.fds);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(status.message()).find(".fds") != std::string::npos);
  }
  SECTION("a table that already serves is not overwritten") {
    auto table = RegionTable::Create(Clock::Real());
    table->BeginSession();
    CHECK(table->ImportState(handed.state, &handed.fds).code() ==
          absl::StatusCode::kFailedPrecondition);
  }
  SECTION("a descriptor that is not the region's memory fails that region") {
    handed.fds[handed.state.regions(0).fds(0)] = UniqueFd(::open("/dev/null", O_RDWR | O_CLOEXEC));
    auto table = RegionTable::Create(Clock::Real());
    const absl::Status status = table->ImportState(handed.state, &handed.fds);
    CHECK_FALSE(status.ok());
    CHECK(std::string(status.message()).find("handover: region") != std::string::npos);
  }
}

}  // namespace
}  // namespace kvrail::regions

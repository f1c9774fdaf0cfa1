#include "daemon/access/access.h"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "daemon/regions/test_tables.h"

namespace kvrail::access {
namespace {

using regions::RegionTable;
using regions::testing::Tables;

void RequireError(const absl::Status& s, absl::StatusCode code, const std::string& text) {
  INFO(s.ToString());
  REQUIRE(!s.ok());
  CHECK(s.code() == code);
  CHECK(std::string(s.message()).find(text) != std::string::npos);
}

UniqueFd Memfd(size_t bytes) {
  UniqueFd fd(::memfd_create("access_test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(fd.valid());
  REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(bytes)) == 0);
  return fd;
}

// RegionSpec.library_region (the client library's block-table region, by flag, not by name).
v1::RegionSpec LibrarySpec(const std::string& token, uint64_t size) {
  v1::RegionSpec spec;
  spec.set_name("anything");
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.set_size_bytes(size);
  spec.mutable_bytes();
  spec.mutable_share()->set_fd_token(token);
  spec.set_library_region(true);
  return spec;
}

TEST_CASE("a library region is no transfer endpoint and cannot be granted") {
  Tables tables;
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  auto grants = Grants::Create(Clock::Real(), session_table, table);
  const uint64_t session = session_table->BeginSession();
  UniqueFd fd = Memfd(1 << 20);
  auto token = session_table->AddFd(session, UniqueFd(::dup(fd.get())));
  REQUIRE(token.ok());
  v1::RegionSpec spec = LibrarySpec(*token, 1 << 20);
  spec.set_writable(true);
  auto region = table->Register(spec, session);
  REQUIRE(region.ok());
  // Even its own session may not name it as a source, destination or flag array.
  RequireError(grants->CheckAccess(**region, session, "", v1::GRANT_ACCESS_READ, 0, 0, "spec.src"),
               absl::StatusCode::kPermissionDenied, "spec.src.region_id: region");
  RequireError(grants->CheckAccess(**region, session, "", v1::GRANT_ACCESS_WRITE, 0, 0, "spec.dst"),
               absl::StatusCode::kPermissionDenied, "RegionSpec.library_region");
  sessions::Caller owner;
  owner.session_id = session;
  v1::CreateGrantRequest grant;
  grant.set_region_id((*region)->id());
  grant.set_access(v1::GRANT_ACCESS_READ);
  grant.set_ttl_ms(1000);
  RequireError(grants->CreateGrant(grant, owner).status(), absl::StatusCode::kFailedPrecondition,
               "cannot be granted");
  // An ordinary region of the same name is an endpoint as any other.
  auto token2 = session_table->AddFd(session, UniqueFd(::dup(fd.get())));
  REQUIRE(token2.ok());
  v1::RegionSpec named = LibrarySpec(*token2, 1 << 20);
  named.set_library_region(false);
  named.set_name("client block tables");
  auto plain = table->Register(named, session);
  REQUIRE(plain.ok());
  CHECK(grants->CheckAccess(**plain, session, "", v1::GRANT_ACCESS_READ, 0, 0, "spec.src").ok());
  grant.set_region_id((*plain)->id());
  CHECK(grants->CreateGrant(grant, owner).ok());
}

}  // namespace
}  // namespace kvrail::access

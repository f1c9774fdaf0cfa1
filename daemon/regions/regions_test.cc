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

UniqueFd Memfd(size_t bytes, unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING) {
  UniqueFd fd(::memfd_create("regions_test", flags));
  REQUIRE(fd.valid());
  REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(bytes)) == 0);
  return fd;
}

v1::RegionSpec PagedSpec(uint64_t size, bool writable) {
  v1::RegionSpec spec;
  spec.set_name("pool");
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.set_size_bytes(size);
  spec.set_writable(writable);
  auto* l = spec.mutable_paged_kv();
  l->set_num_layers(2);
  l->set_num_parts(2);
  l->set_num_blocks(8);
  l->set_tokens_per_block(16);
  l->set_num_heads(2);
  l->set_head_dim(64);
  l->set_dtype(v1::DTYPE_BF16);
  l->set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  return spec;
}

constexpr uint64_t kPoolBytes = 2 * 2 * 8 * 16 * 2 * 64 * 2;  // 128 KiB

void RequireError(const absl::Status& s, absl::StatusCode code, const std::string& field) {
  INFO(s.ToString());
  REQUIRE(!s.ok());
  CHECK(s.code() == code);
  CHECK(std::string(s.message()).find(field) != std::string::npos);
}

TEST_CASE("a memfd region maps the client's memory, sealed against shrinking") {
  auto table = RegionTable::Create(Clock::Real());
  const uint64_t session = table->BeginSession();
  UniqueFd fd = Memfd(kPoolBytes);
  const int raw = fd.get();
  void* client_view = ::mmap(nullptr, kPoolBytes, PROT_READ | PROT_WRITE, MAP_SHARED, raw, 0);
  REQUIRE(client_view != MAP_FAILED);
  UniqueFd dup(::dup(raw));
  auto token = table->AddFd(session, std::move(dup));
  REQUIRE(token.ok());
  auto spec = PagedSpec(kPoolBytes, true);
  spec.mutable_share()->set_fd_token(*token);
  auto region = table->Register(spec, session);
  REQUIRE(region.ok());
  std::memcpy(client_view, "kvrail", 6);
  CHECK(std::memcmp((*region)->data(), "kvrail", 6) == 0);  // the same pages
  CHECK((*region)->view().paged);
  CHECK((*region)->view().layout.block_stride == 16 * 2 * 64 * 2);
  // The daemon sealed the file: the client can no longer shrink it under the daemon.
  CHECK(::ftruncate(raw, 4096) != 0);
  // Tokens are single use.
  auto again = table->Register(spec, session);
  RequireError(again.status(), absl::StatusCode::kNotFound, "spec.share.fd_token");
  ::munmap(client_view, kPoolBytes);
}

TEST_CASE("a memfd that cannot be sealed is refused") {
  auto table = RegionTable::Create(Clock::Real());
  const uint64_t session = table->BeginSession();
  auto token = table->AddFd(session, Memfd(kPoolBytes, MFD_CLOEXEC));  // no MFD_ALLOW_SEALING
  REQUIRE(token.ok());
  auto spec = PagedSpec(kPoolBytes, true);
  spec.mutable_share()->set_fd_token(*token);
  RequireError(table->Register(spec, session).status(), absl::StatusCode::kFailedPrecondition,
               "spec.share.fd_token");
}

TEST_CASE("tokens belong to their session; ending a session drops its tokens and regions") {
  auto table = RegionTable::Create(Clock::Real());
  const uint64_t a = table->BeginSession();
  const uint64_t b = table->BeginSession();
  CHECK(a != b);
  auto token = table->AddFd(a, Memfd(kPoolBytes));
  REQUIRE(token.ok());
  auto spec = PagedSpec(kPoolBytes, false);
  spec.mutable_share()->set_fd_token(*token);
  RequireError(table->Register(spec, b).status(), absl::StatusCode::kPermissionDenied,
               "spec.share.fd_token");
  auto region = table->Register(spec, a);
  REQUIRE(region.ok());
  const uint64_t id = (*region)->id();
  auto second_token = table->AddFd(a, Memfd(kPoolBytes));
  REQUIRE(second_token.ok());
  CHECK(table->size() == 1);
  table->EndSession(a);
  CHECK(table->size() == 0);
  CHECK(table->Get(id).status().code() == absl::StatusCode::kNotFound);
  // The transfer that still holds the region keeps a valid mapping.
  (void)(*region)->data()[0];
  spec.mutable_share()->set_fd_token(*second_token);
  RequireError(table->Register(spec, a).status(), absl::StatusCode::kNotFound, "spec.share.fd_token");
}

TEST_CASE("bad specs are rejected naming the field, before any token is consumed") {
  auto table = RegionTable::Create(Clock::Real());
  const uint64_t session = table->BeginSession();
  auto token = table->AddFd(session, Memfd(kPoolBytes));
  REQUIRE(token.ok());
  auto base = PagedSpec(kPoolBytes, true);
  base.mutable_share()->set_fd_token(*token);
  auto expect = [&](v1::RegionSpec spec, absl::StatusCode code, const std::string& field) {
    RequireError(table->Register(spec, session).status(), code, field);
  };
  {
    auto s = base;
    s.set_memory_kind(v1::MEMORY_KIND_UNSPECIFIED);
    expect(s, absl::StatusCode::kInvalidArgument, "spec.memory_kind");
  }
  {
    auto s = base;
    s.set_size_bytes(0);
    expect(s, absl::StatusCode::kInvalidArgument, "spec.size_bytes");
  }
  {
    auto s = base;
    s.clear_paged_kv();
    expect(s, absl::StatusCode::kInvalidArgument, "spec.layout");
  }
  {
    auto s = base;
    s.mutable_paged_kv()->set_num_parts(3);
    expect(s, absl::StatusCode::kInvalidArgument, "spec.paged_kv.num_parts");
  }
  {
    auto s = base;
    s.mutable_paged_kv()->set_num_blocks(9);  // one block more than the memory holds
    expect(s, absl::StatusCode::kInvalidArgument, "spec.paged_kv");
  }
  {
    auto s = base;
    s.set_size_bytes(kPoolBytes * 2);  // larger than the memfd
    s.mutable_paged_kv()->set_num_blocks(16);
    expect(s, absl::StatusCode::kInvalidArgument, "spec.size_bytes");
  }
  {
    auto s = base;
    s.mutable_share()->set_offset(4096);  // offset + size beyond the memfd
    expect(s, absl::StatusCode::kInvalidArgument, "spec.size_bytes");
  }
  {
    auto s = base;
    s.mutable_share()->set_shm_name("no-slash");
    expect(s, absl::StatusCode::kInvalidArgument, "spec.share.shm_name");
  }
  {
    auto s = base;
    s.mutable_share()->set_shm_name("/kvrail-regions-test-missing");
    expect(s, absl::StatusCode::kNotFound, "spec.share.shm_name");
  }
  {
    auto s = base;
    s.clear_share();
    expect(s, absl::StatusCode::kInvalidArgument, "spec.share");
  }
  CHECK(table->size() == 0);
  // No failure consumed the token: the original request registers now.
  CHECK(table->Register(base, session).ok());
}

TEST_CASE("shm regions map by name; read-only regions refuse nothing but are mapped read-only") {
  auto table = RegionTable::Create(Clock::Real());
  const std::string name = "/kvrail-regions-test-" + std::to_string(::getpid());
  UniqueFd fd(::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600));
  REQUIRE(fd.valid());
  REQUIRE(::ftruncate(fd.get(), kPoolBytes) == 0);
  auto spec = PagedSpec(kPoolBytes, false);
  spec.mutable_share()->set_shm_name(name);
  auto region = table->Register(spec, 0);
  ::shm_unlink(name.c_str());
  REQUIRE(region.ok());
  CHECK((*region)->session_id() == 0);
  CHECK(table->List().size() == 1);
  CHECK(table->List()[0].spec().name() == "pool");
  REQUIRE(table->Unregister((*region)->id()).ok());
  RequireError(table->Unregister((*region)->id()), absl::StatusCode::kNotFound, "region_id");
}

}  // namespace
}  // namespace kvrail::regions

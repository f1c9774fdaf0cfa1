#include "daemon/regions/regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "base/clock.h"
#include "daemon/regions/test_tables.h"

namespace kvrail::regions {
namespace {

using testing::Tables;

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
  Tables tables;
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  UniqueFd fd = Memfd(kPoolBytes);
  const int raw = fd.get();
  void* client_view = ::mmap(nullptr, kPoolBytes, PROT_READ | PROT_WRITE, MAP_SHARED, raw, 0);
  REQUIRE(client_view != MAP_FAILED);
  UniqueFd dup(::dup(raw));
  auto token = session_table->AddFd(session, std::move(dup));
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

TEST_CASE("ids count from the tables' bases") {
  constexpr uint64_t k32 = uint64_t{1} << 32;
  Tables tables({}, 7 * k32, {}, 9 * k32);
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  CHECK(session == 9 * k32);
  CHECK(session_table->BeginSession() == 9 * k32 + 1);
  auto token = session_table->AddFd(session, Memfd(kPoolBytes));
  REQUIRE(token.ok());
  auto spec = PagedSpec(kPoolBytes, true);
  spec.mutable_share()->set_fd_token(*token);
  auto region = table->Register(spec, session);
  REQUIRE(region.ok());
  CHECK((*region)->id() == 7 * k32);
  CHECK((*region)->Info().region_id() == 7 * k32);
  // An id of another instance (a region id 1 a client kept across a restart) names nothing.
  CHECK(table->Get(1).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a memfd that cannot be sealed is mapped guarded, not sealed") {
  // host_memory_test tries truncating one under the daemon.
  Tables tables;
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  auto token =
      session_table->AddFd(session, Memfd(kPoolBytes, MFD_CLOEXEC));  // no MFD_ALLOW_SEALING
  REQUIRE(token.ok());
  auto spec = PagedSpec(kPoolBytes, true);
  spec.mutable_share()->set_fd_token(*token);
  auto region = table->Register(spec, session);
  REQUIRE(region.ok());
  CHECK(!(*region)->Info().host_sealed());
}

TEST_CASE("tokens belong to their session; ending a session drops its tokens and regions") {
  Tables tables;
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t a = session_table->BeginSession();
  const uint64_t b = session_table->BeginSession();
  CHECK(a != b);
  auto token = session_table->AddFd(a, Memfd(kPoolBytes));
  REQUIRE(token.ok());
  auto spec = PagedSpec(kPoolBytes, false);
  spec.mutable_share()->set_fd_token(*token);
  RequireError(table->Register(spec, b).status(), absl::StatusCode::kPermissionDenied,
               "spec.share.fd_token");
  auto region = table->Register(spec, a);
  REQUIRE(region.ok());
  const uint64_t id = (*region)->id();
  auto second_token = session_table->AddFd(a, Memfd(kPoolBytes));
  REQUIRE(second_token.ok());
  CHECK(table->size() == 1);
  session_table->EndSession(a);
  CHECK(table->size() == 0);
  CHECK(table->Get(id).status().code() == absl::StatusCode::kNotFound);
  // The transfer that still holds the region keeps a valid mapping.
  (void)(*region)->data()[0];
  spec.mutable_share()->set_fd_token(*second_token);
  RequireError(table->Register(spec, a).status(), absl::StatusCode::kNotFound,
               "spec.share.fd_token");
}

TEST_CASE("bad specs are rejected naming the field, before any token is consumed") {
  Tables tables;
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  session_table->SetSessionPeer(session, static_cast<uint32_t>(::geteuid()));  // shm names below
  auto token = session_table->AddFd(session, Memfd(kPoolBytes));
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
  Tables tables;
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const std::string name = "/kvrail-regions-test-" + std::to_string(::getpid());
  UniqueFd fd(::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600));
  REQUIRE(fd.valid());
  REQUIRE(::ftruncate(fd.get(), kPoolBytes) == 0);
  auto spec = PagedSpec(kPoolBytes, false);
  spec.mutable_share()->set_shm_name(name);
  // By name only for a session whose uid owns the object (host_memory_test tries the rest).
  const uint64_t session = session_table->BeginSession();
  session_table->SetSessionPeer(session, static_cast<uint32_t>(::geteuid()));
  auto region = table->Register(spec, session);
  ::shm_unlink(name.c_str());
  REQUIRE(region.ok());
  CHECK((*region)->session_id() == session);
  CHECK(table->List().size() == 1);
  CHECK(table->List()[0].spec().name() == "pool");
  REQUIRE(table->Unregister((*region)->id()).ok());
  RequireError(table->Unregister((*region)->id()), absl::StatusCode::kNotFound, "region_id");
}

}  // namespace
}  // namespace kvrail::regions

namespace kvrail::regions {
namespace {

// A per-layer spec of PagedSpec's layout: layer_stride 0, one layer's span per layer.
constexpr uint64_t kLayerBytes = kPoolBytes / 2;

v1::RegionSpec LayeredSpec(bool writable) {
  v1::RegionSpec spec = PagedSpec(kLayerBytes, writable);
  return spec;
}

TEST_CASE("a per-layer region maps each layer's memory at its own base") {
  Tables tables;
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  // Layer 0 in its own memfd; layer 1 at 8 KiB into a second, larger one.
  UniqueFd a = Memfd(kLayerBytes), b = Memfd(kLayerBytes + 8192);
  void* view_b =
      ::mmap(nullptr, kLayerBytes + 8192, PROT_READ | PROT_WRITE, MAP_SHARED, b.get(), 0);
  REQUIRE(view_b != MAP_FAILED);
  auto spec = LayeredSpec(true);
  for (const int fd : {a.get(), b.get()}) {
    auto token = session_table->AddFd(session, UniqueFd(::dup(fd)));
    REQUIRE(token.ok());
    v1::RegionShare* share = spec.add_layer_shares();
    share->set_fd_token(*token);
  }
  spec.mutable_layer_shares(1)->set_offset(8192);
  auto region = table->Register(spec, session);
  INFO(region.status().ToString());
  REQUIRE(region.ok());
  const planner::RegionView& view = (*region)->view();
  REQUIRE(view.layer_bases != nullptr);
  REQUIRE(view.layer_bases->size() == 2);
  CHECK(view.layout.layer_stride == 0);
  CHECK(view.size_bytes == kLayerBytes);
  std::memcpy(static_cast<uint8_t*>(view_b) + 8192, "layer1", 6);
  CHECK(std::memcmp(reinterpret_cast<const void*>((*view.layer_bases)[1]), "layer1", 6) == 0);
  CHECK((*region)->data() == reinterpret_cast<uint8_t*>((*view.layer_bases)[0]));
  CHECK((*region)->Info().spec().layer_shares_size() == 2);
  ::munmap(view_b, kLayerBytes + 8192);
}

TEST_CASE("per-layer region errors name the field, and a failed layer consumes no token") {
  Tables tables;
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  UniqueFd small = Memfd(kLayerBytes / 2), big = Memfd(kLayerBytes);
  auto big_token = session_table->AddFd(session, UniqueFd(::dup(big.get())));
  auto small_token = session_table->AddFd(session, UniqueFd(::dup(small.get())));
  REQUIRE(big_token.ok());
  REQUIRE(small_token.ok());

  auto spec = LayeredSpec(false);
  spec.add_layer_shares()->set_fd_token(*big_token);
  RequireError(table->Register(spec, session).status(), absl::StatusCode::kInvalidArgument,
               "spec.layer_shares: 1 shares for 2 layers");

  // Layer 1 is too small: layer 0's token is given back, so the same spec works once fixed.
  spec.add_layer_shares()->set_fd_token(*small_token);
  RequireError(table->Register(spec, session).status(), absl::StatusCode::kInvalidArgument,
               "spec.layer_shares[1]");
  auto third = session_table->AddFd(session, UniqueFd(::dup(big.get())));
  REQUIRE(third.ok());
  spec.mutable_layer_shares(1)->set_fd_token(*third);
  auto ok = table->Register(spec, session);
  INFO(ok.status().ToString());
  CHECK(ok.ok());

  auto with_share = LayeredSpec(false);
  with_share.mutable_share()->set_fd_token("t");
  with_share.add_layer_shares()->set_fd_token("t0");
  with_share.add_layer_shares()->set_fd_token("t1");
  RequireError(table->Register(with_share, session).status(), absl::StatusCode::kInvalidArgument,
               "spec.share");

  auto strided = LayeredSpec(false);
  strided.mutable_paged_kv()->set_layer_stride(kLayerBytes);
  strided.mutable_paged_kv()->set_part_stride(kLayerBytes / 2);
  strided.mutable_paged_kv()->set_block_stride(16 * 2 * 64 * 2);
  strided.mutable_paged_kv()->set_token_stride(2 * 64 * 2);
  strided.mutable_paged_kv()->set_head_stride(64 * 2);
  strided.add_layer_shares()->set_fd_token("t0");
  strided.add_layer_shares()->set_fd_token("t1");
  RequireError(table->Register(strided, session).status(), absl::StatusCode::kInvalidArgument,
               "layer_stride");

  auto by_name = LayeredSpec(false);
  by_name.add_layer_shares()->set_shm_name("/kvrail-x");
  by_name.add_layer_shares()->set_shm_name("/kvrail-y");
  RequireError(table->Register(by_name, session).status(), absl::StatusCode::kInvalidArgument,
               "spec.layer_shares[0]");

  auto bytes = LayeredSpec(false);
  bytes.mutable_bytes();
  bytes.add_layer_shares()->set_fd_token("t0");
  RequireError(table->Register(bytes, session).status(), absl::StatusCode::kInvalidArgument,
               "spec.layer_shares");

  // Another session's token is refused, naming the layer.
  const uint64_t other = session_table->BeginSession();
  auto foreign = session_table->AddFd(other, UniqueFd(::dup(big.get())));
  REQUIRE(foreign.ok());
  auto stolen = LayeredSpec(false);
  stolen.add_layer_shares()->set_fd_token(*foreign);
  stolen.add_layer_shares()->set_fd_token(*foreign);
  RequireError(table->Register(stolen, session).status(), absl::StatusCode::kPermissionDenied,
               "spec.layer_shares[0].fd_token");
}

}  // namespace
}  // namespace kvrail::regions

namespace kvrail::regions {
namespace {

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

TEST_CASE("a library region is recorded and limited: host bytes, <= 64 MiB, one per session") {
  RegionLimits limits;
  limits.max_regions_per_session = 2;
  Tables tables(limits);
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  UniqueFd fd = Memfd(1 << 20);
  auto Token = [&] {
    auto token = session_table->AddFd(session, UniqueFd(::dup(fd.get())));
    REQUIRE(token.ok());
    return *token;
  };
  // Each limit is refused naming the flag, and the token is not consumed by the refusal.
  const std::string token = Token();
  v1::RegionSpec spec = LibrarySpec(token, 1 << 20);
  RequireError(table->Register(spec, 0).status(), absl::StatusCode::kInvalidArgument,
               "spec.library_region: a library region belongs to a session");
  v1::RegionSpec cuda = spec;
  cuda.set_memory_kind(v1::MEMORY_KIND_CUDA);
  RequireError(table->Register(cuda, session).status(), absl::StatusCode::kInvalidArgument,
               "spec.library_region: a library region is host memory");
  v1::RegionSpec paged = PagedSpec(kPoolBytes, true);
  paged.mutable_share()->set_fd_token(token);
  paged.set_library_region(true);
  RequireError(table->Register(paged, session).status(), absl::StatusCode::kInvalidArgument,
               "spec.library_region: a library region is one allocation with a bytes layout");
  RequireError(table->Register(LibrarySpec(token, (uint64_t{64} << 20) + 1), session).status(),
               absl::StatusCode::kInvalidArgument, "spec.library_region: 67108865 bytes");
  // Within the limits it registers, and the flag is shown.
  auto first = table->Register(spec, session);
  REQUIRE(first.ok());
  auto listed = table->List();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].spec().library_region());
  // A second one in the same session is refused; another session may have its own.
  RequireError(table->Register(LibrarySpec(Token(), 4096), session).status(),
               absl::StatusCode::kAlreadyExists, "spec.library_region: the session already holds");
  const uint64_t other = session_table->BeginSession();
  auto other_token = session_table->AddFd(other, UniqueFd(::dup(fd.get())));
  REQUIRE(other_token.ok());
  CHECK(table->Register(LibrarySpec(*other_token, 4096), other).ok());
  // It still counts toward max_regions_per_session (2): one ordinary region fits, not two.
  v1::RegionSpec plain = LibrarySpec(Token(), 4096);
  plain.set_library_region(false);
  plain.set_name("client block tables");  // the name makes it nothing special
  REQUIRE(table->Register(plain, session).ok());
  plain.mutable_share()->set_fd_token(Token());
  RequireError(table->Register(plain, session).status(), absl::StatusCode::kResourceExhausted,
               "max_regions_per_session");
  // Unregistered, the session may register a library region again (the client's table grows).
  REQUIRE(table->Unregister((*first)->id()).ok());
  CHECK(table->Register(LibrarySpec(Token(), 1 << 20), session).ok());
}

}  // namespace
}  // namespace kvrail::regions

// Memory the daemon maps cannot kill it (docs/security.md, "Memory"), against a live kvraild:
// an shm object or unsealable memfd truncated by its owner under a registered region (the
// daemon survives, the transfer touching it fails naming the region, the region refuses further
// use, other transfers go on), a sealed host buffer the owner cannot truncate, shm names the
// daemon must not open (raw gRPC with the caller's session: '..', symbolic links), a sparse
// 2 GiB memfd that must not grow the daemon's RSS, and the per-uid region cap across sessions.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <string>

#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "tests/harness/proc_status.h"
#include "tests/integration/kv_fixture.h"
#include "wire/session_wire.h"

namespace kvrail::testing {
namespace {

v1::PagedKvLayout Small() {
  return MakeLayout(2, 2, 16, 16, 2, 8, v1::DTYPE_BF16, v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

uint64_t SmallBytes() {
  auto bytes = client::PagedLayoutBytes(Small());
  REQUIRE(bytes.ok());
  return *bytes;
}

// A POSIX shm object of the Small() layout, filled with 0x5a, registered by name through the
// client library (which opens it and passes the fd). Unlinked at the end.
struct ShmPool {
  std::string name;
  UniqueFd fd;
  v1::RegionInfo info;
  ShmPool(client::Client& c, const std::string& tag, bool writable) {
    name = "/kvrail-memtest-" + tag + "-" + std::to_string(::getpid());
    ::shm_unlink(name.c_str());
    fd.Reset(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
    REQUIRE(fd.valid());
    REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(SmallBytes())) == 0);
    void* view = ::mmap(nullptr, SmallBytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    REQUIRE(view != MAP_FAILED);
    std::memset(view, 0x5a, SmallBytes());
    ::munmap(view, SmallBytes());
    v1::RegionSpec spec;
    spec.set_name(tag);
    spec.set_writable(writable);
    *spec.mutable_paged_kv() = Small();
    spec.mutable_share()->set_shm_name(name);
    auto registered = c.RegisterRegion(spec);
    INFO(registered.status().ToString());
    REQUIRE(registered.ok());
    info = *registered;
  }
  ~ShmPool() { ::shm_unlink(name.c_str()); }
  uint64_t id() const { return info.region_id(); }
};

bool Alive(const DaemonProcess& d) { return ::kill(d.pid(), 0) == 0; }

v1::RegionInfo Listed(client::Client& c, uint64_t id) {
  auto list = c.ListRegions();
  REQUIRE(list.ok());
  for (const auto& r : list->regions()) {
    if (r.region_id() == id) return r;
  }
  FAIL("region " << id << " not listed");
  return {};
}

// The daemon keeps serving: a fresh pair of pools moves bytes, checked byte for byte.
void OthersStillMove(client::Client& c) {
  Pool a = MakePool(c, Small(), false, "after-a");
  Pool b = MakePool(c, Small(), true, "after-b");
  FillPool(a, 11, {0, 1, 2}, 3 * 16);
  const v1::TransferStatus s =
      RunToEnd(c, client::MakeBlockTransfer(a.id(), {0, 1, 2}, b.id(), {5, 6, 7}));
  CHECK(s.state() == v1::TRANSFER_STATE_SUCCEEDED);
  Expectation e{11, {5, 6, 7}, 3 * 16, 0, 0, 2, 0, 0, 2};
  CHECK(VerifyPool(b, e) == "");
}

TEST_CASE("an shm source truncated by its owner fails the transfer, not the daemon") {
  LiveDaemon live({"--tile-bytes", "4096"});
  ShmPool src(*live.client, "src", false);
  Pool dst = MakePool(*live.client, Small(), true, "dst");
  CHECK(!Listed(*live.client, src.id()).host_sealed());  // shm objects cannot be sealed
  // Before: the shm region moves like any other.
  v1::TransferStatus before =
      RunToEnd(*live.client, client::MakeBlockTransfer(src.id(), {1}, dst.id(), {2}));
  REQUIRE(before.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(CountWritten(dst) > 0);

  REQUIRE(::ftruncate(src.fd.get(), 0) == 0);  // the owner pulls the memory away
  v1::TransferStatus after =
      RunToEnd(*live.client, client::MakeBlockTransfer(src.id(), {3, 4}, dst.id(), {5, 6}));
  INFO(after.error_message());
  CHECK(after.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(after.error_code() == static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  CHECK(after.error_message().find("spec.src.region_id: region " + std::to_string(src.id())) !=
        std::string::npos);
  REQUIRE(Alive(live.daemon));
  CHECK(Listed(*live.client, src.id()).poisoned());

  // The region refuses further use, naming it; its owner may still unregister it.
  auto again = live.client->Submit(client::MakeBlockTransfer(src.id(), {1}, dst.id(), {2}));
  REQUIRE(!again.ok());
  CHECK(again.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(again.status().message()).find("poisoned") != std::string::npos);
  OthersStillMove(*live.client);
  CHECK(live.client->UnregisterRegion(src.id()).ok());
  REQUIRE(Alive(live.daemon));
}  // ~LiveDaemon: kvraild exits 0 on SIGTERM

TEST_CASE("a destination truncated by its owner: the transfer fails, nothing grows") {
  LiveDaemon live;
  Pool src = MakePool(*live.client, Small(), false, "src");
  ShmPool dst(*live.client, "dst", true);
  REQUIRE(::ftruncate(dst.fd.get(), 4096) == 0);
  v1::TransferStatus s = RunToEnd(
      *live.client, client::MakeBlockTransfer(src.id(), {0, 1, 2, 3}, dst.id(), {12, 13, 14, 15}));
  INFO(s.error_message());
  CHECK(s.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(s.error_message().find("spec.dst.region_id: region " + std::to_string(dst.id())) !=
        std::string::npos);
  struct stat st;
  REQUIRE(::fstat(dst.fd.get(), &st) == 0);
  CHECK(st.st_size == 4096);
  REQUIRE(Alive(live.daemon));
  OthersStillMove(*live.client);
}

TEST_CASE("an unsealable memfd passed by fd is guarded; a sealed host buffer cannot shrink") {
  LiveDaemon live;
  UniqueFd plain(::memfd_create("memtest-plain", MFD_CLOEXEC));  // no MFD_ALLOW_SEALING
  REQUIRE(plain.valid());
  REQUIRE(::ftruncate(plain.get(), static_cast<off_t>(SmallBytes())) == 0);
  auto token = live.client->ShareFd(plain.get());
  REQUIRE(token.ok());
  v1::RegionSpec spec;
  spec.set_name("plain");
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.set_size_bytes(SmallBytes());
  *spec.mutable_paged_kv() = Small();
  spec.mutable_share()->set_fd_token(*token);
  auto plain_region = live.client->RegisterRegion(spec);
  REQUIRE(plain_region.ok());
  CHECK(!plain_region->host_sealed());
  Pool dst = MakePool(*live.client, Small(), true, "dst");
  REQUIRE(::ftruncate(plain.get(), 0) == 0);
  v1::TransferStatus s = RunToEnd(
      *live.client, client::MakeBlockTransfer(plain_region->region_id(), {0}, dst.id(), {1}));
  CHECK(s.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(s.error_message().find("poisoned") != std::string::npos);
  REQUIRE(Alive(live.daemon));

  // The library's host buffers are sealable memfds: sealed, the owner cannot truncate them.
  Pool sealed = MakePool(*live.client, Small(), false, "sealed");
  CHECK(sealed.info.host_sealed());
  CHECK(::ftruncate(sealed.buffer->fd(), 0) != 0);
  CHECK(errno == EPERM);
}

TEST_CASE("shm names kvraild must not open: '..', other components, symbolic links") {
  LiveDaemon live;
  auto session = wire::SessionConnection::Open(wire::SessionSocketPath(live.daemon.socket()));
  REQUIRE(session.ok());
  auto stub = v1::Transfer::NewStub(
      grpc::CreateChannel("unix:" + live.daemon.socket(), grpc::InsecureChannelCredentials()));
  auto try_name = [&](const std::string& name, grpc::StatusCode code, const std::string& text) {
    v1::RegisterRegionRequest request;
    request.set_session_id((*session)->session_id());
    v1::RegionSpec* spec = request.mutable_spec();
    spec->set_memory_kind(v1::MEMORY_KIND_HOST);
    spec->set_size_bytes(16);
    spec->mutable_bytes();
    spec->mutable_share()->set_shm_name(name);
    grpc::ClientContext context;
    context.AddMetadata(wire::kSessionMetadataKey,
                        wire::SessionMetadataValue((*session)->session_id(), (*session)->secret()));
    v1::RegisterRegionResponse response;
    const grpc::Status s = stub->RegisterRegion(&context, request, &response);
    INFO(name << ": " << s.error_message());
    CHECK(s.error_code() == code);
    CHECK(s.error_message().find(text) != std::string::npos);
  };
  for (const char* bad : {"/..", "/.", "/../etc/passwd", "/a/b", "//x"}) {
    try_name(bad, grpc::StatusCode::INVALID_ARGUMENT, "spec.share.shm_name");
  }
  const std::string link = "/kvrail-memtest-link-" + std::to_string(::getpid());
  ::unlink(("/dev/shm" + link).c_str());
  REQUIRE(::symlink("/etc/passwd", ("/dev/shm" + link).c_str()) == 0);
  try_name(link, grpc::StatusCode::PERMISSION_DENIED, "symbolic link");
  ::unlink(("/dev/shm" + link).c_str());
  // The caller's own object by name is fine (the uid check against another uid's object is in
  // daemon/regions:host_memory_test: a sandbox cannot chown to another uid).
  const std::string own = "/kvrail-memtest-own-" + std::to_string(::getpid());
  UniqueFd fd(::shm_open(own.c_str(), O_CREAT | O_RDWR, 0600));
  REQUIRE(fd.valid());
  REQUIRE(::ftruncate(fd.get(), 4096) == 0);
  try_name(own, grpc::StatusCode::OK, "");
  ::shm_unlink(own.c_str());
  REQUIRE(Alive(live.daemon));
}

TEST_CASE("a sparse 2 GiB memfd does not grow the daemon's resident set") {
  LiveDaemon live;
  constexpr uint64_t kSparse = uint64_t{2} << 30;
  auto buffer = live.client->CreateHostBuffer(kSparse);  // a memfd; nothing written
  REQUIRE(buffer.ok());
  const uint64_t before = ProcStatusField(live.daemon.pid(), "VmRSS");
  v1::RegionSpec spec;
  spec.set_name("sparse");
  auto info = live.client->RegisterHostBuffer(**buffer, spec);
  REQUIRE(info.ok());
  const uint64_t after = ProcStatusField(live.daemon.pid(), "VmRSS");
  INFO("kvraild VmRSS " << before << " KiB -> " << after << " KiB");
  CHECK(before > 0);
  CHECK(after < before + 64 * 1024);  // MAP_POPULATE committed all 2 GiB here
}

TEST_CASE("max_regions_per_uid holds across one uid's sessions, naming the cap") {
  TempDir config_dir;
  const std::string config = config_dir.path() + "/kvraild.textproto";
  {
    std::ofstream out(config);
    out << "max_regions_per_uid: 3\n";
  }
  LiveDaemon live({"--config", config});
  auto second = client::Client::Connect(live.daemon.socket());
  REQUIRE(second.ok());
  Pool a = MakePool(*live.client, Small(), false, "a");
  Pool b = MakePool(*live.client, Small(), false, "b");
  Pool c = MakePool(**second, Small(), false, "c");
  auto buffer = (*second)->CreateHostBuffer(SmallBytes());
  REQUIRE(buffer.ok());
  v1::RegionSpec spec;
  *spec.mutable_paged_kv() = Small();
  auto refused = (*second)->RegisterHostBuffer(**buffer, spec);
  REQUIRE(!refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(refused.status().message()).find("max_regions_per_uid") != std::string::npos);
  // Unregistering gives the cap back.
  REQUIRE(live.client->UnregisterRegion(a.id()).ok());
  CHECK((*second)->RegisterHostBuffer(**buffer, spec).ok());
}

}  // namespace
}  // namespace kvrail::testing

// The memory rules (docs/security.md, "Memory"), each tried from the wrong side: a truncated
// shm object or memfd under a registered mapping (the process survives, the region is
// poisoned), a SIGBUS outside every guarded mapping (still kills), hugetlbfs and non-tmpfs fds,
// shm names of another uid, with too little permission, through a symbolic link or with '..',
// a sparse memfd (not committed at registration), a small region pre-faulted at registration
// (its holes left alone), and the per-uid and daemon-wide caps.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "base/clock.h"
#include "daemon/regions/regions.h"
#include "daemon/regions/sigbus_guard.h"
#include "daemon/regions/test_tables.h"

namespace kvrail::regions {
namespace {

using testing::Tables;

constexpr uint64_t kBytes = 1 << 20;

UniqueFd Memfd(size_t bytes, unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING) {
  UniqueFd fd(::memfd_create("host_memory_test", flags));
  REQUIRE(fd.valid());
  REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(bytes)) == 0);
  return fd;
}

// A POSIX shm object of `bytes` (unlinked when the returned guard goes).
struct Shm {
  std::string name;
  UniqueFd fd;
  Shm(const std::string& tag, size_t bytes, mode_t mode = 0600) {
    name = "/kvrail-hm-" + tag + "-" + std::to_string(::getpid());
    ::shm_unlink(name.c_str());
    fd.Reset(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, mode));
    REQUIRE(fd.valid());
    REQUIRE(::fchmod(fd.get(), mode) == 0);  // umask aside
    REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(bytes)) == 0);
  }
  ~Shm() { ::shm_unlink(name.c_str()); }
};

v1::RegionSpec BytesSpec(uint64_t size, bool writable) {
  v1::RegionSpec spec;
  spec.set_name("host-memory");
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.set_size_bytes(size);
  spec.set_writable(writable);
  spec.mutable_bytes();
  return spec;
}

void RequireError(const absl::Status& s, absl::StatusCode code, const std::string& text) {
  INFO(s.ToString());
  REQUIRE(!s.ok());
  CHECK(s.code() == code);
  CHECK(std::string(s.message()).find(text) != std::string::npos);
}

absl::StatusOr<std::shared_ptr<Region>> RegisterFd(Tables& tables, uint64_t session, int fd,
                                                   uint64_t size, bool writable) {
  auto token = tables.sessions->AddFd(session, UniqueFd(::dup(fd)));
  if (!token.ok()) return token.status();
  auto spec = BytesSpec(size, writable);
  spec.mutable_share()->set_fd_token(*token);
  return tables.regions->Register(spec, session);
}

TEST_CASE("sealable memfds are sealed; shm objects and unsealable memfds are guarded") {
  Tables tables;
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  UniqueFd sealable = Memfd(kBytes);
  auto sealed = RegisterFd(tables, session, sealable.get(), kBytes, true);
  REQUIRE(sealed.ok());
  CHECK((*sealed)->Info().host_sealed());
  CHECK(::ftruncate(sealable.get(), 0) != 0);  // the owner cannot shrink it any more

  UniqueFd plain = Memfd(kBytes, MFD_CLOEXEC);  // no MFD_ALLOW_SEALING
  auto guarded = RegisterFd(tables, session, plain.get(), kBytes, true);
  REQUIRE(guarded.ok());
  CHECK(!(*guarded)->Info().host_sealed());
  CHECK(!(*guarded)->Info().poisoned());
  CHECK((*guarded)->Health("spec.src").ok());

  Shm shm("guarded", kBytes);
  auto shm_region = RegisterFd(tables, session, shm.fd.get(), kBytes, false);
  REQUIRE(shm_region.ok());
  CHECK(!(*shm_region)->Info().host_sealed());
}

TEST_CASE("a truncated shm object poisons its region; the process survives and reads zeros") {
  Tables tables;
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  Shm victim("victim", kBytes);
  Shm bystander("bystander", kBytes);
  {
    void* view = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, victim.fd.get(), 0);
    REQUIRE(view != MAP_FAILED);
    std::memset(view, 0x5a, kBytes);
    ::munmap(view, kBytes);
  }
  auto src = RegisterFd(tables, session, victim.fd.get(), kBytes, false);
  auto other = RegisterFd(tables, session, bystander.fd.get(), kBytes, true);
  REQUIRE(src.ok());
  REQUIRE(other.ok());
  std::vector<uint8_t> copy(kBytes);
  std::memcpy(copy.data(), (*src)->data(), kBytes);  // before: the owner's bytes
  CHECK(copy[kBytes - 1] == 0x5a);

  const uint64_t faults = SigbusGuard::FaultsCaught();
  REQUIRE(::ftruncate(victim.fd.get(), 0) == 0);     // the owner pulls the memory away
  std::memcpy(copy.data(), (*src)->data(), kBytes);  // SIGBUS without the guard
  CHECK(SigbusGuard::FaultsCaught() == faults + 1);  // one fault for the whole mapping
  CHECK(copy[0] == 0);
  CHECK(copy[kBytes - 1] == 0);
  CHECK((*src)->Info().poisoned());
  RequireError((*src)->Health("spec.src"), absl::StatusCode::kFailedPrecondition,
               "spec.src.region_id: region " + std::to_string((*src)->id()));
  // The region refuses further use; the owner may still unregister it.
  RequireError(table->Get((*src)->id()).status(), absl::StatusCode::kFailedPrecondition,
               "poisoned");
  // Other regions carry on.
  CHECK((*other)->Health("spec.dst").ok());
  std::memset((*other)->data(), 7, kBytes);
  CHECK(table->Get((*other)->id()).ok());
  CHECK(table->Unregister((*src)->id()).ok());
}

TEST_CASE("a truncated destination is poisoned too: writes land on zero pages") {
  Tables tables;
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  UniqueFd plain = Memfd(kBytes, MFD_CLOEXEC);  // unsealable memfd
  auto dst = RegisterFd(tables, session, plain.get(), kBytes, true);
  REQUIRE(dst.ok());
  REQUIRE(::ftruncate(plain.get(), 4096) == 0);  // shrink below the region
  std::memset((*dst)->data(), 0x11, kBytes);     // SIGBUS past 4 KiB without the guard
  CHECK((*dst)->Info().poisoned());
  RequireError((*dst)->Health("spec.dst"), absl::StatusCode::kFailedPrecondition,
               "spec.dst.region_id");
  // The daemon's writes past the end went to its zero pages: the owner's object did not grow.
  struct stat st;
  REQUIRE(::fstat(plain.get(), &st) == 0);
  CHECK(st.st_size == 4096);
}

TEST_CASE("a per-layer region is poisoned when any layer faults") {
  Tables tables;
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  v1::RegionSpec spec;
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  auto* l = spec.mutable_paged_kv();
  l->set_num_layers(2);
  l->set_num_parts(2);
  l->set_num_blocks(8);
  l->set_tokens_per_block(16);
  l->set_num_heads(2);
  l->set_head_dim(64);
  l->set_dtype(v1::DTYPE_BF16);
  l->set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const uint64_t layer_bytes = 2 * 8 * 16 * 2 * 64 * 2;
  spec.set_size_bytes(layer_bytes);
  Shm a("layer-a", layer_bytes);
  Shm b("layer-b", layer_bytes);
  for (const Shm* shm : {&a, &b}) {
    auto token = session_table->AddFd(session, UniqueFd(::dup(shm->fd.get())));
    REQUIRE(token.ok());
    spec.add_layer_shares()->set_fd_token(*token);
  }
  auto region = table->Register(spec, session);
  REQUIRE(region.ok());
  CHECK(!(*region)->Info().host_sealed());
  CHECK((*region)->Health("spec.src").ok());
  REQUIRE(::ftruncate(b.fd.get(), 0) == 0);
  const uint8_t* layer1 = reinterpret_cast<const uint8_t*>((*(*region)->view().layer_bases)[1]);
  volatile uint8_t sink = layer1[100];  // SIGBUS without the guard
  (void)sink;
  CHECK((*region)->Info().poisoned());
  RequireError((*region)->Health("spec.src"), absl::StatusCode::kFailedPrecondition, "poisoned");
}

TEST_CASE("a SIGBUS outside every guarded mapping still kills the process") {
  Tables tables;
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  UniqueFd guarded = Memfd(kBytes, MFD_CLOEXEC);
  REQUIRE(RegisterFd(tables, session, guarded.get(), kBytes, false).ok());  // handler installed
  UniqueFd loose = Memfd(kBytes, MFD_CLOEXEC);
  void* view = ::mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, loose.get(), 0);
  REQUIRE(view != MAP_FAILED);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (::ftruncate(loose.get(), 0) != 0) ::_exit(3);
    volatile uint8_t sink = static_cast<const uint8_t*>(view)[kBytes / 2];
    (void)sink;
    ::_exit(0);  // not reached
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGBUS);
  ::munmap(view, kBytes);
}

TEST_CASE("hugetlbfs, disk files and other fds are refused, naming the field") {
  Tables tables;
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  UniqueFd huge(
      ::memfd_create("host_memory_test_huge", MFD_CLOEXEC | MFD_HUGETLB | MFD_ALLOW_SEALING));
  if (!huge.valid()) {
    WARN("memfd_create(MFD_HUGETLB) is not available here (" << std::strerror(errno)
                                                             << "): hugetlbfs refusal not tried");
  } else {
    const long huge_page = 2 << 20;
    if (::ftruncate(huge.get(), huge_page) != 0) {
      WARN("ftruncate on a hugetlbfs memfd failed (" << std::strerror(errno) << "): not tried");
    } else {
      RequireError(RegisterFd(tables, session, huge.get(), huge_page, true).status(),
                   absl::StatusCode::kFailedPrecondition, "spec.share.fd_token: hugetlbfs");
    }
  }
  // A file on disk (this test's own binary): it could shrink or fail I/O under the daemon.
  UniqueFd disk(::open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
  REQUIRE(disk.valid());
  RequireError(RegisterFd(tables, session, disk.get(), 4096, false).status(),
               absl::StatusCode::kFailedPrecondition, "not shared memory");
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  RequireError(RegisterFd(tables, session, read_end.get(), 4096, false).status(),
               absl::StatusCode::kFailedPrecondition, "not a regular file");
  CHECK(table->size() == 0);
}

// Resident set of this process in KiB (VmRSS counts mapped shmem pages too).
uint64_t RssKib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

// Pages of [data, data + bytes) resident in the shared object (mincore).
size_t PagesInCore(uint8_t* data, size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((bytes + page - 1) / page);
  REQUIRE(::mincore(data, bytes, resident.data()) == 0);
  size_t in_core = 0;
  for (unsigned char r : resident) in_core += r & 1;
  return in_core;
}

TEST_CASE("a sparse memfd is not committed at registration") {
  constexpr uint64_t kSparse = uint64_t{1} << 30;
  Tables tables;
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  UniqueFd sparse = Memfd(kSparse);
  const uint64_t before = RssKib();
  auto region = RegisterFd(tables, session, sparse.get(), kSparse, true);
  REQUIRE(region.ok());
  const uint64_t after = RssKib();
  INFO("VmRSS " << before << " KiB -> " << after << " KiB");
  CHECK(after < before + 64 * 1024);  // MAP_POPULATE committed the whole GiB
  // No page of the mapping is resident (mincore).
  CHECK(PagesInCore((*region)->data(), kSparse) == 0);
  // A transfer touching one page commits one page.
  (*region)->data()[12345] = 1;
  CHECK(PagesInCore((*region)->data(), kSparse) == 1);
}

// Minor page faults of the calling thread so far.
long MinorFaults() {
  struct rusage usage {};
  REQUIRE(::getrusage(RUSAGE_THREAD, &usage) == 0);
  return usage.ru_minflt;
}

TEST_CASE("a small region's pages are mapped at registration; its holes stay holes") {
  Tables tables;
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  // What the client library does with its block-table region: every page written first.
  UniqueFd written = Memfd(kBytes);
  {
    void* client = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, written.get(), 0);
    REQUIRE(client != MAP_FAILED);
    std::memset(client, 7, kBytes);
    ::munmap(client, kBytes);
  }
  auto region = RegisterFd(tables, session, written.get(), kBytes, false);
  REQUIRE(region.ok());
  // Reading every page (what a submit's accept does with its ids) faults no more.
  const long before = MinorFaults();
  uint64_t sum = 0;
  for (size_t off = 0; off < kBytes; off += page) sum += (*region)->data()[off];
  const long faults = MinorFaults() - before;
  INFO(faults << " minor faults reading " << kBytes / page << " pages after registration");
  CHECK(sum == 7 * (kBytes / page));
  // Without the pre-fault: one per 16 pages (the kernel maps 64 KiB around each fault), 17 here.
  CHECK(faults < 4);
  // A memfd nobody wrote: registering it commits nothing.
  UniqueFd sparse = Memfd(kBytes);
  auto empty = RegisterFd(tables, session, sparse.get(), kBytes, true);
  REQUIRE(empty.ok());
  CHECK(PagesInCore((*empty)->data(), kBytes) == 0);
}

}  // namespace
}  // namespace kvrail::regions

namespace kvrail::regions {
namespace {

v1::RegionSpec ShmSpec(const std::string& name, uint64_t size, bool writable) {
  v1::RegionSpec spec = BytesSpec(size, writable);
  spec.mutable_share()->set_shm_name(name);
  return spec;
}

TEST_CASE("shm names: strictly one component, opened only for a caller that owns the object") {
  Tables tables;
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  const uint32_t me = static_cast<uint32_t>(::geteuid());

  // Names that could leave /dev/shm, or are not names at all.
  for (const char* bad :
       {"/..", "/.", "/", "no-slash", "/a/b", "/../etc/passwd", "//x", "/x y", "/x\n"}) {
    INFO(bad);
    RequireError(table->Register(ShmSpec(bad, 4096, false), session).status(),
                 absl::StatusCode::kInvalidArgument, "spec.share.shm_name");
  }
  Shm mine("mine", kBytes);
  // A session whose uid the daemon does not know (no SO_PEERCRED) gets nothing by name.
  RequireError(table->Register(ShmSpec(mine.name, kBytes, false), session).status(),
               absl::StatusCode::kPermissionDenied, "SO_PEERCRED");
  session_table->SetSessionPeer(session, me);
  auto ok = table->Register(ShmSpec(mine.name, kBytes, true), session);
  REQUIRE(ok.ok());
  CHECK(!(*ok)->Info().host_sealed());

  // Read-only for its owner: not mappable for writing by name (the daemon's rights do not count).
  Shm read_only("ro", kBytes, 0400);
  RequireError(table->Register(ShmSpec(read_only.name, kBytes, true), session).status(),
               absl::StatusCode::kPermissionDenied, "spec.share.shm_name");
  CHECK(table->Register(ShmSpec(read_only.name, kBytes, false), session).ok());

  // A symbolic link in /dev/shm, to an object the caller owns and to a file it does not.
  const std::string link = "/kvrail-hm-link-" + std::to_string(::getpid());
  ::unlink(("/dev/shm" + link).c_str());
  REQUIRE(::symlink(("/dev/shm" + mine.name).c_str(), ("/dev/shm" + link).c_str()) == 0);
  RequireError(table->Register(ShmSpec(link, kBytes, false), session).status(),
               absl::StatusCode::kPermissionDenied, "symbolic link");
  ::unlink(("/dev/shm" + link).c_str());
  REQUIRE(::symlink("/etc/passwd", ("/dev/shm" + link).c_str()) == 0);
  RequireError(table->Register(ShmSpec(link, 16, false), session).status(),
               absl::StatusCode::kPermissionDenied, "spec.share.shm_name");
  ::unlink(("/dev/shm" + link).c_str());

  // Another uid's 0600 object: kvraild can open it (it runs as the object's owner here, as a
  // root daemon could in production), a caller of another uid may not, read or write. (The
  // caller's uid is what SO_PEERCRED reported for its session; no chown needed, so this runs
  // in a sandbox's user namespace too.)
  const uint32_t stranger_uid = me + 4321;
  const uint64_t stranger = session_table->BeginSession();
  session_table->SetSessionPeer(stranger, stranger_uid);
  for (bool writable : {false, true}) {
    RequireError(table->Register(ShmSpec(mine.name, kBytes, writable), stranger).status(),
                 absl::StatusCode::kPermissionDenied,
                 "the caller (uid " + std::to_string(stranger_uid) + ") owns");
  }
  CHECK(table->size() == 2);  // the owner's two registrations above, nothing of the stranger's
}

}  // namespace
}  // namespace kvrail::regions

namespace kvrail::regions {
namespace {

TEST_CASE("caps: regions per session, mappings and host bytes per uid, mappings in all") {
  RegionLimits limits;
  limits.max_regions_per_session = 3;
  limits.max_regions_per_uid = 4;
  limits.max_mapped_bytes_per_uid = 5 * kBytes;
  limits.max_region_mappings = 6;
  Tables tables(limits);
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  UniqueFd fd = Memfd(8 * kBytes);
  const uint64_t a1 = session_table->BeginSession();
  const uint64_t a2 = session_table->BeginSession();
  const uint64_t b = session_table->BeginSession();
  session_table->SetSessionPeer(a1, 1000);
  session_table->SetSessionPeer(a2, 1000);
  session_table->SetSessionPeer(b, 2000);

  std::vector<std::shared_ptr<Region>> held;
  for (int i = 0; i < 3; ++i) {
    auto r = RegisterFd(tables, a1, fd.get(), kBytes, false);
    REQUIRE(r.ok());
    held.push_back(*r);
  }
  RequireError(RegisterFd(tables, a1, fd.get(), kBytes, false).status(),
               absl::StatusCode::kResourceExhausted, "max_regions_per_session");
  // The uid's second session: one more mapping, then the uid's cap.
  auto fourth = RegisterFd(tables, a2, fd.get(), kBytes, false);
  REQUIRE(fourth.ok());
  RequireError(RegisterFd(tables, a2, fd.get(), kBytes, false).status(),
               absl::StatusCode::kResourceExhausted, "max_regions_per_uid: uid 1000 holds 4");
  // Another uid is not starved by uid 1000, until the daemon-wide cap.
  auto b1 = RegisterFd(tables, b, fd.get(), kBytes, false);
  REQUIRE(b1.ok());
  // Bytes: uid 2000 has 1 MiB of 5 mapped.
  RequireError(RegisterFd(tables, b, fd.get(), 5 * kBytes, false).status(),
               absl::StatusCode::kResourceExhausted, "max_mapped_bytes_per_uid: uid 2000");
  auto b2 = RegisterFd(tables, b, fd.get(), kBytes, false);
  REQUIRE(b2.ok());
  RequireError(RegisterFd(tables, b, fd.get(), kBytes, false).status(),
               absl::StatusCode::kResourceExhausted, "max_region_mappings");
  CHECK(table->size() == 6);

  // A region unregistered while a transfer still holds it keeps its mapping, so it still counts.
  std::shared_ptr<Region> in_use = *fourth;
  REQUIRE(table->Unregister(in_use->id()).ok());
  fourth = absl::NotFoundError("moved");
  RequireError(RegisterFd(tables, a2, fd.get(), kBytes, false).status(),
               absl::StatusCode::kResourceExhausted, "max_region");
  in_use.reset();  // the transfer ends: the mapping goes
  CHECK(RegisterFd(tables, a2, fd.get(), kBytes, false).ok());

  // Ending a session gives its caps back.
  held.clear();
  session_table->EndSession(a1);
  const uint64_t a3 = session_table->BeginSession();
  session_table->SetSessionPeer(a3, 1000);
  CHECK(RegisterFd(tables, a3, fd.get(), kBytes, false).ok());
}

TEST_CASE("a per-layer region counts one mapping per layer; sizes cannot overflow the caps") {
  RegionLimits limits;
  limits.max_regions_per_uid = 3;
  Tables tables(limits);
  RegionTable* table = tables.regions.get();
  ::kvrail::sessions::SessionTable* session_table = tables.sessions.get();
  const uint64_t session = session_table->BeginSession();
  v1::RegionSpec spec;
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.mutable_paged_kv()->set_num_layers(4);
  for (int i = 0; i < 4; ++i) spec.add_layer_shares()->set_fd_token("t");
  spec.set_size_bytes(4096);
  RequireError(table->Register(spec, session).status(), absl::StatusCode::kResourceExhausted,
               "max_regions_per_uid");
  v1::RegionSpec huge = BytesSpec(UINT64_MAX, false);
  huge.mutable_share()->set_fd_token("t");
  RequireError(table->Register(huge, session).status(), absl::StatusCode::kResourceExhausted,
               "max_mapped_bytes_per_uid");
}

}  // namespace
}  // namespace kvrail::regions

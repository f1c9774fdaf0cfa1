#include "plugins/nixl/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "catch2/catch.hpp"

namespace kvrail::nixl {
namespace {

TEST_CASE("a memfd mapping is found with its offset, and the fd reads the same bytes") {
  const int fd = memfd_create("host_memory_test", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  REQUIRE(ftruncate(fd, 4 * page) == 0);
  auto* base =
      static_cast<uint8_t*>(mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  REQUIRE(base != MAP_FAILED);
  memset(base + page + 100, 0x5a, 64);
  auto backing = FindSharedBacking(reinterpret_cast<uintptr_t>(base + page + 100), 64);
  REQUIRE(backing.ok());
  CHECK(backing->offset == page + 100);
  uint8_t read_back[64] = {};
  REQUIRE(pread(backing->fd.get(), read_back, 64, static_cast<off_t>(backing->offset)) == 64);
  CHECK(read_back[0] == 0x5a);
  CHECK(read_back[63] == 0x5a);
  // The whole mapping is found too.
  CHECK(FindSharedBacking(reinterpret_cast<uintptr_t>(base), 4 * page).ok());
  // A range running past the mapping is refused.
  auto past = FindSharedBacking(reinterpret_cast<uintptr_t>(base + 3 * page), 2 * page);
  CHECK(!past.ok());
  munmap(base, 4 * page);
  close(fd);
}

TEST_CASE("private anonymous memory is refused, naming addr and what to use instead") {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* anon = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(anon != MAP_FAILED);
  auto backing = FindSharedBacking(reinterpret_cast<uintptr_t>(anon), page);
  REQUIRE(!backing.ok());
  CHECK(backing.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(backing.status().message());
  CHECK(message.find("addr:") == 0);
  CHECK(message.find("share_memory_()") != std::string::npos);
  munmap(anon, page);
}

TEST_CASE("zero bytes and unmapped memory are refused") {
  CHECK(FindSharedBacking(0x1000, 0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(!FindSharedBacking(0x1000, 16).ok());
}

}  // namespace
}  // namespace kvrail::nixl

#include "plugins/nixl/host_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvrail::nixl {
namespace {

struct Mapping {
  uintptr_t start = 0, end = 0;
  bool shared = false;
  uint64_t offset = 0;
  unsigned dev_major = 0, dev_minor = 0;
  uint64_t inode = 0;
  std::string path;
};

bool ParseLine(const std::string& line, Mapping& m) {
  char perms[8] = {};
  unsigned long long start = 0, end = 0, offset = 0, inode = 0;
  int path_at = 0;
  if (sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu %n", &start, &end, perms, &offset,
             &m.dev_major, &m.dev_minor, &inode, &path_at) < 7) {
    return false;
  }
  m.start = start;
  m.end = end;
  m.shared = perms[3] == 's';
  m.offset = offset;
  m.inode = inode;
  m.path = path_at > 0 && static_cast<size_t>(path_at) <= line.size() ? line.substr(path_at) : "";
  return true;
}

bool SameFile(int fd, const Mapping& m) {
  struct stat st;
  return fstat(fd, &st) == 0 && st.st_ino == m.inode && major(st.st_dev) == m.dev_major &&
         minor(st.st_dev) == m.dev_minor;
}

UniqueFd OpenFromFdTable(const Mapping& m) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return UniqueFd();
  UniqueFd found;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const std::string link = absl::StrCat("/proc/self/fd/", entry->d_name);
    UniqueFd fd(open(link.c_str(), O_RDWR | O_CLOEXEC));
    if (fd.valid() && SameFile(fd.get(), m)) {
      found = std::move(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

}  // namespace

absl::StatusOr<SharedBacking> FindSharedBacking(uintptr_t addr, uint64_t len) {
  if (len == 0) return absl::InvalidArgumentError("len: 0 bytes");
  std::ifstream maps("/proc/self/maps");
  if (!maps) return absl::InternalError("cannot read /proc/self/maps");
  const uintptr_t last = addr + len;
  std::vector<Mapping> covering;
  std::string line;
  while (std::getline(maps, line)) {
    Mapping m;
    if (!ParseLine(line, m) || m.end <= addr || m.start >= last) continue;
    covering.push_back(std::move(m));
  }
  const std::string where = absl::StrFormat("addr: host memory [0x%x, 0x%x)", addr, last);
  if (covering.empty() || covering.front().start > addr || covering.back().end < last) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is not mapped in this process"));
  }
  const Mapping& first = covering.front();
  for (size_t i = 0; i < covering.size(); ++i) {
    const Mapping& m = covering[i];
    if (!m.shared || m.inode == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " is private or anonymous memory (", m.path.empty() ? "anonymous" : m.path,
          "), which kvraild cannot map; allocate it shared: a torch tensor after share_memory_(), "
          "numpy over multiprocessing.shared_memory, a memfd or /dev/shm mapping (MAP_SHARED)"));
    }
    const bool continues =
        m.inode == first.inode && m.dev_major == first.dev_major &&
        m.dev_minor == first.dev_minor &&
        (i == 0 ||
         (m.start == covering[i - 1].end &&
          m.offset == covering[i - 1].offset + (covering[i - 1].end - covering[i - 1].start)));
    if (!continues) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " spans several mappings that are not one contiguous file range"));
    }
  }
  SharedBacking backing;
  backing.offset = first.offset + (addr - first.start);
  backing.path = first.path;
  const std::string deleted = " (deleted)";
  if (!first.path.empty() && first.path[0] == '/' && !absl::EndsWith(first.path, deleted) &&
      !absl::StartsWith(first.path, "/memfd:")) {
    UniqueFd fd(open(first.path.c_str(), O_RDWR | O_CLOEXEC));
    if (fd.valid() && SameFile(fd.get(), first)) backing.fd = std::move(fd);
  }
  if (!backing.fd.valid()) backing.fd = OpenFromFdTable(first);
  if (!backing.fd.valid()) {
    const std::string link = absl::StrFormat("/proc/self/map_files/%x-%x", first.start, first.end);
    UniqueFd fd(open(link.c_str(), O_RDWR | O_CLOEXEC));
    if (fd.valid() && SameFile(fd.get(), first)) backing.fd = std::move(fd);
  }
  if (!backing.fd.valid()) {
    return absl::NotFoundError(absl::StrCat(
        where, " is backed by ", first.path,
        ", but no descriptor of it can be opened (keep its fd open, or give it a path)"));
  }
  return backing;
}

}  // namespace kvrail::nixl

#include "daemon/regions/host_mapping.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvrail::regions {

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

// Maps [offset, offset + size) of `fd` (file size checked first), read-only unless writable.
absl::StatusOr<std::pair<std::unique_ptr<Mapping>, uint8_t*>> MapFd(int fd, uint64_t offset,
                                                                    uint64_t size, bool writable,
                                                                    const char* field) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": fstat failed: ", ErrnoText(errno)));
  }
  if (offset > static_cast<uint64_t>(st.st_size) ||
      size > static_cast<uint64_t>(st.st_size) - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.size_bytes: region [", offset, ", ", offset + size, ") does not fit the shared object of ",
        st.st_size, " bytes"));
  }
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t aligned = offset - offset % page;
  const size_t length = size + (offset - aligned);
  // MAP_POPULATE: fault the pages in at registration, so the first transfer does not pay for
  // page-table set-up on the hot path.
  void* base = ::mmap(nullptr, length, PROT_READ | (writable ? PROT_WRITE : 0),
                      MAP_SHARED | MAP_POPULATE, fd, static_cast<off_t>(aligned));
  if (base == MAP_FAILED) {
    const int err = errno;
    if (err == EACCES && writable) {
      return absl::PermissionDeniedError(absl::StrCat(
          "spec.writable: the shared object cannot be mapped for writing: ", ErrnoText(err)));
    }
    return absl::InternalError(absl::StrCat(field, ": mmap failed: ", ErrnoText(err)));
  }
  auto mapping = std::make_unique<Mapping>(base, length);
  uint8_t* data = mapping->at(offset - aligned);
  return std::make_pair(std::move(mapping), data);
}

}  // namespace kvrail::regions

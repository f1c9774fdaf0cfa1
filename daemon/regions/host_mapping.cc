#include "daemon/regions/host_mapping.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvrail::regions {

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

namespace {

// Only tmpfs memory (memfds, /dev/shm objects): a file on disk can shrink or fail I/O under the
// daemon, a device fd maps whatever its driver maps, and hugetlbfs fails a hole punched into it
// (allowed even under F_SEAL_SHRINK) at the next access with SIGBUS, in huge pages the guard
// cannot replace page by page.
absl::Status CheckKind(int fd, const char* field) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": fstat failed: ", ErrnoText(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": not a memfd or POSIX shared memory object (not a regular file)"));
  }
  struct statfs fs;
  if (::fstatfs(fd, &fs) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": fstatfs failed: ", ErrnoText(errno)));
  }
  if (static_cast<unsigned long>(fs.f_type) == HUGETLBFS_MAGIC) {
    return absl::FailedPreconditionError(absl::StrCat(
        field,
        ": hugetlbfs memory (MFD_HUGETLB, /dev/hugepages) is refused: a hole punched into "
        "it would fault under kvraild even when sealed; use a plain memfd or shm object"));
  }
  if (static_cast<unsigned long>(fs.f_type) != TMPFS_MAGIC) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": the fd is a file on a file system of type 0x", absl::Hex(fs.f_type),
                     ", not shared memory; pass a memfd or a /dev/shm object"));
  }
  return absl::OkStatus();
}

// Seals `fd` against shrinking when the kernel allows it (memfds made with MFD_ALLOW_SEALING);
// returns whether it is sealed.
bool SealShrink(int fd) {
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0) return true;
  const int seals = ::fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & F_SEAL_SHRINK) != 0;
}

}  // namespace

absl::StatusOr<std::pair<std::unique_ptr<Mapping>, uint8_t*>> MapFd(int fd, uint64_t offset,
                                                                    uint64_t size, bool writable,
                                                                    const char* field) {
  if (absl::Status kind = CheckKind(fd, field); !kind.ok()) return kind;
  // Sealed before the size is read, so a sealed object cannot shrink below it afterwards.
  const bool sealed = SealShrink(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": fstat failed: ", ErrnoText(errno)));
  }
  if (offset > static_cast<uint64_t>(st.st_size) ||
      size > static_cast<uint64_t>(st.st_size) - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.size_bytes: region [", offset, ", ", offset + size,
                     ") does not fit the shared object of ", st.st_size, " bytes"));
  }
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t aligned = offset - offset % page;
  const size_t length = size + (offset - aligned);
  // No MAP_POPULATE: it would commit every page of a sparse object (a 2 GiB memfd with nothing
  // written took 2 GiB). Transfers fault in what they touch.
  void* base = ::mmap(nullptr, length, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd,
                      static_cast<off_t>(aligned));
  if (base == MAP_FAILED) {
    const int err = errno;
    if ((err == EACCES || err == EPERM) && writable) {
      return absl::PermissionDeniedError(absl::StrCat(
          "spec.writable: the shared object cannot be mapped for writing (opened read-only or "
          "sealed against writes): ",
          ErrnoText(err)));
    }
    return absl::InternalError(absl::StrCat(field, ": mmap failed: ", ErrnoText(err)));
  }
  absl::StatusOr<uint32_t> slot = SigbusGuard::Add(base, length);
  if (!slot.ok()) {
    ::munmap(base, length);
    return absl::Status(slot.status().code(), absl::StrCat(field, ": ", slot.status().message()));
  }
  auto mapping = std::make_unique<Mapping>(base, length, sealed, *slot);
  uint8_t* data = mapping->at(offset - aligned);
  return std::make_pair(std::move(mapping), data);
}

void PrefaultResident(const Mapping& mapping) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const auto* base = static_cast<const volatile uint8_t*>(mapping.base());
  std::vector<unsigned char> resident((mapping.length() + page - 1) / page);
  if (::mincore(mapping.base(), mapping.length(), resident.data()) != 0) return;
  for (size_t i = 0; i < resident.size(); ++i) {
    // A read fault maps the object's existing page; the volatile read is not optimized away.
    if ((resident[i] & 1) != 0) (void)base[i * page];
  }
}

}  // namespace kvrail::regions

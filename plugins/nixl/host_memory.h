// Finds the shared file behind a range of this process's host memory, so memory an engine
// allocated itself (a torch CPU tensor after share_memory_(), numpy over
// multiprocessing.shared_memory, an engine's memfd pool) can be registered with kvraild without a
// copy: kvraild maps the same pages through the file.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"

namespace kvrail::nixl {

struct SharedBacking {
  UniqueFd fd;          // a new descriptor of the backing file, owned by the caller
  uint64_t offset = 0;  // of the range's first byte in the file
  std::string path;     // as /proc/self/maps names it, for messages
};

// Reads /proc/self/maps. The range must lie in shared file mappings (MAP_SHARED) of one file,
// contiguous in both the address space and the file. The descriptor comes from, in order: the
// path when the file still has one, a descriptor this process holds open on the same inode
// (/proc/self/fd), or /proc/self/map_files. INVALID_ARGUMENT naming `addr` for private or
// anonymous memory (with how to allocate it instead), NOT_FOUND when no descriptor can be opened.
absl::StatusOr<SharedBacking> FindSharedBacking(uintptr_t addr, uint64_t len);

}  // namespace kvrail::nixl

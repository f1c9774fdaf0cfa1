// What /proc/<pid>/status says of a process, for tests that bound a daemon's threads or memory.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace kvrail::testing {

// The leading number of field `key` of /proc/<pid>/status ("Threads"; "VmRSS", in KiB); 0 when
// the file or the field cannot be read (a live process has at least one thread). Thread-safe.
uint64_t ProcStatusField(pid_t pid, const std::string& key);

}  // namespace kvrail::testing

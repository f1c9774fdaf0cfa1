#include "tests/harness/proc_status.h"

#include <cstdlib>
#include <fstream>

namespace kvrail::testing {

uint64_t ProcStatusField(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  const std::string prefix = key + ":";
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return std::strtoull(line.c_str() + prefix.size(), nullptr, 10);
  }
  return 0;
}

}  // namespace kvrail::testing

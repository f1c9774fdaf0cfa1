// libFuzzer target: kvraild's configuration parser (daemon/config). Input: a DaemonConfig in
// protobuf text format, as an operator's --config file. Parses it, merges it as overrides over a
// second parse of the same text's tail (the file-then-flags order kvraild uses), finalizes both,
// and checks what must hold whatever the input: an OK config is within the documented bounds,
// and a failed one names a key (an error message is never empty).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "daemon/config/config.h"

namespace {

void CheckAt(bool ok, int line) {
  if (!ok) {
    fprintf(stderr, "check failed at %s:%d\n", __FILE__, line);
    __builtin_trap();  // a finding: libFuzzer saves the input
  }
}
#define Check(ok, what) CheckAt((ok), __LINE__)

void CheckFinalized(kvrail::v1::DaemonConfig* config) {
  absl::Status status = kvrail::config::FinalizeConfig(config);
  if (!status.ok()) {
    Check(!status.message().empty(), "an error names a key");
    return;
  }
  Check(config->unix_socket().size() < 100, "unix_socket bounded");
  Check((config->socket_mode() & 0002u) == 0, "socket not world-writable");
  Check(config->tile_bytes() >= 4096 && config->tile_bytes() <= (uint64_t{1} << 30), "tile_bytes");
  Check(config->host_engine_threads() >= 1 && config->host_engine_threads() <= 256, "threads");
  Check(!config->node_id().empty(), "node_id");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 << 10) return 0;  // a config file is small; bigger inputs only slow the search
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kvrail::v1::DaemonConfig> config = kvrail::config::ParseConfig(text, "fuzz.conf");
  if (!config.ok()) {
    Check(config.status().message().rfind("fuzz.conf: ", 0) == 0, "errors name the origin");
    return 0;
  }
  kvrail::v1::DaemonConfig file = *config;
  CheckFinalized(&*config);
  // The same text as flags over the file's tail (overrides merge field by field).
  absl::StatusOr<kvrail::v1::DaemonConfig> tail =
      kvrail::config::ParseConfig(text.substr(text.size() / 2), "tail");
  if (tail.ok()) {
    kvrail::config::MergeOverrides(file, &*tail);
    CheckFinalized(&*tail);
  }
  return 0;
}

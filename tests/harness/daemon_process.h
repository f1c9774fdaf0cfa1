// Test harness: runs the real kvraild binary (from Bazel runfiles) on a unix socket in a temporary
// folder, and small helpers for paged KV data shared by the cross-module tests.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "proto/kvrail/v1/region.pb.h"

namespace kvrail::testing {

// A temporary folder removed (recursively) on destruction. Not thread-safe.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// One kvraild child process. Not thread-safe. The destructor kills a daemon still running.
class DaemonProcess {
 public:
  // Starts kvraild with --socket <dir>/kvrail.sock plus `extra_args`, logging to <dir>/`log_name`;
  // waits up to `wait_ms` until it logs "ready: " and, with `probe`, until the socket answers a
  // health RPC (false otherwise, or when it exits first). Without `probe` this process makes no
  // gRPC connection of its own to the daemon, as when another process restarts it: a client's
  // channel then sees only its own reconnect attempts (gRPC shares one connection between
  // channels to the same target). A hot restart's successor runs in its predecessor's folder
  // with a log of its own.
  bool Start(const std::string& dir, const std::vector<std::string>& extra_args = {},
             bool probe = true, const std::string& log_name = "kvraild.log", int wait_ms = 2000);
  // Sends `signal` (0: none, only waits) and waits up to `timeout_ms`; returns the exit status
  // (WEXITSTATUS) or -1 when it did not exit normally in time (it is then killed).
  int Stop(int signal, int timeout_ms = 20000);
  ~DaemonProcess();

  // kvraild's --log-level for the next Start. Tests keep "debug" (a failure's log says what the
  // daemon did); benchmarks set "info": at debug the session poll thread writes lines for every
  // transfer, which the latency figures would count.
  void set_log_level(std::string level) { log_level_ = std::move(level); }

  const std::string& socket() const { return socket_; }
  const std::string& log_path() const { return log_; }
  pid_t pid() const { return pid_; }
  std::string ReadLog() const;

 private:
  pid_t pid_ = -1;
  std::string log_level_ = "debug";
  std::string socket_;
  std::string log_;
};

// Path of a binary built by Bazel, from the test's runfiles ("daemon/kvraild"): TEST_SRCDIR /
// TEST_WORKSPACE, else the runfiles tree beside the running binary, else (a packed binary, see
// tests/gpu/pack.sh) the program of that base name in the running binary's own folder.
std::string RunfilePath(const std::string& workspace_relative);

// Runs a command, captures stdout and stderr separately; returns the exit status.
struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
CommandResult RunCommand(const std::vector<std::string>& argv);

// A plain HTTP/1.0 GET to 127.0.0.1:`port`; the whole response (status line, headers, body), or
// "" when nothing answers.
std::string HttpGet(int port, const std::string& path);

// A dense paged layout (strides derived from `order`).
v1::PagedKvLayout MakeLayout(uint32_t layers, uint32_t parts, uint32_t blocks, uint32_t tpb,
                             uint32_t heads, uint32_t head_dim, v1::DType dtype,
                             v1::LayoutOrder order);
// Bytes needed by a dense layout.
uint64_t LayoutBytes(const v1::PagedKvLayout& layout);
// Byte offset of element (layer, part, block, token-in-block, head, byte 0).
uint64_t ElementOffset(const v1::PagedKvLayout& layout, uint32_t layer, uint32_t part,
                       uint32_t block, uint32_t slot, uint32_t head);
// The byte a test writes for (seed, layer, part, token position, head, byte within head vector).
uint8_t PatternByte(uint32_t seed, uint32_t layer, uint32_t part, uint64_t token, uint32_t head,
                    uint32_t byte);

}  // namespace kvrail::testing

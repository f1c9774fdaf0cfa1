// Test helper: one real etcd member (Debian's etcd-server: $KVRAIL_ETCD_BIN or /usr/bin/etcd) on
// loopback with free ports and a temporary data dir, killed by pid when destroyed. Start() may
// be called again after Kill() (same ports and data: a restart). For the directory's live tests
// and the many-daemon tests (tests/cluster). Not thread-safe.
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/eventually.h"

namespace kvrail::directory::testing {

// The etcd binary tests use; empty when it is not executable there.
std::string EtcdBinaryOrEmpty();

class EtcdTestServer {
 public:
  // `host`: the loopback address to listen on (client and peer ports picked by binding port 0).
  explicit EtcdTestServer(const std::string& host = "127.0.0.1");
  ~EtcdTestServer();
  EtcdTestServer(const EtcdTestServer&) = delete;
  EtcdTestServer& operator=(const EtcdTestServer&) = delete;

  // Starts etcd and waits (up to 20 s) until a Range answers. FAILED_PRECONDITION when the
  // binary is missing (tests must fail, not skip: CI installs etcd-server).
  absl::Status Start();
  // SIGKILL and reap (no-op when not running).
  void Kill();
  // "host:port" of the client endpoint.
  std::string endpoint() const;
  pid_t pid() const { return pid_; }
  // The last 4 KB of etcd's log.
  std::string ReadLog() const;

 private:
  std::string host_;
  std::string dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

// The tests' wait by the clock (base/eventually.h), under the name these tests use.
using ::kvrail::Eventually;

}  // namespace kvrail::directory::testing

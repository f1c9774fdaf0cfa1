// kvraild's process: from a finalized DaemonConfig (config::FinalizeConfig), it starts the region
// table, the engines, the directory, the fabric, the transfer manager, the metrics endpoint, the
// session socket and the gRPC server, in that order; serves until SIGTERM/SIGINT; drains; and
// tears down in the reverse order. Each module's options come from daemon/options.h.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/kvrail/v1/config.pb.h"

namespace kvrail::daemon {

// Exit statuses: 1 a start error (the message names the setting), 3 cuda_engine: required and the
// CUDA engine did not start (the supervisor restarts kvraild with its back-off).
inline constexpr int kExitStartFailed = 1;
inline constexpr int kExitCudaRequired = 3;

// Hot restart (daemon/handover/handover.h; docs/operations.md, "Hot restart").
struct HotRestart {
  // Empty: start cold. "auto": take over from the kvraild serving this socket when one answers
  // its handover socket, else start cold. Otherwise a handover socket path: a predecessor must
  // answer there, or the start fails (and nothing changes).
  std::string take_over;
  // After handing everything over, idle until SIGTERM instead of returning from Serve at once
  // (for supervisors that would restart an exited process: the DaemonSet's old pod).
  bool linger_after_handover = false;
};

// Thread contract: Start, Serve and the destructor are called from one thread (main's); what
// runs meanwhile is the modules' own threads.
class Daemon {
 public:
  virtual ~Daemon() = default;

  // Blocks SIGTERM/SIGINT in every thread (before any starts, so Serve receives them), sets up
  // logging and the CUDA environment, then starts every module. An error names the setting;
  // ExitCodeOf tells the process's exit status for it.
  // Every daemon serves a handover socket ("<unix_socket>.handover") for its successor; with
  // `hot_restart.take_over` this one is the successor of the daemon serving the socket.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(v1::DaemonConfig config,
                                                       HotRestart hot_restart = {});

  // Serves until SIGTERM or SIGINT (refreshing systemd's status line every 10 s), then drains
  // in-flight transfers for up to drain_timeout_ms and stops serving; or until a successor took
  // everything over (then it returns without draining or removing the sockets, which are the
  // successor's). Call once.
  virtual void Serve() = 0;

  // The exit status for a Start error: kExitCudaRequired when cuda_engine: required could not
  // start the CUDA engine, else kExitStartFailed.
  static int ExitCodeOf(const absl::Status& status);
};

}  // namespace kvrail::daemon

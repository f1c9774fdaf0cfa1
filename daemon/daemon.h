// kvraild's process: from a finalized DaemonConfig (config::FinalizeConfig), it starts the region
// table, the engines, the directory, the fabric, the transfer manager, the metrics endpoint, the
// session socket, the gRPC server and the handover socket, in that order (a hot restart's
// successor takes its predecessor's state over before the session socket, and opens the metrics
// endpoint last); serves until SIGTERM/SIGINT or until its own successor took over; drains; and
// tears down in the reverse order. Each module's options come from daemon/options.h.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/kvrail/v1/config.pb.h"

namespace kvrail::daemon {

// Exit statuses: 1 a start error (the message names the setting), 3 cuda_engine: required and the
// CUDA engine did not start (the supervisor restarts kvraild with its back-off).
inline constexpr int kExitStartFailed = 1;
inline constexpr int kExitCudaRequired = 3;

// Thread contract: Start, Serve and the destructor are called from one thread (main's); what
// runs meanwhile is the modules' own threads.
class Daemon {
 public:
  virtual ~Daemon() = default;

  // Blocks SIGTERM/SIGINT in every thread (before any starts, so Serve receives them), sets up
  // logging and the CUDA environment, then starts every module. An error names the setting;
  // ExitCodeOf tells the process's exit status for it.
  // Every daemon serves a handover socket ("<unix_socket>.handover") for its successor; with
  // take_over set it is itself the successor of the daemon serving the socket: it takes that
  // daemon's sessions, regions and sockets over before it serves (docs/operations.md, "Hot
  // restart"). A start that fails before its commit leaves the predecessor serving.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(v1::DaemonConfig config);

  // Serves until SIGTERM or SIGINT (refreshing systemd's status line every 10 s), then drains
  // in-flight transfers for up to drain_timeout_ms and stops serving; or until a successor took
  // everything over (then it returns without draining or removing the sockets, which are the
  // successor's; with linger_after_handover only at SIGTERM). Call once.
  virtual void Serve() = 0;

  // The exit status for a Start error: kExitCudaRequired when cuda_engine: required could not
  // start the CUDA engine, else kExitStartFailed.
  static int ExitCodeOf(const absl::Status& status);
};

}  // namespace kvrail::daemon

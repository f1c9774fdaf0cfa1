// kvraild's process: from a finalized DaemonConfig (config::FinalizeConfig), it starts the region
// table, the engines, the directory, the fabric, the transfer manager, the metrics endpoint, the
// session socket and the gRPC server, in that order; serves until SIGTERM/SIGINT; drains; and
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
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(v1::DaemonConfig config);

  // Serves until SIGTERM or SIGINT (refreshing systemd's status line every 10 s), then drains
  // in-flight transfers for up to drain_timeout_ms and stops serving. Call once.
  virtual void Serve() = 0;

  // The exit status for a Start error: kExitCudaRequired when cuda_engine: required could not
  // start the CUDA engine, else kExitStartFailed.
  static int ExitCodeOf(const absl::Status& status);
};

}  // namespace kvrail::daemon

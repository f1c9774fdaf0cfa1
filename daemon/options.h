// Each module's options from the finalized DaemonConfig (config::FinalizeConfig has filled every
// default): pure functions, one per module, so what kvraild starts with is testable without
// starting it. Defaults live in daemon/config only; these copy and convert. Pointers, callbacks
// and probed facts the config cannot know (the engines, the directory, the fd limit) are the
// Daemon's to fill, or arguments here.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/predictive_wake.h"
#include "daemon/directory/etcd_client.h"
#include "daemon/directory/etcd_directory.h"
#include "daemon/directory/node_record.h"
#include "daemon/engine/cuda/cuda_engine.h"
#include "daemon/engine/engine.h"
#include "daemon/fabric/fabric.h"
#include "daemon/handover/handover.h"
#include "daemon/metrics/metrics.h"
#include "daemon/metrics/mps.h"
#include "daemon/regions/regions.h"
#include "daemon/server/server.h"
#include "daemon/session/session_server.h"
#include "daemon/transfers/transfers.h"
#include "proto/kvrail/v1/admin.pb.h"
#include "proto/kvrail/v1/config.pb.h"
#include "topology/topology.h"

namespace kvrail::daemon {

// topology::Discover: the MPS pipe folder (cuda_mps_pipe_directory).
topology::DiscoverOptions DiscoverOptionsFrom(const v1::DaemonConfig& config);

// The MPS co-run check for a daemon running as `daemon_uid`.
metrics::MpsProbeOptions MpsProbeOptionsFrom(const v1::DaemonConfig& config, uid_t daemon_uid);

// Region caps (docs/security.md, "Memory").
regions::RegionLimits RegionLimitsFrom(const v1::DaemonConfig& config);

// Per-class limits indexed by engine::PriorityClass (critical, normal, background).
engine::PriorityLimits PriorityLimitsFrom(const v1::DaemonConfig& config);

// The host engine's worker threads, class limits and the largest job it copies on the admitting
// thread (host_inline_max_bytes; engine::CreateHostEngine).
struct HostEngineOptions {
  int threads = 0;
  engine::PriorityLimits limits;
  uint64_t inline_max_bytes = 0;
};
HostEngineOptions HostEngineOptionsFrom(const v1::DaemonConfig& config);

// Predictive wake's margin, tolerance and longest gap (predictive_wake_*_us), for the session poll
// thread and each GPU's dispatcher.
PredictiveWakeOptions PredictiveWakeOptionsFrom(const v1::DaemonConfig& config);

// The CUDA engine's options; cuda_critical_ctas unset is -1 (one CTA per SM, asked of the GPU);
// low_latency false turns staged plan uploads off (and the dispatcher's idle spin, unless
// cuda_dispatcher_spin_us is set); the spin's budget is cuda_dispatcher_spin_budget_percent / 100.
engine::CudaEngineOptions CudaEngineOptionsFrom(const v1::DaemonConfig& config);

// The fabric's options for this node and `topology` (tls is the Daemon's).
fabric::FabricOptions FabricOptionsFrom(const v1::DaemonConfig& config,
                                        const v1::GetTopologyResponse& topology);

// The etcd client's options without the PEM text and password (files the Daemon reads).
directory::EtcdClientOptions EtcdClientOptionsFrom(const v1::DaemonConfig& config);

// This node's record inputs (address, fabric addresses, topology) for the etcd directory; `now`
// is left for the caller.
directory::NodeRecordInputs NodeRecordInputsFrom(const v1::DaemonConfig& config,
                                                 const v1::GetTopologyResponse& topology,
                                                 const std::string& instance_id,
                                                 const std::string& build_info);

// The etcd directory's options, its record built from `record`.
directory::EtcdDirectoryOptions EtcdDirectoryOptionsFrom(const v1::DaemonConfig& config,
                                                         const directory::NodeRecordInputs& record);

// The transfer manager's options (its engines, fabric, hub and callback are the Daemon's).
transfers::Options TransferOptionsFrom(const v1::DaemonConfig& config,
                                       const v1::GetTopologyResponse& topology);

// max_sessions, or when 0 a quarter of the descriptor limit `fd_limit` (0: unlimited), at least
// 16 and at most 65536.
size_t MaxSessionsFrom(const v1::DaemonConfig& config, uint64_t fd_limit);

// max_sessions_per_uid, or when 0 a quarter of `max_sessions` (at least 1, at most 256): one uid
// never takes every session (at RLIMIT_NOFILE 1024, 64 of the 256).
size_t MaxSessionsPerUidFrom(const v1::DaemonConfig& config, size_t max_sessions);

// The session server's options (callbacks and instance id are the Daemon's); `fd_limit` as for
// MaxSessionsFrom.
session::SessionServerOptions SessionOptionsFrom(const v1::DaemonConfig& config, uint64_t fd_limit);

// The gRPC server's options: tcp_listen (the private unix bind is the Daemon's), static peers as
// "unknown"; the topology, stats, credentials and callbacks are the Daemon's.
server::ServerOptions ServerOptionsFrom(const v1::DaemonConfig& config);

// The metrics endpoint's options (the stats and peers callbacks are the Daemon's).
metrics::MetricsOptions MetricsOptionsFrom(const v1::DaemonConfig& config, int gpus, int cuda_gpus);

// Hot restart: this daemon's handover socket ("<unix_socket>.handover"), whom it takes over from
// (take_over: "auto" is that same path, cold when nobody answers) and the waits
// (handover_timeout_ms; the successor's wait for the bundle adds drain_timeout_ms).
handover::HotRestartOptions HotRestartOptionsFrom(const v1::DaemonConfig& config);

}  // namespace kvrail::daemon

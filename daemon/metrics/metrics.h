// Prometheus metrics: counters and latency histograms updated as transfers end, plus gauges and
// counters read from a Stats snapshot at scrape time (regions, active transfers, queue depths,
// engine state, bytes counted tile by tile, refused submits) and the peers' liveness.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/kvrail/v1/admin.pb.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::metrics {

// One GPU of the node's topology, for kvrail_gpu_info.
struct GpuLabel {
  int index = 0;     // TopologyDesc's Gpu.index (NVML's, PCI bus order): "gpu0" in link names
  std::string uuid;  // "GPU-..."
  std::string name;  // "NVIDIA H200"
};

// The session socket's admission queues at a scrape (session::SessionServer::AdmissionDepth).
struct SessionAdmission {
  size_t queued = 0;      // tasks waiting for an admission worker, every session together
  size_t running = 0;     // tasks being admitted now
  size_t deepest = 0;     // the most waiting in one session's queue (capped per session)
  uint64_t promoted = 0;  // bulk admissions lifted to normal priority at their deadline, so far
};

// The session poll thread's predictive wake so far (session::SessionServerOptions::WakeCounts).
struct SessionWake {
  uint64_t spins = 0;   // spins begun around a predicted request
  uint64_t hits = 0;    // those that found the request
  uint64_t misses = 0;  // those that ended without it (the thread slept as it would have)
};

struct MetricsOptions {
  // "127.0.0.1:9464"; port 0 picks one.
  std::string listen;
  // TLS on `listen` (PEM files, both or neither; DaemonConfig.metrics_tls): /metrics is served
  // over HTTPS only. tls_client_ca_file: scrapers must also present a certificate it signed.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // Non-empty (DaemonConfig.metrics_bearer_token_file's token): scrapes must send
  // "Authorization: Bearer <bearer_token>", else 401.
  std::string bearer_token;
  // Called at each scrape. Its started_unix_us feeds kvrail_start_time_seconds.
  std::function<v1::Stats()> stats;
  // Called at each scrape when set (kvrail_session_admission_*); empty: no such series.
  std::function<SessionAdmission()> session_admission;
  // Called at each scrape when set (kvrail_session_predicted_spins_total); empty: no such series.
  std::function<SessionWake()> session_wake;
  // Called at each scrape when set (kvrail_peer_up); empty: no peers.
  std::function<std::vector<v1::PeerInfo>()> peers;
  // kvrail_build_info's labels.
  std::string version;
  std::string build_info;
  // kvrail_gpus: GPUs in the node's topology; kvrail_cuda_gpus{mode}: GPUs the CUDA engine runs
  // on (0 without one), mode being DaemonConfig.cuda_engine (auto, required, off).
  int gpus = 0;
  int cuda_gpus = 0;
  // kvrail_gpu_info{gpu, UUID, modelName}: dcgm-exporter's label names, so its series join on
  // UUID (`* on(UUID) group_left(gpu) kvrail_gpu_info`).
  std::vector<GpuLabel> gpu_labels;
  std::string cuda_mode = "auto";
};

// Thread-safe. Serves GET /metrics on its own HTTP threads (civetweb, inside prometheus-cpp);
// with TLS or a bearer token, through a front that terminates TLS and checks the token (the plain
// server then listens on 127.0.0.1 only, behind a per-process secret).
class Metrics {
 public:
  virtual ~Metrics() = default;
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(MetricsOptions options);
  // Binds `listen`; `stats` is called at each scrape.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& listen,
                                                        std::function<v1::Stats()> stats);
  // Counts a transfer that reached a final state (results, duration, queue wait).
  virtual void OnTransferFinished(const v1::TransferStatus& status) = 0;
  virtual int port() const = 0;
};

// Label values used by the metrics (lower case, stable): "host_local", "nvlink_p2p", ...
std::string PathLabel(v1::Path path);
std::string PriorityLabel(v1::Priority priority);
std::string ResultLabel(v1::TransferState state);
// "worker_bytes_per_second" -> kvrail_engine_worker_bytes_per_second (characters outside
// [a-zA-Z0-9_] become '_').
std::string EngineGaugeName(const std::string& gauge);
// How an engine's gauge is exported: EngineGaugeName's name, except that "..._ms" and "..._us"
// become "..._seconds" (the value converted), and "..._total" (a count that only grows) is a
// counter; everything else is a gauge as it is.
struct EngineSeries {
  std::string name;
  double value = 0;
  bool counter = false;
};
EngineSeries EngineSeriesOf(const std::string& gauge, double value);

}  // namespace kvrail::metrics

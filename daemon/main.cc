// kvraild: parses the command line, loads the config (file, flags, environment, defaults) and
// runs the Daemon (daemon/daemon.h) until SIGTERM/SIGINT.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "absl/synchronization/mutex.h"
#include "base/logging.h"
#include "base/logging_systemd.h"
#include "daemon/config/config.h"
#include "daemon/daemon.h"
#include "daemon/metrics/build_info.h"

namespace kvrail {
namespace {

// A fatal start error: at error priority in the journal under journald, and one line whatever
// the message holds (a config parser's message may quote the file).
void ReportFatal(const std::string& message) { ReportStartError(message); }

// --check-config FILE: what kvraild would refuse in FILE at start, without starting anything:
// parsing (unknown fields, types), every setting FinalizeConfig checks, and log_level/log_format.
// Files the config names (certificates, etcd's password file) are read only at start.
int CheckConfig(const std::string& path) {
  absl::StatusOr<v1::DaemonConfig> config = config::LoadConfigFile(path);
  absl::Status status = config.status();
  if (status.ok())
    status = config::ApplyEnvironment([](const char* name) { return std::getenv(name); }, &*config);
  if (status.ok()) status = config::FinalizeConfig(&*config);
  if (status.ok()) {
    std::ostringstream discard;
    status = SetUpLoggingTo(config->log_level(), config->log_format(), false, &discard);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "kvraild: %s: %s\n", path.c_str(), std::string(status.message()).c_str());
    return 1;
  }
  std::printf("%s: ok (cuda_engine %s, socket %s)\n", path.c_str(), config->cuda_engine().c_str(),
              config->unix_socket().c_str());
  return 0;
}

}  // namespace
}  // namespace kvrail

int main(int argc, char** argv) {
  // Debian's Abseil is built with deadlock detection on: every Mutex operation would update a
  // global lock graph. Tests (KVRAIL_TEST set by .bazelrc) keep it; a serving daemon does not.
  if (std::getenv("KVRAIL_TEST") == nullptr) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  CLI::App app{"kvraild: moves KV cache between GPUs and nodes for disaggregated LLM serving"};
  app.set_version_flag("--version", kvrail::build::Info("kvraild"));
  std::string config_path;
  kvrail::v1::DaemonConfig flags;
  std::string socket, tcp_listen, node_id, log_level, log_format, topology_file;
  uint32_t host_threads = 0;
  uint32_t drain_ms = 0;
  uint64_t tile_bytes = 0;
  std::string cuda_engine;
  int64_t cuda_max_ctas = -1;
  uint32_t cuda_fixed_ctas = 0;
  uint64_t cuda_copy_min_run = 0;
  std::string cuda_run_on;
  int64_t defer_id_checks_from = -1;
  uint64_t cuda_batch_bytes = 0;
  app.add_option("--config", config_path, "DaemonConfig textproto file");
  std::string check_config_path;
  app.add_option("--check-config", check_config_path,
                 "validate this DaemonConfig file and exit: 0 valid, 1 not (the field is named)");
  app.add_option("--socket", socket, "unix socket for clients (default /run/kvrail/kvrail.sock)");
  app.add_option("--tcp-listen", tcp_listen, "also serve gRPC on host:port");
  std::string peer_ca, peer_cert, peer_key;
  bool insecure_peers = false;
  app.add_option("--peer-ca", peer_ca, "peer_tls.ca_file: CA of the nodes' certificates (PEM)");
  app.add_option("--peer-cert", peer_cert,
                 "peer_tls.cert_file: this node's certificate (CN = node id)");
  app.add_option("--peer-key", peer_key, "peer_tls.key_file: its private key");
  app.add_flag("--insecure-peers", insecure_peers,
               "no TLS on tcp_listen and to peers: node ids as claimed (tests only)");
  app.add_option("--node-id", node_id, "this node's id (default: host name)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error");
  app.add_option("--log-format", log_format, "text or json");
  app.add_option("--host-threads", host_threads, "host engine worker threads");
  app.add_option("--tile-bytes", tile_bytes, "target tile size in bytes");
  app.add_option("--drain-timeout-ms", drain_ms, "how long SIGTERM lets transfers finish");
  app.add_option("--topology-file", topology_file, "replay this topology instead of discovering");
  std::string take_over;
  bool linger_after_handover = false;
  app.add_option("--take-over", take_over,
                 "take_over: hot restart: take sessions, regions and sockets over from the "
                 "kvraild serving this socket (\"auto\": when one answers its handover socket, "
                 "else start cold; or a handover socket path)");
  app.add_flag("--linger-after-handover", linger_after_handover,
               "linger_after_handover: after a hot restart handed everything over, idle until "
               "SIGTERM instead of exiting (for supervisors that restart an exited process: the "
               "DaemonSet)");
  std::string metrics_listen;
  app.add_option("--metrics-listen", metrics_listen, "serve Prometheus metrics on host:port");
  app.add_option("--cuda-engine", cuda_engine,
                 "auto (when a GPU exists), required (no CUDA engine: start fails) or off");
  app.add_option("--cuda-max-ctas", cuda_max_ctas, "SM budget in CTAs; 0: copy engines only");
  app.add_option("--cuda-fixed-ctas", cuda_fixed_ctas, "launch this many CTAs (0: find the knee)");
  app.add_option("--cuda-run-on", cuda_run_on,
                 "which GPU runs GPU-to-GPU transfers: source (default) or destination");
  app.add_option("--cuda-copy-engine-min-run-bytes", cuda_copy_min_run,
                 "mean contiguous run from which the copy engines are used");
  app.add_option("--cuda-batch-bytes", cuda_batch_bytes, "bytes one kernel launch aims for");
  app.add_option("--defer-id-checks-from", defer_id_checks_from,
                 "block-table ids from which checks run as tiles start (0: all before the answer)");
  CLI11_PARSE(app, argc, argv);
  if (!check_config_path.empty()) return kvrail::CheckConfig(check_config_path);

  kvrail::v1::DaemonConfig config;
  if (!config_path.empty()) {
    auto loaded = kvrail::config::LoadConfigFile(config_path);
    if (!loaded.ok()) {
      kvrail::ReportFatal(loaded.status().ToString());
      return 2;
    }
    config = *std::move(loaded);
  }
  flags.set_unix_socket(socket);
  flags.set_tcp_listen(tcp_listen);
  if (!peer_ca.empty()) flags.mutable_peer_tls()->set_ca_file(peer_ca);
  if (!peer_cert.empty()) flags.mutable_peer_tls()->set_cert_file(peer_cert);
  if (!peer_key.empty()) flags.mutable_peer_tls()->set_key_file(peer_key);
  flags.set_insecure_peers(insecure_peers);
  flags.set_node_id(node_id);
  flags.set_log_level(log_level);
  flags.set_log_format(log_format);
  flags.set_host_engine_threads(host_threads);
  flags.set_tile_bytes(tile_bytes);
  flags.set_drain_timeout_ms(drain_ms);
  flags.set_topology_file(topology_file);
  flags.set_take_over(take_over);
  flags.set_linger_after_handover(linger_after_handover);
  flags.set_metrics_listen(metrics_listen);
  flags.set_cuda_engine(cuda_engine);
  if (cuda_max_ctas >= 0) flags.set_cuda_max_ctas(static_cast<uint32_t>(cuda_max_ctas));
  flags.set_cuda_fixed_ctas(cuda_fixed_ctas);
  flags.set_cuda_copy_engine_min_run_bytes(cuda_copy_min_run);
  flags.set_cuda_run_on(cuda_run_on);
  flags.set_cuda_batch_bytes(cuda_batch_bytes);
  if (defer_id_checks_from >= 0) {
    flags.set_defer_id_checks_from(static_cast<uint64_t>(defer_id_checks_from));
  }
  kvrail::config::MergeOverrides(flags, &config);
  absl::Status status =
      kvrail::config::ApplyEnvironment([](const char* name) { return std::getenv(name); }, &config);
  if (status.ok()) status = kvrail::config::FinalizeConfig(&config);
  if (!status.ok()) {
    kvrail::ReportFatal(status.ToString());
    return kvrail::daemon::kExitStartFailed;
  }
  absl::StatusOr<std::unique_ptr<kvrail::daemon::Daemon>> daemon =
      kvrail::daemon::Daemon::Start(std::move(config));
  if (!daemon.ok()) {
    kvrail::ReportFatal(daemon.status().ToString());
    return kvrail::daemon::Daemon::ExitCodeOf(daemon.status());
  }
  (*daemon)->Serve();
  return 0;
}

#include "daemon/config/config.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvrail::config {
namespace {

// Collects the parser's first error with its position.
class ErrorCollector final : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (first_.empty())
      first_ = absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

}  // namespace

absl::StatusOr<v1::DaemonConfig> ParseConfig(const std::string& text, const std::string& origin) {
  v1::DaemonConfig config;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", errors.first()));
  }
  return config;
}

absl::StatusOr<v1::DaemonConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("config: cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return ParseConfig(text.str(), path);
}

void MergeOverrides(const v1::DaemonConfig& overrides, v1::DaemonConfig* base) {
  base->MergeFrom(overrides);  // proto3 scalars merge only when non-default; maps merge by key
}

namespace {

// fabric.relay's values: auto, off, host, gpu:<ordinal in [0, 1024)>.
bool IsRelayValue(const std::string& value) {
  if (value == "auto" || value == "off" || value == "host") return true;
  if (value.rfind("gpu:", 0) != 0 || value.size() == 4 || value.size() > 8) return false;
  int ordinal = 0;
  for (size_t i = 4; i < value.size(); ++i) {
    if (value[i] < '0' || value[i] > '9') return false;
    ordinal = ordinal * 10 + (value[i] - '0');
  }
  return ordinal < 1024;
}

bool IsGpuPackValue(const std::string& value) { return value == "kernel" || value == "copy"; }

}  // namespace

absl::Status ApplyEnvironment(const Getenv& getenv, v1::DaemonConfig* config) {
  auto value = [&getenv](const char* name) -> std::string {
    const char* v = getenv(name);
    return v == nullptr ? std::string() : std::string(v);
  };
  if (const std::string v = value("KVRAILD_LOW_LATENCY"); !v.empty()) {
    if (v != "off" && v != "on") {
      return absl::InvalidArgumentError(
          absl::StrCat("KVRAILD_LOW_LATENCY: '", v.substr(0, 64),
                       "' is not off or on (it overrides low_latency)"));
    }
    config->set_low_latency(v == "on");
  }
  if (const std::string v = value("KVRAIL_FABRIC_RELAY"); !v.empty()) {
    if (!IsRelayValue(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("KVRAIL_FABRIC_RELAY: '", v.substr(0, 64),
                       "' is not auto, off, host or gpu:<ordinal> (it overrides fabric.relay)"));
    }
    config->mutable_fabric()->set_relay(v);
  }
  if (const std::string v = value("KVRAIL_FABRIC_GPU_PACK"); !v.empty()) {
    if (!IsGpuPackValue(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("KVRAIL_FABRIC_GPU_PACK: '", v.substr(0, 64),
                       "' is not kernel or copy (it overrides fabric.gpu_pack)"));
    }
    config->mutable_fabric()->set_gpu_pack(v);
  }
  if (const std::string v = value("CUDA_MPS_PIPE_DIRECTORY");
      !v.empty() && config->cuda_mps_pipe_directory().empty()) {
    config->set_cuda_mps_pipe_directory(v);
  }
  return absl::OkStatus();
}

namespace {

// TCP and peers need mTLS (peer_tls) unless insecure_peers says otherwise, explicitly
// (docs/security.md, "Peers").
absl::Status CheckPeerSecurity(const v1::DaemonConfig& config) {
  const v1::PeerTls& tls = config.peer_tls();
  const bool any_tls =
      !tls.ca_file().empty() || !tls.cert_file().empty() || !tls.key_file().empty();
  if (any_tls) {
    const std::pair<const char*, const std::string*> files[] = {
        {"peer_tls.ca_file", &tls.ca_file()},
        {"peer_tls.cert_file", &tls.cert_file()},
        {"peer_tls.key_file", &tls.key_file()}};
    for (const auto& [key, value] : files) {
      if (value->empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            key,
            ": not set; mTLS between daemons needs peer_tls.ca_file, peer_tls.cert_file "
            "and peer_tls.key_file"));
      }
    }
    if (config.insecure_peers()) {
      return absl::InvalidArgumentError(
          "insecure_peers: set together with peer_tls; choose one (peer_tls)");
    }
    return absl::OkStatus();
  }
  const bool networked = !config.tcp_listen().empty() || config.peers_size() > 0;
  if (networked && !config.insecure_peers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.tcp_listen().empty() ? "peers" : "tcp_listen",
        ": set, but peer_tls (ca_file, cert_file, key_file) is not: peers authenticate with "
        "mTLS; set peer_tls, or insecure_peers: true (--insecure-peers) for tests and closed "
        "networks only"));
  }
  if (config.tcp_serves_api()) {
    return absl::InvalidArgumentError(
        "tcp_serves_api: needs peer_tls (callers over TCP must present a certificate from the "
        "CA); it is refused with insecure_peers");
  }
  return absl::OkStatus();
}

// host:port with a non-empty host and a port in 1..65535 (0 allowed when `allow_zero`).
bool IsHostPort(const std::string& address, bool allow_zero) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return false;
  if (address.find("://") != std::string::npos) return false;
  uint64_t port = 0;
  for (size_t i = colon + 1; i < address.size(); ++i) {
    if (address[i] < '0' || address[i] > '9' || port > 65535) return false;
    port = port * 10 + static_cast<uint64_t>(address[i] - '0');
  }
  return port <= 65535 && (allow_zero || port != 0);
}

// The etcd directory (docs/fabric.md, "Directory"): defaults, then checks naming the key.
absl::Status FinalizeEtcd(v1::DaemonConfig* config) {
  v1::EtcdDirectoryConfig* etcd = config->mutable_etcd();
  if (etcd->endpoints().empty()) {
    if (config->has_etcd() && etcd->ByteSizeLong() != 0) {
      return absl::InvalidArgumentError(
          "etcd.endpoints: not set, but other etcd.* keys are; list etcd's client endpoints "
          "(host:port) or remove the etcd block");
    }
    config->clear_etcd();
    return absl::OkStatus();
  }
  for (int i = 0; i < etcd->endpoints_size(); ++i) {
    const std::string& endpoint = etcd->endpoints(i);
    if (!IsHostPort(endpoint, /*allow_zero=*/false)) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd.endpoints[", i, "]: '", endpoint,
                       "' is not host:port (write etcd's client URL without the scheme, e.g. "
                       "10.0.0.5:2379)"));
    }
  }
  if (etcd->prefix().empty()) etcd->set_prefix("/kvrail/v1/nodes/");
  if (etcd->prefix().back() != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd.prefix: '", etcd->prefix(),
        "' must end with '/' (otherwise it also matches the keys of a prefix that extends it)"));
  }
  if (etcd->ttl_s() == 0) etcd->set_ttl_s(10);
  if (etcd->ttl_s() < 2 || etcd->ttl_s() > 3600) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd.ttl_s: ", etcd->ttl_s(),
                     " is outside [2, 3600] (etcd grants no lease shorter "
                     "than about 2 s)"));
  }
  if (etcd->cert_file().empty() != etcd->key_file().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        etcd->cert_file().empty() ? "etcd.cert_file" : "etcd.key_file",
        ": not set; etcd client certificates need both etcd.cert_file and etcd.key_file"));
  }
  if (etcd->username().empty() != etcd->password_file().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        etcd->username().empty() ? "etcd.username" : "etcd.password_file",
        ": not set; etcd authentication needs both etcd.username and etcd.password_file"));
  }
  if (config->node_id().find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("node_id: '", config->node_id(),
                     "' contains '/' (it is the last segment of the etcd key)"));
  }
  if (config->tcp_listen().empty()) {
    return absl::InvalidArgumentError(
        "tcp_listen: not set, but etcd.endpoints is: the other daemons reach this one through "
        "its Peer service on tcp_listen");
  }
  if (etcd->advertise_address().empty()) etcd->set_advertise_address(config->tcp_listen());
  const std::string& advertise = etcd->advertise_address();
  const std::string host = advertise.substr(0, advertise.rfind(':'));
  if (!IsHostPort(advertise, /*allow_zero=*/false) || host == "0.0.0.0" || host == "[::]" ||
      host == "::") {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd.advertise_address: '", advertise,
        "' is not an address other daemons can dial (host:port, a real host and a fixed port; "
        "it defaults to tcp_listen)"));
  }
  return absl::OkStatus();
}

// Hot restart (docs/operations.md, "Hot restart"): defaults, then checks naming the key. The
// handover socket is "<unix_socket>.handover", which must fit a socket address too.
absl::Status FinalizeHotRestart(v1::DaemonConfig* config) {
  if (config->handover_timeout_ms() == 0) config->set_handover_timeout_ms(30000);
  if (config->handover_timeout_ms() < 1000 || config->handover_timeout_ms() > 600000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handover_timeout_ms: ", config->handover_timeout_ms(), " is outside [1000, 600000]"));
  }
  constexpr size_t kMaxSocketPath = 107;  // sockaddr_un.sun_path less its terminating NUL
  if (config->unix_socket().size() + 9 > kMaxSocketPath) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix_socket: its handover socket ", config->unix_socket(),
                     ".handover is longer than 107 bytes; use a shorter path"));
  }
  const std::string& take_over = config->take_over();
  if (take_over.empty() || take_over == "auto") return absl::OkStatus();
  if (take_over[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("take_over: '", take_over.substr(0, 128),
                     "' is not auto or the absolute path of a handover socket"));
  }
  if (take_over.size() > kMaxSocketPath) {
    return absl::InvalidArgumentError(
        absl::StrCat("take_over: path longer than 107 bytes: ", take_over.substr(0, 128)));
  }
  return absl::OkStatus();
}

// The inter-node data path (docs/fabric.md): defaults, then checks naming the key. fabric.nics
// defaults to the host of tcp_listen; a node with peers (static or through etcd) needs one.
absl::Status FinalizeFabric(v1::DaemonConfig* config) {
  v1::FabricConfig* fabric = config->mutable_fabric();
  if (fabric->provider().empty()) fabric->set_provider("tcp;ofi_rxm");
  if (fabric->slots() == 0) fabric->set_slots(16);
  if (fabric->slot_bytes() == 0) fabric->set_slot_bytes(4 << 20);
  if (fabric->liveness_timeout_ms() == 0) fabric->set_liveness_timeout_ms(3000);
  if (fabric->heartbeat_interval_ms() == 0) fabric->set_heartbeat_interval_ms(300);
  if (fabric->lane_timeout_ms() == 0) fabric->set_lane_timeout_ms(500);
  if (fabric->lane_cooldown_ms() == 0) fabric->set_lane_cooldown_ms(2000);
  if (fabric->relay().empty()) fabric->set_relay("auto");
  if (fabric->gpu_pack().empty()) fabric->set_gpu_pack("kernel");
  if (!IsRelayValue(fabric->relay())) {
    return absl::InvalidArgumentError(absl::StrCat("fabric.relay: '", fabric->relay(),
                                                   "' is not auto, off, host or gpu:<ordinal>"));
  }
  if (!IsGpuPackValue(fabric->gpu_pack())) {
    return absl::InvalidArgumentError(
        absl::StrCat("fabric.gpu_pack: '", fabric->gpu_pack(), "' is not kernel or copy"));
  }
  if (fabric->nics().empty()) {
    const std::string& listen = config->tcp_listen();
    const std::string host = listen.substr(0, listen.rfind(':'));
    const bool has_peers = config->peers_size() > 0 || config->has_etcd();
    if (!host.empty() && host != "0.0.0.0") {
      fabric->add_nics(host);
    } else if (has_peers) {
      return absl::InvalidArgumentError("fabric.nics: set it, or tcp_listen to a host address");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FinalizeConfig(v1::DaemonConfig* config) {
  if (config->node_id().empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    config->set_node_id(host[0] != '\0' ? host : "localhost");
  }
  if (config->unix_socket().empty()) config->set_unix_socket("/run/kvrail/kvrail.sock");
  if (config->socket_mode() == 0) config->set_socket_mode(0660);
  if (config->log_level().empty()) config->set_log_level("info");
  if (config->log_format().empty()) config->set_log_format("text");
  if (config->host_engine_threads() == 0) config->set_host_engine_threads(4);
  if (config->tile_bytes() == 0) config->set_tile_bytes(1 << 20);
  if (config->transfer_history() == 0) config->set_transfer_history(10000);
  if (config->drain_timeout_ms() == 0) config->set_drain_timeout_ms(10000);
  if (config->cuda_engine().empty()) config->set_cuda_engine("auto");
  if (config->cuda_run_on().empty()) config->set_cuda_run_on("source");
  if (!config->has_cuda_max_ctas()) config->set_cuda_max_ctas(32);
  if (!config->has_defer_id_checks_from()) config->set_defer_id_checks_from(32768);
  if (config->cuda_batch_bytes() == 0) config->set_cuda_batch_bytes(64 << 20);
  if (config->cuda_copy_engine_min_run_bytes() == 0) {
    config->set_cuda_copy_engine_min_run_bytes(1 << 20);
  }
  if (!config->has_cuda_copy_only_kernel_ctas()) config->set_cuda_copy_only_kernel_ctas(4);
  if (config->cuda_copy_only_kernel_below_run_bytes() == 0) {
    config->set_cuda_copy_only_kernel_below_run_bytes(128 << 10);
  }
  if (!config->has_cuda_copy_split_max_percent()) config->set_cuda_copy_split_max_percent(40);
  if (!config->has_cuda_warm_up()) config->set_cuda_warm_up(true);
  if (!config->has_cuda_stream_wait()) config->set_cuda_stream_wait(false);
  if (config->cuda_stream_wait_jobs() == 0) config->set_cuda_stream_wait_jobs(8);
  if (!config->has_cuda_wake_on_submit()) config->set_cuda_wake_on_submit(true);
  if (!config->has_cuda_done_words()) config->set_cuda_done_words(true);
  if (!config->has_cuda_warm_plans()) config->set_cuda_warm_plans(true);
  if (!config->has_low_latency()) config->set_low_latency(true);
  if (!config->has_session_admission_workers()) config->set_session_admission_workers(4);
  if (!config->has_session_admission_bulk_workers()) {
    config->set_session_admission_bulk_workers(1);
  }
  if (!config->has_session_admission_bulk_deadline_ms()) {
    config->set_session_admission_bulk_deadline_ms(100);
  }
  if (!config->has_session_submission_queue()) config->set_session_submission_queue(true);
  if (!config->has_session_submission_spin_us()) {
    config->set_session_submission_spin_us(config->low_latency() ? 50 : 0);
  }
  if (!config->has_session_spin_budget_percent()) config->set_session_spin_budget_percent(10);
  if (!config->has_session_spin_free_us()) {
    config->set_session_spin_free_us(config->low_latency() ? 100 : 0);
  }
  if (!config->has_cuda_dispatcher_spin_us()) {
    config->set_cuda_dispatcher_spin_us(config->low_latency() ? 100 : 0);
  }
  if (!config->has_cuda_dispatcher_spin_budget_percent()) {
    config->set_cuda_dispatcher_spin_budget_percent(100);
  }
  if (!config->has_predictive_wake()) config->set_predictive_wake(config->low_latency());
  if (!config->has_predictive_wake_margin_us()) config->set_predictive_wake_margin_us(50);
  if (!config->has_predictive_wake_tolerance_us()) config->set_predictive_wake_tolerance_us(100);
  if (!config->has_predictive_wake_max_gap_us()) config->set_predictive_wake_max_gap_us(50000);
  if (!config->has_host_inline_max_bytes()) {
    config->set_host_inline_max_bytes(config->low_latency() ? 65536 : 0);
  }
  // CUDA's own default folder; kvraild exports the value to CUDA before it starts.
  if (config->cuda_mps_pipe_directory().empty()) {
    config->set_cuda_mps_pipe_directory("/tmp/nvidia-mps");
  }

  if (config->unix_socket().size() >= 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix_socket: path longer than 99 bytes: ", config->unix_socket()));
  }
  if ((config->socket_mode() & ~0777u) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("socket_mode: %o is not a permission mask", config->socket_mode()));
  }
  if ((config->socket_mode() & 0002u) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "socket_mode: %o lets every user on the node move memory through the daemon; use a group "
        "(0660)",
        config->socket_mode()));
  }
  if (config->host_engine_threads() > 256) {
    return absl::InvalidArgumentError("host_engine_threads: at most 256");
  }
  if (config->tile_bytes() < 4096 || config->tile_bytes() > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError("tile_bytes: must be in [4096, 1 GiB]");
  }
  if (config->cuda_engine() != "auto" && config->cuda_engine() != "required" &&
      config->cuda_engine() != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_engine: '", config->cuda_engine(), "' is not auto, required or off"));
  }
  if (!config->cuda_mps_pipe_directory().empty() && config->cuda_mps_pipe_directory()[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("cuda_mps_pipe_directory: '",
                                                   config->cuda_mps_pipe_directory(),
                                                   "' is not an absolute path"));
  }
  if (config->cuda_run_on() != "source" && config->cuda_run_on() != "destination") {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_run_on: '", config->cuda_run_on(), "' is not source or destination"));
  }
  if (config->cuda_batch_bytes() < (1 << 20) || config->cuda_batch_bytes() > (uint64_t{16} << 30)) {
    return absl::InvalidArgumentError("cuda_batch_bytes: must be in [1 MiB, 16 GiB]");
  }
  if (config->cuda_max_ctas() > 4096) {
    return absl::InvalidArgumentError("cuda_max_ctas: at most 4096");
  }
  if (config->cuda_critical_ctas() > 4096) {
    return absl::InvalidArgumentError("cuda_critical_ctas: at most 4096");
  }
  if (config->cuda_copy_only_kernel_ctas() > 4096) {
    return absl::InvalidArgumentError("cuda_copy_only_kernel_ctas: at most 4096");
  }
  if (config->cuda_copy_split_max_percent() > 90) {
    return absl::InvalidArgumentError("cuda_copy_split_max_percent: at most 90");
  }
  if (config->cuda_copy_split_fixed_percent() > 90) {
    return absl::InvalidArgumentError("cuda_copy_split_fixed_percent: at most 90");
  }
  if (config->session_submission_spin_us() > kMaxSpinUs) {
    return absl::InvalidArgumentError(
        absl::StrCat("session_submission_spin_us: ", config->session_submission_spin_us(),
                     ", at most ", kMaxSpinUs));
  }
  if (config->cuda_dispatcher_spin_us() > kMaxSpinUs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda_dispatcher_spin_us: ", config->cuda_dispatcher_spin_us(), ", at most ", kMaxSpinUs));
  }
  if (config->cuda_dispatcher_spin_budget_percent() > 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda_dispatcher_spin_budget_percent: ", config->cuda_dispatcher_spin_budget_percent(),
        ", at most 100"));
  }
  if (config->session_spin_free_us() > kMaxSpinUs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session_spin_free_us: ", config->session_spin_free_us(), ", at most ", kMaxSpinUs));
  }
  if (config->predictive_wake_margin_us() > kMaxSpinUs) {
    return absl::InvalidArgumentError(
        absl::StrCat("predictive_wake_margin_us: ", config->predictive_wake_margin_us(),
                     ", at most ", kMaxSpinUs));
  }
  if (config->predictive_wake_tolerance_us() > kMaxSpinUs) {
    return absl::InvalidArgumentError(
        absl::StrCat("predictive_wake_tolerance_us: ", config->predictive_wake_tolerance_us(),
                     ", at most ", kMaxSpinUs));
  }
  if (config->predictive_wake_max_gap_us() < 1000 ||
      config->predictive_wake_max_gap_us() > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("predictive_wake_max_gap_us: ", config->predictive_wake_max_gap_us(),
                     ", must be in [1000, 1000000]"));
  }
  if (config->host_inline_max_bytes() > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host_inline_max_bytes: ", config->host_inline_max_bytes(), ", at most 1048576"));
  }
  if (config->session_spin_budget_percent() > 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session_spin_budget_percent: ", config->session_spin_budget_percent(), ", at most 100"));
  }
  if (config->session_admission_workers() > 64) {
    return absl::InvalidArgumentError("session_admission_workers: at most 64");
  }
  if (config->session_admission_bulk_workers() > 64) {
    return absl::InvalidArgumentError("session_admission_bulk_workers: at most 64");
  }
  if (config->session_admission_bulk_deadline_ms() > 60000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session_admission_bulk_deadline_ms: ", config->session_admission_bulk_deadline_ms(),
        ", at most 60000"));
  }
  if (config->cuda_stream_wait_jobs() > 256) {
    return absl::InvalidArgumentError("cuda_stream_wait_jobs: at most 256");
  }
  if (config->log_format() != "text" && config->log_format() != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("log_format: '", config->log_format(), "' is not text or json"));
  }
  // Caps (docs/security.md, "Caps"); max_sessions and max_sessions_per_uid 0 stay: kvraild
  // derives them from RLIMIT_NOFILE (daemon/options.h).
  if (config->max_transfers_per_session() == 0) config->set_max_transfers_per_session(4096);
  if (config->max_prepared_per_session() == 0) config->set_max_prepared_per_session(1024);
  if (config->max_watchers_per_session() == 0) config->set_max_watchers_per_session(64);
  if (config->max_watchers_per_uid() == 0) config->set_max_watchers_per_uid(1024);
  if (config->max_list_transfers() == 0) config->set_max_list_transfers(1000);
  if (config->max_sessions() > (1u << 20) || config->max_sessions_per_uid() > (1u << 20)) {
    return absl::InvalidArgumentError("max_sessions, max_sessions_per_uid: at most 1048576");
  }
  if (config->max_transfers_per_session() > (1u << 24)) {
    return absl::InvalidArgumentError("max_transfers_per_session: at most 16777216");
  }
  if (config->max_prepared_per_session() > 65536) {
    return absl::InvalidArgumentError("max_prepared_per_session: at most 65536");
  }
  if (config->max_watchers_per_session() > 65536) {
    return absl::InvalidArgumentError("max_watchers_per_session: at most 65536");
  }
  if (config->max_watchers_per_uid() > (1u << 20)) {
    return absl::InvalidArgumentError("max_watchers_per_uid: at most 1048576");
  }
  if (config->max_list_transfers() > 1000000) {
    return absl::InvalidArgumentError("max_list_transfers: at most 1000000");
  }
  // Region caps (docs/security.md, "Memory"); max_mapped_bytes_per_uid and max_region_mappings
  // 0 stay: kvraild derives them from the node (physical memory, vm.max_map_count).
  if (config->max_regions_per_session() == 0) config->set_max_regions_per_session(4096);
  if (config->max_regions_per_uid() == 0) config->set_max_regions_per_uid(16384);
  if (config->max_regions_per_session() > (1u << 20)) {
    return absl::InvalidArgumentError("max_regions_per_session: at most 1048576");
  }
  if (config->max_regions_per_uid() > (1u << 20)) {
    return absl::InvalidArgumentError("max_regions_per_uid: at most 1048576");
  }
  if (config->max_region_mappings() > (1u << 20)) {
    // The SIGBUS guard's table holds 2^20 host mappings (daemon/regions/sigbus_guard.h).
    return absl::InvalidArgumentError("max_region_mappings: at most 1048576");
  }
  for (const auto& [node, address] : config->peers()) {
    if (node.empty() || address.empty() || address.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("peers[", node, "]: the address must be host:port, got '", address, "'"));
    }
  }
  if (absl::Status hot_restart = FinalizeHotRestart(config); !hot_restart.ok()) {
    return hot_restart;
  }
  if (absl::Status etcd = FinalizeEtcd(config); !etcd.ok()) return etcd;
  if (absl::Status peers = CheckPeerSecurity(*config); !peers.ok()) return peers;
  return FinalizeFabric(config);
}

}  // namespace kvrail::config

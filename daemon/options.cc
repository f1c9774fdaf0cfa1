#include "daemon/options.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/config/config.h"
#include "daemon/metrics/build_info.h"

namespace kvrail::daemon {

topology::DiscoverOptions DiscoverOptionsFrom(const v1::DaemonConfig& config) {
  topology::DiscoverOptions options;
  options.mps_pipe_directory = config.cuda_mps_pipe_directory();
  return options;
}

metrics::MpsProbeOptions MpsProbeOptionsFrom(const v1::DaemonConfig& config, uid_t daemon_uid) {
  metrics::MpsProbeOptions options;
  options.daemon_uid = daemon_uid;
  options.pipe_directory = config.cuda_mps_pipe_directory();
  return options;
}

regions::RegionLimits RegionLimitsFrom(const v1::DaemonConfig& config) {
  regions::RegionLimits limits;
  limits.max_regions_per_session = config.max_regions_per_session();
  limits.max_regions_per_uid = config.max_regions_per_uid();
  limits.max_mapped_bytes_per_uid = config.max_mapped_bytes_per_uid();
  limits.max_region_mappings = config.max_region_mappings();
  return limits;
}

engine::PriorityLimits PriorityLimitsFrom(const v1::DaemonConfig& config) {
  engine::PriorityLimits limits;
  const v1::ClassLimits* by_class[] = {&config.critical_limits(), &config.normal_limits(),
                                       &config.background_limits()};
  for (int c = 0; c < engine::kNumPriorityClasses; ++c) {
    limits[c].max_ctas = by_class[c]->max_ctas();
    limits[c].max_inflight_bytes = by_class[c]->max_inflight_bytes();
  }
  return limits;
}

HostEngineOptions HostEngineOptionsFrom(const v1::DaemonConfig& config) {
  HostEngineOptions options;
  options.threads = static_cast<int>(config.host_engine_threads());
  options.limits = PriorityLimitsFrom(config);
  options.inline_max_bytes = config.host_inline_max_bytes();
  return options;
}

PredictiveWakeOptions PredictiveWakeOptionsFrom(const v1::DaemonConfig& config) {
  // Config defaults and bounds them (config.cc).
  PredictiveWakeOptions options;
  options.margin = absl::Microseconds(config.predictive_wake_margin_us());
  options.tolerance = absl::Microseconds(config.predictive_wake_tolerance_us());
  options.max_gap = absl::Microseconds(config.predictive_wake_max_gap_us());
  return options;
}

engine::CudaEngineOptions CudaEngineOptionsFrom(const v1::DaemonConfig& config) {
  engine::CudaEngineOptions options;
  options.max_ctas = static_cast<int>(config.cuda_max_ctas());
  options.fixed_ctas = static_cast<int>(config.cuda_fixed_ctas());
  options.copy_engine_min_run_bytes = config.cuda_copy_engine_min_run_bytes();
  options.copy_only_kernel_ctas = static_cast<int>(config.cuda_copy_only_kernel_ctas());
  options.copy_only_kernel_below_run_bytes = config.cuda_copy_only_kernel_below_run_bytes();
  options.warm_up = config.cuda_warm_up();
  options.copy_split_max_percent = static_cast<int>(config.cuda_copy_split_max_percent());
  options.copy_split_fixed_percent = static_cast<int>(config.cuda_copy_split_fixed_percent());
  options.stream_wait = config.cuda_stream_wait();
  options.stream_wait_jobs = static_cast<int>(config.cuda_stream_wait_jobs());
  options.run_on_destination = config.cuda_run_on() == "destination";
  options.batch_bytes = config.cuda_batch_bytes();
  options.limits = PriorityLimitsFrom(config);
  // Unset: one CTA per SM of each GPU (the engine asks the GPU).
  options.critical_ctas =
      config.has_cuda_critical_ctas() ? static_cast<int>(config.cuda_critical_ctas()) : -1;
  options.wake_on_submit = config.cuda_wake_on_submit();
  options.done_words = config.cuda_done_words();
  options.warm_plans = config.cuda_warm_plans();
  // Config defaults the spin by low_latency (config.cc) and bounds both.
  options.dispatcher_spin_us =
      static_cast<int>(std::min(config.cuda_dispatcher_spin_us(), config::kMaxSpinUs));
  options.dispatcher_spin_budget =
      std::min<uint32_t>(config.cuda_dispatcher_spin_budget_percent(), 100) / 100.0;
  options.predictive_wake = config.predictive_wake();
  options.wake = PredictiveWakeOptionsFrom(config);
  if (!config.low_latency()) options.staged_plan_upload = false;
  return options;
}

fabric::FabricOptions FabricOptionsFrom(const v1::DaemonConfig& config,
                                        const v1::GetTopologyResponse& topology) {
  const v1::FabricConfig& fc = config.fabric();
  fabric::FabricOptions options;
  options.node_id = config.node_id();
  options.software_version = build::kVersion;
  options.provider = fc.provider();
  options.nic_addresses.assign(fc.nics().begin(), fc.nics().end());
  options.slots = fc.slots();
  options.slot_bytes = fc.slot_bytes();
  options.liveness_timeout = absl::Milliseconds(fc.liveness_timeout_ms());
  options.heartbeat_interval = absl::Milliseconds(fc.heartbeat_interval_ms());
  options.lane_timeout = absl::Milliseconds(fc.lane_timeout_ms());
  options.lane_cooldown = absl::Milliseconds(fc.lane_cooldown_ms());
  options.relay = fc.relay();
  options.gpu_pack_kernels = fc.gpu_pack() != "copy";
  options.topology_summary =
      absl::StrCat(topology.desc().gpus_size(), " GPUs, ", topology.desc().nics_size(), " NICs");
  // Rail-aware lane choice (daemon/fabric/lane_route.h): lanes mapped to this topology's NICs.
  options.topology = std::make_shared<const v1::TopologyDesc>(topology.desc());
  return options;
}

directory::EtcdClientOptions EtcdClientOptionsFrom(const v1::DaemonConfig& config) {
  directory::EtcdClientOptions options;
  options.endpoints.assign(config.etcd().endpoints().begin(), config.etcd().endpoints().end());
  options.username = config.etcd().username();
  return options;
}

directory::NodeRecordInputs NodeRecordInputsFrom(const v1::DaemonConfig& config,
                                                 const v1::GetTopologyResponse& topology,
                                                 const std::string& instance_id,
                                                 const std::string& build_info) {
  directory::NodeRecordInputs record;
  record.node_id = config.node_id();
  record.address = config.etcd().advertise_address();
  record.instance_id = instance_id;
  record.build_info = build_info;
  record.fabric_addresses.assign(config.fabric().nics().begin(), config.fabric().nics().end());
  record.topology = topology.desc();
  record.graph = topology.graph();
  return record;
}

directory::EtcdDirectoryOptions EtcdDirectoryOptionsFrom(
    const v1::DaemonConfig& config, const directory::NodeRecordInputs& record) {
  directory::EtcdDirectoryOptions options;
  options.self = config.node_id();
  options.prefix = config.etcd().prefix();
  options.ttl_s = config.etcd().ttl_s();
  options.record = directory::BuildNodeRecord(record);
  options.static_peers = {config.peers().begin(), config.peers().end()};
  options.endpoints.assign(config.etcd().endpoints().begin(), config.etcd().endpoints().end());
  return options;
}

transfers::Options TransferOptionsFrom(const v1::DaemonConfig& config,
                                       const v1::GetTopologyResponse& topology) {
  transfers::Options options;
  options.node_id = config.node_id();
  options.topology = topology.desc();
  options.topology_graph = topology.graph();
  options.tile_bytes = config.tile_bytes();
  options.defer_id_checks_from = config.defer_id_checks_from();
  options.history = config.transfer_history();
  options.max_transfers_per_session = config.max_transfers_per_session();
  options.max_prepared_per_session = config.max_prepared_per_session();
  options.max_list_transfers = config.max_list_transfers();
  return options;
}

size_t MaxSessionsFrom(const v1::DaemonConfig& config, uint64_t fd_limit) {
  if (config.max_sessions() != 0) return config.max_sessions();
  if (fd_limit == 0) return 65536;
  return static_cast<size_t>(std::clamp<uint64_t>(fd_limit / 4, 16, 65536));
}

size_t MaxSessionsPerUidFrom(const v1::DaemonConfig& config, size_t max_sessions) {
  if (config.max_sessions_per_uid() != 0) return config.max_sessions_per_uid();
  return std::clamp<size_t>(max_sessions / 4, 1, 256);
}

session::SessionServerOptions SessionOptionsFrom(const v1::DaemonConfig& config,
                                                 uint64_t fd_limit) {
  session::SessionServerOptions options;
  options.path = config.unix_socket() + ".session";
  options.mode = config.socket_mode();
  options.max_sessions = MaxSessionsFrom(config, fd_limit);
  options.max_sessions_per_uid = MaxSessionsPerUidFrom(config, options.max_sessions);
  options.max_waits_per_connection = config.max_watchers_per_session();
  options.max_waits_per_uid = config.max_watchers_per_uid();
  // The poll thread's spin after a packet (a critical-path measure; off with the engine's).
  if (config.low_latency()) options.spin = absl::Microseconds(100);
  options.admission_workers = config.session_admission_workers();
  options.admission_bulk_workers = config.session_admission_bulk_workers();
  options.admission_bulk_deadline = absl::Milliseconds(config.session_admission_bulk_deadline_ms());
  options.submission_queue = config.session_submission_queue();
  // Config defaults it by low_latency (config.cc) and bounds it.
  options.submission_spin =
      absl::Microseconds(std::min(config.session_submission_spin_us(), config::kMaxSpinUs));
  options.spin_budget = std::min<uint32_t>(config.session_spin_budget_percent(), 100) / 100.0;
  options.spin_free = absl::Microseconds(config.session_spin_free_us());
  options.predictive_wake = config.predictive_wake();
  options.wake = PredictiveWakeOptionsFrom(config);
  return options;
}

server::ServerOptions ServerOptionsFrom(const v1::DaemonConfig& config) {
  server::ServerOptions options;
  options.version = build::kVersion;
  options.node_id = config.node_id();
  if (!config.tcp_listen().empty()) options.listen.push_back(config.tcp_listen());
  options.tcp_serves_api = config.tcp_serves_api();
  options.max_watchers_per_session = config.max_watchers_per_session();
  options.max_watchers_per_uid = config.max_watchers_per_uid();
  for (const auto& [node, address] : config.peers()) {
    v1::PeerInfo peer;
    peer.set_node_id(node);
    peer.set_address(address);
    peer.set_state(v1::PEER_STATE_UNKNOWN);
    options.peers.push_back(peer);
  }
  return options;
}

metrics::MetricsOptions MetricsOptionsFrom(const v1::DaemonConfig& config, int gpus,
                                           int cuda_gpus) {
  metrics::MetricsOptions options;
  options.listen = config.metrics_listen();
  options.tls_cert_file = config.metrics_tls().cert_file();
  options.tls_key_file = config.metrics_tls().key_file();
  options.tls_client_ca_file = config.metrics_tls().client_ca_file();
  options.version = build::kVersion;
  options.gpus = gpus;
  options.cuda_gpus = cuda_gpus;
  options.cuda_mode = config.cuda_engine();
  return options;
}

handover::HotRestartOptions HotRestartOptionsFrom(const v1::DaemonConfig& config) {
  handover::HotRestartOptions options;
  options.listen_path = handover::HandoverSocketPath(config.unix_socket());
  const std::string& take_over = config.take_over();
  options.cold_when_nobody_answers = take_over == "auto";
  if (!take_over.empty()) {
    options.take_over_path = take_over == "auto" ? options.listen_path : take_over;
  }
  const absl::Duration timeout = absl::Milliseconds(config.handover_timeout_ms());
  options.bundle_timeout = absl::Milliseconds(config.drain_timeout_ms()) + timeout;
  options.commit_timeout = timeout;
  options.linger_after_handover = config.linger_after_handover();
  return options;
}

}  // namespace kvrail::daemon

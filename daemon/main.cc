// kvraild: wiring only. Reads the config, discovers (or replays) the topology, starts the region
// table, the session socket, the engine, the transfer manager and the gRPC server, then waits
// for SIGTERM/SIGINT and drains.
#include <signal.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/logging_systemd.h"
#include "base/status.h"
#include "daemon/config/config.h"
#include "daemon/directory/directory.h"
#include "daemon/directory/etcd_directory.h"
#include "daemon/directory/node_record.h"
#include "daemon/engine/cuda/cuda_engine.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/host_engine.h"
#include "daemon/metrics/build_info.h"
#include "daemon/metrics/metrics.h"
#include "daemon/metrics/mps.h"
#include "daemon/fabric/fabric.h"
#include "daemon/fabric/peer_tls.h"
#include "daemon/regions/regions.h"
#include "daemon/server/private_bind.h"
#include "daemon/server/server.h"
#include "daemon/server/socket_lock.h"
#include "daemon/session/session_server.h"
#include "daemon/transfers/transfers.h"
#include "spdlog/spdlog.h"
#include "topology/topology.h"

namespace kvrail {
namespace {

// KVRAILD_LOW_LATENCY=off: the critical-path measures off (the CUDA dispatcher's idle
// spin, staged plan uploads, the session poll thread's spin), for before/after measurements.
bool LowLatencyOff() {
  const char* v = std::getenv("KVRAILD_LOW_LATENCY");
  return v != nullptr && std::string(v) == "off";
}

constexpr const char* kVersion = build::kVersion;

absl::StatusOr<v1::GetTopologyResponse> LoadTopology(const v1::DaemonConfig& config) {
  v1::GetTopologyResponse response;
  if (!config.topology_file().empty()) {
    KVRAIL_ASSIGN_OR_RETURN(*response.mutable_desc(), topology::LoadTopologyFile(config.topology_file()));
    response.set_source(config.topology_file());
  } else {
    KVRAIL_ASSIGN_OR_RETURN(*response.mutable_desc(), topology::Discover(topology::DiscoverOptions{}));
    response.set_source("discovered");
  }
  *response.mutable_graph() = topology::ComputeGraph(response.desc());
  return response;
}

// The inter-node path when peers are configured or etcd finds them (nullptr otherwise).
absl::StatusOr<std::unique_ptr<fabric::Fabric>> StartFabric(const v1::DaemonConfig& config,
                                                            const v1::GetTopologyResponse& topology,
                                                            regions::RegionTable* regions,
                                                            directory::Directory* directory,
                                                            std::shared_ptr<const fabric::PeerTlsPem> tls) {
  // With etcd, peers join later (the fabric takes them from Directory::Peers()): start anyway.
  if (directory->Peers().empty() && !config.has_etcd()) return std::unique_ptr<fabric::Fabric>();
  const v1::FabricConfig& fc = config.fabric();
  fabric::FabricOptions options;
  options.node_id = config.node_id();
  options.tls = std::move(tls);
  options.software_version = kVersion;
  if (!fc.provider().empty()) options.provider = fc.provider();
  options.nic_addresses.assign(fc.nics().begin(), fc.nics().end());
  if (options.nic_addresses.empty()) {
    const std::string& listen = config.tcp_listen();
    const std::string host = listen.substr(0, listen.rfind(':'));
    if (host.empty() || host == "0.0.0.0") {
      return absl::InvalidArgumentError("fabric.nics: set it, or tcp_listen to a host address");
    }
    options.nic_addresses.push_back(host);
  }
  if (fc.slots() != 0) options.slots = fc.slots();
  if (fc.slot_bytes() != 0) options.slot_bytes = fc.slot_bytes();
  if (fc.liveness_timeout_ms() != 0) {
    options.liveness_timeout = absl::Milliseconds(fc.liveness_timeout_ms());
  }
  if (fc.heartbeat_interval_ms() != 0) {
    options.heartbeat_interval = absl::Milliseconds(fc.heartbeat_interval_ms());
  }
  if (fc.lane_timeout_ms() != 0) options.lane_timeout = absl::Milliseconds(fc.lane_timeout_ms());
  if (fc.lane_cooldown_ms() != 0) {
    options.lane_cooldown = absl::Milliseconds(fc.lane_cooldown_ms());
  }
  options.topology_summary = absl::StrCat(topology.desc().gpus_size(), " GPUs, ",
                                          topology.desc().nics_size(), " NICs");
  // Rail-aware lane choice (daemon/fabric/lane_route.h): lanes mapped to this topology's NICs.
  options.topology = std::make_shared<const v1::TopologyDesc>(topology.desc());
  return fabric::Fabric::Create(options, regions, directory);
}

// The etcd directory (DaemonConfig.etcd; docs/fabric.md, "Directory"): registers this node's
// record (Peer address, NICs with rails, GPUs by UUID, boot id, build) and follows the others.
absl::StatusOr<std::unique_ptr<directory::Directory>> StartEtcdDirectory(
    const v1::DaemonConfig& config, const v1::GetTopologyResponse& topology,
    const std::string& instance_id, const std::string& build_info) {
  const v1::EtcdDirectoryConfig& etcd = config.etcd();
  directory::EtcdClientOptions client_options;
  client_options.endpoints.assign(etcd.endpoints().begin(), etcd.endpoints().end());
  const std::pair<const char*, const std::string*> files[] = {
      {"etcd.ca_file", &etcd.ca_file()}, {"etcd.cert_file", &etcd.cert_file()},
      {"etcd.key_file", &etcd.key_file()}};
  std::string* pems[] = {&client_options.ca_pem, &client_options.cert_pem,
                         &client_options.key_pem};
  for (int i = 0; i < 3; ++i) {
    if (files[i].second->empty()) continue;
    std::ifstream in(*files[i].second);
    std::stringstream text;
    text << in.rdbuf();
    if (!in || text.str().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(files[i].first, ": cannot read ", *files[i].second));
    }
    *pems[i] = text.str();
  }
  if (client_options.ca_pem.empty() && client_options.cert_pem.empty()) {
    spdlog::warn("etcd.*_file: not set: the etcd directory talks to {} in plaintext (anyone on "
                 "the path can read and forge node records); set etcd.ca_file (and "
                 "etcd.cert_file/key_file for client certificates)",
                 absl::StrJoin(client_options.endpoints, ","));
  }
  if (!etcd.username().empty()) {
    // etcd user/password authentication; the password is never logged.
    client_options.username = etcd.username();
    KVRAIL_ASSIGN_OR_RETURN(client_options.password,
                            directory::ReadEtcdPasswordFile(etcd.password_file()));
    if (client_options.ca_pem.empty()) {
      spdlog::warn("etcd.username: the password goes to etcd in plaintext; set etcd.ca_file");
    }
  }
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<directory::EtcdClient> client,
                          directory::CreateGrpcEtcdClient(client_options));
  directory::NodeRecordInputs record;
  record.node_id = config.node_id();
  record.address = etcd.advertise_address();
  record.instance_id = instance_id;
  record.build_info = build_info;
  record.fabric_addresses.assign(config.fabric().nics().begin(), config.fabric().nics().end());
  if (record.fabric_addresses.empty()) {
    record.fabric_addresses.push_back(
        config.tcp_listen().substr(0, config.tcp_listen().rfind(':')));
  }
  record.topology = topology.desc();
  record.graph = topology.graph();
  record.now = absl::Now();
  directory::EtcdDirectoryOptions options;
  options.self = config.node_id();
  options.prefix = etcd.prefix();
  options.ttl_s = etcd.ttl_s();
  options.record = directory::BuildNodeRecord(record);
  options.static_peers = {config.peers().begin(), config.peers().end()};
  options.endpoints = client_options.endpoints;
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<directory::Directory> directory,
                          directory::CreateEtcdDirectory(std::move(options), std::move(client)));
  const v1::DirectoryStatus status = directory->Status();
  spdlog::info("etcd directory: {} at {}, prefix {}, TTL {} s: {}{}{}; {} peers", status.kind(),
               absl::StrJoin(etcd.endpoints(), ","), etcd.prefix(), etcd.ttl_s(), status.state(),
               status.reason().empty() ? "" : ": ", status.reason(), status.peers());
  return directory;
}

// Blocks SIGTERM/SIGINT in every thread (call before starting any) so sigwait receives them.
// The node's GPUs by UUID, for regions named by RegionSpec.device_uuid.
std::vector<regions::GpuName> GpuNames(const v1::TopologyDesc& desc) {
  std::vector<regions::GpuName> gpus;
  for (const v1::Gpu& gpu : desc.gpus()) {
    if (!gpu.uuid().empty()) gpus.push_back({gpu.uuid(), gpu.cuda_ordinal()});
  }
  return gpus;
}

// File descriptors: the soft RLIMIT_NOFILE raised to the hard limit, so sessions, regions and
// gRPC connections have room; the session caps keep a share of it free (MaxSessions).
void RaiseFdLimit() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t before = limit.rlim_cur;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) limit.rlim_cur = before;
  }
  spdlog::info("file descriptors: RLIMIT_NOFILE {} (was {})", limit.rlim_cur, before);
}

// DaemonConfig.max_sessions, or when 0 a quarter of RLIMIT_NOFILE (at least 16, at most 65536).
size_t MaxSessions(const v1::DaemonConfig& config) {
  if (config.max_sessions() != 0) return config.max_sessions();
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 65536;
  return std::clamp<size_t>(limit.rlim_cur / 4, 16, 65536);
}

sigset_t BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

// Exit statuses: 1 a start error (the message names the setting), 3 cuda_engine: required and the
// CUDA engine did not start (the supervisor restarts kvraild with its back-off).
constexpr int kExitStartFailed = 1;
constexpr int kExitCudaRequired = 3;

absl::Status Run(v1::DaemonConfig config, int* exit_code) {
  const sigset_t signals = BlockShutdownSignals();
  KVRAIL_RETURN_IF_ERROR(SetUpLogging(config.log_level(), config.log_format()));
  RaiseFdLimit();
  spdlog::info("kvraild {} starting: node '{}', socket {}", kVersion, config.node_id(),
               config.unix_socket());
  // One daemon per socket, decided before anything at that path is unlinked or bound. Declared
  // first so that it is released last, after the sockets are removed on the way out.
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<server::SocketLock> socket_lock,
                          server::SocketLock::Acquire(config.unix_socket()));

  KVRAIL_ASSIGN_OR_RETURN(v1::GetTopologyResponse topology, LoadTopology(config));
  spdlog::info("topology ({}): {} GPUs, {} NICs", topology.source(), topology.desc().gpus_size(),
               topology.desc().nics_size());

  Clock* clock = Clock::Real();
  const int64_t started_us = clock->NowUnixMicros();
  // Stats that do not change while the daemon runs (GetStats and the metrics answer them).
  v1::Stats stats_base;
  stats_base.set_build_info(build::Info("kvraild"));
  metrics::MpsProbeOptions mps_options;
  mps_options.daemon_uid = ::getuid();
  mps_options.pipe_directory = config.cuda_mps_pipe_directory();
  *stats_base.mutable_mps() = metrics::ProbeMps(mps_options);
  if (metrics::MpsNeedsAttention(stats_base.mps())) {
    spdlog::warn("CUDA MPS ({}): {}", stats_base.mps().pipe_directory(), stats_base.mps().verdict());
  } else if (stats_base.mps().active()) {
    spdlog::info("CUDA MPS ({}): {}", stats_base.mps().pipe_directory(), stats_base.mps().verdict());
  }
  // This process's instance, in session greetings and Stats: a client that sees it change (or
  // its session socket close) knows its regions are gone. Ids count from random bases so that a
  // stale id from the previous instance names nothing here.
  const std::string instance_id = session::NewInstanceId();
  spdlog::info("instance {}", instance_id);
  regions::RegionLimits region_limits;  // docs/security.md, "Memory"
  region_limits.max_regions_per_session = config.max_regions_per_session();
  region_limits.max_regions_per_uid = config.max_regions_per_uid();
  region_limits.max_mapped_bytes_per_uid = config.max_mapped_bytes_per_uid();
  region_limits.max_region_mappings = config.max_region_mappings();
  std::unique_ptr<regions::RegionTable> regions = regions::RegionTable::Create(
      clock, regions::RandomIdBases(), GpuNames(topology.desc()), region_limits);
  // Per-class limits, indexed by engine::PriorityClass (critical, normal, background).
  engine::PriorityLimits limits;
  const v1::ClassLimits* by_class[] = {&config.critical_limits(), &config.normal_limits(),
                                       &config.background_limits()};
  for (int c = 0; c < engine::kNumPriorityClasses; ++c) {
    limits[c].max_ctas = by_class[c]->max_ctas();
    limits[c].max_inflight_bytes = by_class[c]->max_inflight_bytes();
  }
  std::unique_ptr<engine::Engine> engine =
      engine::CreateHostEngine(static_cast<int>(config.host_engine_threads()), limits);
  // Read once: the CUDA engine's measures and the session poll thread's spin follow one value.
  const bool low_latency_off = LowLatencyOff();
  std::unique_ptr<engine::Engine> cuda_engine;
  if (config.cuda_engine() != "off") {
    engine::CudaEngineOptions cuda_options;
    cuda_options.max_ctas = static_cast<int>(config.cuda_max_ctas());
    cuda_options.fixed_ctas = static_cast<int>(config.cuda_fixed_ctas());
    cuda_options.copy_engine_min_run_bytes = config.cuda_copy_engine_min_run_bytes();
    cuda_options.copy_only_kernel_ctas = static_cast<int>(config.cuda_copy_only_kernel_ctas());
    cuda_options.copy_only_kernel_below_run_bytes = config.cuda_copy_only_kernel_below_run_bytes();
    cuda_options.warm_up = !config.has_cuda_warm_up() || config.cuda_warm_up();
    cuda_options.copy_split_max_percent = static_cast<int>(config.cuda_copy_split_max_percent());
    cuda_options.copy_split_fixed_percent = static_cast<int>(config.cuda_copy_split_fixed_percent());
    cuda_options.stream_wait = config.has_cuda_stream_wait() && config.cuda_stream_wait();
    if (config.cuda_stream_wait_jobs() > 0) {
      cuda_options.stream_wait_jobs = static_cast<int>(config.cuda_stream_wait_jobs());
    }
    cuda_options.run_on_destination = config.cuda_run_on() == "destination";
    cuda_options.batch_bytes = config.cuda_batch_bytes();
    cuda_options.limits = limits;
    // Unset: one CTA per SM of each GPU (the engine asks the GPU).
    cuda_options.critical_ctas =
        config.has_cuda_critical_ctas() ? static_cast<int>(config.cuda_critical_ctas()) : -1;
    cuda_options.wake_on_submit = !config.has_cuda_wake_on_submit() || config.cuda_wake_on_submit();
    if (low_latency_off) {
      cuda_options.dispatcher_spin_us = 0;
      cuda_options.staged_plan_upload = false;
    }
    absl::StatusOr<std::unique_ptr<engine::Engine>> created =
        engine::CreateCudaEngine(cuda_options);
    if (created.ok()) {
      cuda_engine = *std::move(created);
      spdlog::info("CUDA engine: {}", cuda_engine->Describe());
      if (cuda_engine->gpu_count() < topology.desc().gpus_size()) {
        spdlog::warn("CUDA engine: runs on {} of the {} GPUs the topology shows (CUDA sees fewer: "
                     "NVIDIA_VISIBLE_DEVICES, CDI devices or CUDA_VISIBLE_DEVICES); transfers on "
                     "the others are refused",
                     cuda_engine->gpu_count(), topology.desc().gpus_size());
      }
    } else if (config.cuda_engine() == "required") {
      // Not served without its GPUs: a daemon that answered health checks here would be taken
      // for working. CUDA's initialisation error is sticky within a process, so the retry is a
      // new process: systemd's Restart= and the kubelet's crash-loop back-off pace it.
      *exit_code = kExitCudaRequired;
      return absl::FailedPreconditionError(
          absl::StrCat("cuda_engine: required, but the CUDA engine did not start: ",
                       created.status().ToString(),
                       " (kvraild exits; its supervisor retries with back-off)"));
    } else {
      spdlog::warn("no CUDA engine (cuda_engine: auto): {}; kvraild serves host memory only and "
                   "refuses GPU regions (set cuda_engine: required on GPU nodes so this fails "
                   "the start instead)",
                   created.status().ToString());
    }
  }
  const int cuda_gpus = cuda_engine ? cuda_engine->gpu_count() : 0;
  std::unique_ptr<directory::Directory> directory;
  if (config.has_etcd()) {
    KVRAIL_ASSIGN_OR_RETURN(directory, StartEtcdDirectory(config, topology, instance_id,
                                                          stats_base.build_info()));
  } else {
    directory = directory::CreateStaticDirectory({config.peers().begin(), config.peers().end()},
                                                 config.node_id());
  }
  // Peers authenticate with mTLS (docs/security.md, "Peers"); FinalizeConfig refused TCP or
  // peers with neither peer_tls nor insecure_peers.
  std::shared_ptr<const fabric::PeerTlsPem> peer_tls;
  if (!config.peer_tls().ca_file().empty()) {
    KVRAIL_ASSIGN_OR_RETURN(peer_tls, fabric::LoadPeerTls(config.peer_tls()));
    spdlog::info("peers: mTLS (CA {}, certificate {}: its CN must be '{}')",
                 config.peer_tls().ca_file(), config.peer_tls().cert_file(), config.node_id());
  } else if (config.insecure_peers()) {
    spdlog::warn("insecure_peers: tcp_listen and the channels to peers are plaintext; any host "
                 "that reaches {} may claim any node id (tests and closed networks only)",
                 config.tcp_listen().empty() ? std::string("the peers") : config.tcp_listen());
  }
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<fabric::Fabric> fabric,
                          StartFabric(config, topology, regions.get(), directory.get(), peer_tls));
  // Notification queues live as long as their sessions (a session's end drops its queue).
  std::unique_ptr<transfers::NotificationHub> notifications = transfers::NotificationHub::Create(
      [table = regions.get()](uint64_t session) { return table->SessionOpen(session); });
  regions->AddSessionEndHook([hub = notifications.get()](uint64_t s) { hub->EndSession(s); });
  transfers::Options transfer_options;
  transfer_options.notifications = notifications.get();
  transfer_options.node_id = config.node_id();
  transfer_options.remote = fabric.get();
  transfer_options.cuda_engine = cuda_engine.get();
  transfer_options.topology = topology.desc();
  transfer_options.topology_graph = topology.graph();
  transfer_options.tile_bytes = config.tile_bytes();
  transfer_options.defer_id_checks_from = config.defer_id_checks_from();
  transfer_options.history = config.transfer_history();
  transfer_options.max_transfers_per_session = config.max_transfers_per_session();
  transfer_options.max_list_transfers = config.max_list_transfers();
  // Metrics count transfers as they end; the endpoint starts once the manager exists.
  std::atomic<metrics::Metrics*> metrics_sink{nullptr};
  transfer_options.on_finished = [&metrics_sink](const v1::TransferStatus& status) {
    if (metrics::Metrics* m = metrics_sink.load(std::memory_order_acquire)) m->OnTransferFinished(status);
    // One line per transfer at debug (info would flood the journal at serving rates).
    LogFields(spdlog::level::debug, "transfer ended",
              {{"transfer_id", status.transfer_id()},
               {"state", metrics::ResultLabel(status.state())},
               {"path", metrics::PathLabel(status.path())},
               {"priority", metrics::PriorityLabel(status.spec().priority())},
               {"bytes", status.bytes_done()},
               {"seconds", status.finished_unix_us() > status.submitted_unix_us()
                               ? (status.finished_unix_us() - status.submitted_unix_us()) / 1e6
                               : 0.0},
               {"engine", status.engine()}});
  };
  std::unique_ptr<transfers::TransferManager> transfers =
      transfers::TransferManager::Create(regions.get(), engine.get(), clock, transfer_options);
  // Inbound fabric transfers are recorded by the manager; detached before it is destroyed.
  struct DetachSink {
    fabric::Fabric* fabric;
    ~DetachSink() {
      if (fabric != nullptr) fabric->SetInboundSink(nullptr);
    }
  } detach_sink{fabric.get()};
  if (fabric) fabric->SetInboundSink(transfers.get());
  std::unique_ptr<metrics::Metrics> metrics;
  if (!config.metrics_listen().empty()) {
    metrics::MetricsOptions metrics_options;
    metrics_options.listen = config.metrics_listen();
    metrics_options.version = kVersion;
    metrics_options.build_info = stats_base.build_info();
    metrics_options.gpus = topology.desc().gpus_size();
    metrics_options.cuda_gpus = cuda_gpus;
    metrics_options.cuda_mode = config.cuda_engine();
    if (fabric) metrics_options.peers = [d = directory.get()] { return d->List(); };
    metrics_options.stats = [&] {
      v1::Stats stats = stats_base;
      stats.set_version(kVersion);
      stats.set_started_unix_us(started_us);
      stats.set_node_id(config.node_id());
      stats.set_instance_id(instance_id);
      stats.set_regions(regions->size());
      transfers->FillStats(&stats);
      *stats.mutable_directory() = directory->Status();
      return stats;
    };
    KVRAIL_ASSIGN_OR_RETURN(metrics, metrics::Metrics::Start(std::move(metrics_options)));
    metrics_sink.store(metrics.get(), std::memory_order_release);
    spdlog::info("metrics on {} (port {})", config.metrics_listen(), metrics->port());
  }

  // A session's end fails the transfers waiting for readiness only it could give.
  regions->AddSessionEndHook([t = transfers.get()](uint64_t s) { t->EndSession(s); });
  session::SessionServerOptions session_options;
  session_options.path = config.unix_socket() + ".session";
  session_options.mode = config.socket_mode();
  session_options.instance_id = instance_id;
  session_options.submit = [&transfers](const v1::TransferSpec& spec) {
    return transfers->SubmitWithinNode(spec);
  };
  session_options.wait = [&transfers](const regions::Caller& caller, uint64_t id,
                                      std::function<void(const v1::TransferStatus&)> done) {
    KVRAIL_RETURN_IF_ERROR(transfers->Authorize(id, caller, transfers::TransferUse::kRead));
    return transfers->WhenEnded(id, std::move(done));
  };
  session_options.follow = [&transfers](const regions::Caller& caller, uint64_t id,
                                        std::function<void(const v1::TransferStatus&)> done) {
    KVRAIL_RETURN_IF_ERROR(transfers->Authorize(id, caller, transfers::TransferUse::kRead));
    return transfers->WhenEnded(id, std::move(done), /*counted=*/false);
  };
  session_options.max_sessions = MaxSessions(config);
  // The poll thread's spin after a packet (a critical-path measure; off with the engine's).
  if (!low_latency_off) session_options.spin = absl::Microseconds(100);
  session_options.max_sessions_per_uid = config.max_sessions_per_uid();
  spdlog::info("caps: {} sessions ({} per uid), {} transfers in flight and {} waits/watches per "
               "session", session_options.max_sessions, session_options.max_sessions_per_uid,
               config.max_transfers_per_session(), config.max_watchers_per_session());
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<session::SessionServer> sessions,
                          session::SessionServer::Start(session_options, regions.get()));

  server::ServerOptions server_options;
  server_options.version = kVersion;
  server_options.node_id = config.node_id();
  server_options.instance_id = instance_id;
  server_options.stats_base = stats_base;
  server_options.notifications = notifications.get();
  server_options.topology = topology;
  // gRPC binds its socket in a private directory; it is renamed into place with its mode below
  // (never reachable with the umask's permissions).
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<server::PrivateBind> grpc_bind,
                          server::PrivateBind::Create(config.unix_socket()));
  server_options.listen.push_back("unix:" + grpc_bind->bind_path());
  if (!config.tcp_listen().empty()) server_options.listen.push_back(config.tcp_listen());
  server_options.tcp_serves_api = config.tcp_serves_api();
  server_options.max_watchers_per_session = config.max_watchers_per_session();
  server_options.tcp_credentials = fabric::PeerServerCredentials(peer_tls);
  if (config.tcp_serves_api()) {
    spdlog::warn("tcp_serves_api: Transfer and Admin answer on {} too (anonymous callers: they "
                 "reach regions only through grants)", config.tcp_listen());
  }
  for (const auto& [node, address] : config.peers()) {
    v1::PeerInfo peer;
    peer.set_node_id(node);
    peer.set_address(address);
    peer.set_state("unknown");
    server_options.peers.push_back(peer);
  }
  server_options.directory_status = [d = directory.get()] { return d->Status(); };
  if (fabric) {
    server_options.list_peers = [d = directory.get()] { return d->List(); };
    server_options.extra_services.push_back(fabric->peer_service());
  }
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<server::Server> server,
                   server::Server::Start(server_options, regions.get(), transfers.get()));
  KVRAIL_RETURN_IF_ERROR(grpc_bind->Publish(config.socket_mode()));
  grpc_bind.reset();
  if (server->tcp_port() != 0) spdlog::info("listening on TCP port {}", server->tcp_port());
  // The health service's "kvrail.v1.Directory" follows the directory (ok / degraded); the
  // listener is removed before the server goes away.
  directory->SetStateListener([s = server.get()](const v1::DirectoryStatus& status) {
    s->SetDirectoryServing(status.state() == "ok");
  });
  struct ClearListener {
    directory::Directory* directory;
    ~ClearListener() { directory->SetStateListener(nullptr); }
  } clear_listener{directory.get()};
  server->SetDirectoryServing(directory->Status().state() == "ok");
  if (fabric) fabric->StartLiveness();
  spdlog::info("ready: {} ({}{}{})", config.unix_socket(), engine->Describe(),
               cuda_engine ? "; " : "", cuda_engine ? cuda_engine->Describe() : "");

  // systemd (Type=notify): ready now; the status line is refreshed every 10 s until a signal.
  auto summary = [&] {
    v1::Stats stats;
    transfers->FillStats(&stats);
    return absl::StrCat("serving ", config.unix_socket(), ": ", regions->size(), " regions, ",
                        stats.transfers_active(), " transfers active, ",
                        stats.transfers_succeeded(), " succeeded, ", stats.transfers_failed(),
                        " failed; ", stats.bytes_moved(), " bytes moved");
  };
  NotifyReady(summary());
  int signal_number = 0;
  const timespec refresh{10, 0};
  while ((signal_number = sigtimedwait(&signals, nullptr, &refresh)) < 0) NotifyStatus(summary());
  spdlog::info("signal {}: draining (up to {} ms)", signal_number, config.drain_timeout_ms());
  NotifyStopping(absl::StrCat("draining (up to ", config.drain_timeout_ms(), " ms)"));
  server->SetNotServing();
  transfers->Drain(absl::Milliseconds(config.drain_timeout_ms()));
  server->Shutdown(absl::Seconds(1));
  sessions.reset();
  ::unlink(config.unix_socket().c_str());
  ::unlink((config.unix_socket() + ".session").c_str());
  metrics_sink.store(nullptr, std::memory_order_release);
  metrics.reset();
  spdlog::info("stopped");
  return absl::OkStatus();
}

// A fatal start error on stderr: at error priority under journald ("<3>"), and one line whatever
// the message holds (a config parser's message may quote the file).
void ReportFatal(const std::string& message) {
  std::string line = StderrIsJournal() ? "<3>kvraild: " : "kvraild: ";
  for (char c : message) {
    if (c == '\n') {
      line += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      line += ' ';
    } else {
      line += c;
    }
  }
  line += '\n';
  std::fputs(line.c_str(), stderr);
}

// --check-config FILE: what kvraild would refuse in FILE at start, without starting anything:
// parsing (unknown fields, types), every setting FinalizeConfig checks, and log_level/log_format.
// Files the config names (certificates, etcd's password file) are read only at start.
int CheckConfig(const std::string& path) {
  absl::StatusOr<v1::DaemonConfig> config = config::LoadConfigFile(path);
  absl::Status status = config.status();
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
  app.add_option("--peer-cert", peer_cert, "peer_tls.cert_file: this node's certificate (CN = node id)");
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
  absl::Status status = kvrail::config::FinalizeConfig(&config);
  if (status.ok() && config.cuda_stream_wait() && config.cuda_engine() != "off") {
    // GPU-side readiness waits, before anything initializes CUDA: a lazy module
    // load synchronizes the context, i.e. would wait behind a pending wait (the one-GPU hang);
    // and with the default 8 hardware queues a pending wait could hold up other streams sharing
    // its queue. An operator's own setting wins.
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  }
  if (status.ok() && !config.cuda_mps_pipe_directory().empty() && config.cuda_engine() != "off") {
    // Before anything initializes CUDA: the client library finds the MPS server through it.
    setenv("CUDA_MPS_PIPE_DIRECTORY", config.cuda_mps_pipe_directory().c_str(), 1);
  }
  int exit_code = kvrail::kExitStartFailed;
  if (status.ok()) status = kvrail::Run(config, &exit_code);
  if (!status.ok()) {
    kvrail::ReportFatal(status.ToString());
    return exit_code;
  }
  return 0;
}

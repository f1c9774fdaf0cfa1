#include "daemon/daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/logging_systemd.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "daemon/access/access.h"
#include "daemon/directory/directory.h"
#include "daemon/directory/etcd_directory.h"
#include "daemon/directory/node_record.h"
#include "daemon/engine/cuda/cuda_engine.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/host_engine.h"
#include "daemon/fabric/fabric.h"
#include "daemon/fabric/peer_tls.h"
#include "daemon/handover/handover.h"
#include "daemon/metrics/build_info.h"
#include "daemon/metrics/metrics.h"
#include "daemon/metrics/mps.h"
#include "daemon/options.h"
#include "daemon/regions/regions.h"
#include "daemon/server/private_bind.h"
#include "daemon/server/server.h"
#include "daemon/server/socket_lock.h"
#include "daemon/session/session_server.h"
#include "daemon/sessions/sessions.h"
#include "daemon/transfers/transfers.h"
#include "spdlog/spdlog.h"
#include "topology/topology.h"

namespace kvrail::daemon {
namespace {

constexpr const char* kVersion = build::kVersion;
// The payload a Start error carries when its exit status is not kExitStartFailed.
constexpr char kExitCodePayload[] = "kvrail.daemon.exit_code";

sigset_t BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR2);  // a hot restart released this daemon (daemon/handover)
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

// File descriptors: the soft RLIMIT_NOFILE raised to the hard limit, so sessions, regions and
// gRPC connections have room. Returns the limit now in force (0: unlimited or unknown).
uint64_t RaiseFdLimit() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  const rlim_t before = limit.rlim_cur;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) limit.rlim_cur = before;
  }
  spdlog::info("file descriptors: RLIMIT_NOFILE {} (was {})", limit.rlim_cur, before);
  return limit.rlim_cur == RLIM_INFINITY ? 0 : static_cast<uint64_t>(limit.rlim_cur);
}

// The CUDA runtime's environment, before anything initializes CUDA. GPU-side readiness waits
// (cuda_stream_wait): a lazy module load synchronizes the context, i.e. would wait behind a
// pending wait (the one-GPU hang); and with the default 8 hardware queues a pending wait could
// hold up other streams sharing its queue (an operator's own setting wins). The MPS client
// library finds the MPS server through CUDA_MPS_PIPE_DIRECTORY.
void PrepareCudaEnvironment(const v1::DaemonConfig& config) {
  if (config.cuda_engine() == "off") return;
  if (config.cuda_stream_wait()) {
    ::setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  }
  ::setenv("CUDA_MPS_PIPE_DIRECTORY", config.cuda_mps_pipe_directory().c_str(), 1);
}

absl::StatusOr<v1::GetTopologyResponse> LoadTopology(const v1::DaemonConfig& config) {
  v1::GetTopologyResponse response;
  if (!config.topology_file().empty()) {
    KVRAIL_ASSIGN_OR_RETURN(*response.mutable_desc(),
                            topology::LoadTopologyFile(config.topology_file()));
    response.set_source(config.topology_file());
  } else {
    KVRAIL_ASSIGN_OR_RETURN(*response.mutable_desc(),
                            topology::Discover(DiscoverOptionsFrom(config)));
    response.set_source("discovered");
  }
  *response.mutable_graph() = topology::ComputeGraph(response.desc());
  return response;
}

// The node's GPUs by UUID, for regions named by RegionSpec.device_uuid.
std::vector<regions::GpuName> GpuNames(const v1::TopologyDesc& desc) {
  std::vector<regions::GpuName> gpus;
  for (const v1::Gpu& gpu : desc.gpus()) {
    if (!gpu.uuid().empty()) gpus.push_back({gpu.uuid(), gpu.cuda_ordinal()});
  }
  return gpus;
}

// The etcd client's PEM text and password, read from the files the config names.
absl::Status ReadEtcdSecrets(const v1::EtcdDirectoryConfig& etcd,
                             directory::EtcdClientOptions* options) {
  const std::pair<const char*, const std::string*> files[] = {{"etcd.ca_file", &etcd.ca_file()},
                                                              {"etcd.cert_file", &etcd.cert_file()},
                                                              {"etcd.key_file", &etcd.key_file()}};
  std::string* pems[] = {&options->ca_pem, &options->cert_pem, &options->key_pem};
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
  if (options->ca_pem.empty() && options->cert_pem.empty()) {
    spdlog::warn(
        "etcd.*_file: not set: the etcd directory talks to {} in plaintext (anyone on "
        "the path can read and forge node records); set etcd.ca_file (and "
        "etcd.cert_file/key_file for client certificates)",
        absl::StrJoin(options->endpoints, ","));
  }
  if (!etcd.username().empty()) {
    // etcd user/password authentication; the password is never logged.
    KVRAIL_ASSIGN_OR_RETURN(options->password,
                            directory::ReadEtcdPasswordFile(etcd.password_file()));
    if (options->ca_pem.empty()) {
      spdlog::warn("etcd.username: the password goes to etcd in plaintext; set etcd.ca_file");
    }
  }
  return absl::OkStatus();
}

// One line per ended transfer at debug (info would flood the journal at serving rates).
void LogTransferEnded(const v1::TransferStatus& status) {
  // At every transfer's end, on the thread a submission queue's acknowledgement waits for (an
  // inline host transfer ends before its submit is answered): its fields are built only where
  // the line is written.
  KVRAIL_LOG_FIELDS(
      spdlog::level::debug, "transfer ended",
      {{"transfer_id", status.transfer_id()},
       {"state", metrics::ResultLabel(status.state())},
       {"path", metrics::PathLabel(status.path())},
       {"priority", metrics::PriorityLabel(status.spec().priority())},
       {"bytes", status.bytes_done()},
       {"seconds", status.finished_unix_us() > status.submitted_unix_us()
                       ? (status.finished_unix_us() - status.submitted_unix_us()) / 1e6
                       : 0.0},
       {"engine", status.engine()}});
}

// What does not change while the daemon runs: its config, topology and identity.
struct Identity {
  v1::DaemonConfig config;
  v1::GetTopologyResponse topology;
  // This process's instance, in session greetings and Stats: a client that sees it change (or
  // its session socket close) knows its regions are gone.
  std::string instance_id;
  // Sessions, regions and transfer ids belong to the lineage (Stats.lineage_id): this instance
  // when started cold, the predecessor's when taken over.
  std::string lineage_id;
  int64_t started_us = 0;
  // Stats that do not change while the daemon runs (GetStats and the metrics answer them).
  v1::Stats stats_base;
  uint64_t fd_limit = 0;  // RLIMIT_NOFILE in force; 0: unlimited
};

// A hot restart's state on either side (daemon/handover). Thread contract: `takeover` is the
// start thread's; the listener calls back on its own thread, which alone uses `held_back`.
struct HotRestartState {
  handover::HotRestartOptions options;  // HotRestartOptionsFrom
  // The successor's side while it starts: the predecessor's bundle, committed at the end.
  std::unique_ptr<handover::Takeover> takeover;
  // The predecessor's side: the handover socket, and whether a successor took over.
  std::unique_ptr<handover::Listener> listener;
  std::atomic<bool> released{false};
  // Notifications taken for the bundle: given back if the successor does not commit.
  std::vector<std::pair<uint64_t, v1::Notification>> held_back;
  // This daemon's gRPC socket (its inode): after a release, the successor's replaces it.
  ino_t grpc_socket_inode = 0;
};

class DaemonImpl final : public Daemon {
 public:
  DaemonImpl(v1::DaemonConfig config, sigset_t signals) : signals_(signals) {
    id_.config = std::move(config);
    hot_.options = HotRestartOptionsFrom(id_.config);
  }
  ~DaemonImpl() override;

  // The start steps, in order; each starts one module (or a pair that only make sense together).
  absl::Status Start();
  void Serve() override;

 private:
  absl::Status StartRegions();
  absl::Status StartEngines();
  absl::Status StartDirectory();
  absl::Status StartFabric();
  absl::Status StartTransfers();
  absl::Status StartMetrics();
  absl::Status StartSessions();
  absl::Status StartServer();
  // Hot restart: the successor's takeover (before the sessions start) and the predecessor's
  // handover socket (once everything serves).
  absl::Status BeginTakeover();
  absl::Status StartHandoverListener();
  absl::StatusOr<handover::Bundle> PrepareHandover();
  void ResumeAfterHandover();
  void Released(const std::string& successor_address);
  v1::Stats CurrentStats() const;
  std::string Summary() const;

  const v1::DaemonConfig& config() const { return id_.config; }

  const sigset_t signals_;
  Clock* const clock_ = Clock::Real();
  // Declared first so that it is released last, after the sockets are removed on the way out.
  std::unique_ptr<server::SocketLock> socket_lock_;
  Identity id_;
  // In this order: the region table and the grants hook the session table's ends.
  std::unique_ptr<sessions::SessionTable> session_table_;
  std::unique_ptr<regions::RegionTable> regions_;
  std::unique_ptr<access::Grants> grants_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<engine::Engine> cuda_engine_;  // nullptr: no CUDA engine
  std::unique_ptr<directory::Directory> directory_;
  std::shared_ptr<const fabric::PeerTlsPem> peer_tls_;  // nullptr: insecure_peers or no TCP
  std::unique_ptr<fabric::Fabric> fabric_;              // nullptr: no peers
  std::unique_ptr<transfers::NotificationHub> notifications_;
  // Metrics count transfers as they end; the endpoint starts once the manager exists.
  std::atomic<metrics::Metrics*> metrics_sink_{nullptr};
  std::unique_ptr<transfers::TransferManager> transfers_;
  std::unique_ptr<metrics::Metrics> metrics_;
  // The session poll thread's predicted spins (kvrail_session_predicted_spins_total): atomics
  // the poll thread adds to and a scrape reads, declared before sessions_ so they outlive it.
  session::SessionServerOptions::WakeCounts session_wake_;
  std::unique_ptr<session::SessionServer> sessions_;
  // What a metrics scrape reads of sessions_ (kvrail_session_admission_*): cleared under the
  // lock before sessions_ goes (StopSessions), so a scrape never reads a server being destroyed.
  absl::Mutex sessions_view_mu_;
  session::SessionServer* sessions_view_ ABSL_GUARDED_BY(sessions_view_mu_) = nullptr;
  std::unique_ptr<server::Server> server_;
  HotRestartState hot_;

  // sessions_ from StartSessions on, for metrics.
  void ShowSessions() {
    absl::MutexLock lock(&sessions_view_mu_);
    sessions_view_ = sessions_.get();
  }
  // Destroys sessions_ (every session ends), after metrics stopped reading it.
  void StopSessions() {
    {
      absl::MutexLock lock(&sessions_view_mu_);
      sessions_view_ = nullptr;
    }
    sessions_.reset();
  }
};

DaemonImpl::~DaemonImpl() {
  hot_.listener.reset();  // its callbacks use the modules below
  // The listeners and sinks that point at later modules are detached before those go.
  if (server_ != nullptr) directory_->SetStateListener(nullptr);
  server_.reset();
  StopSessions();
  metrics_sink_.store(nullptr, std::memory_order_release);
  metrics_.reset();
  if (fabric_ != nullptr) fabric_->SetInboundSink(nullptr);
  transfers_.reset();
}

absl::Status DaemonImpl::Start() {
  const v1::DaemonConfig& c = config();
  KVRAIL_RETURN_IF_ERROR(SetUpDaemonLogging(c.log_level(), c.log_format()));
  PrepareCudaEnvironment(c);
  id_.fd_limit = RaiseFdLimit();
  spdlog::info("kvraild {} starting: node '{}', socket {}", kVersion, c.node_id(), c.unix_socket());
  // One daemon per socket, decided before anything at that path is unlinked or bound. A hot
  // restart's successor adopts its predecessor's lock instead (BeginTakeover).
  if (hot_.options.take_over_path.empty()) {
    KVRAIL_ASSIGN_OR_RETURN(socket_lock_, server::SocketLock::Acquire(c.unix_socket()));
  }
  KVRAIL_ASSIGN_OR_RETURN(id_.topology, LoadTopology(c));
  spdlog::info("topology ({}): {} GPUs, {} NICs", id_.topology.source(),
               id_.topology.desc().gpus_size(), id_.topology.desc().nics_size());
  id_.started_us = clock_->NowUnixMicros();
  id_.stats_base.set_build_info(build::Info("kvraild"));
  *id_.stats_base.mutable_mps() = metrics::ProbeMps(MpsProbeOptionsFrom(c, ::getuid()));
  const v1::OpsMps& mps = id_.stats_base.mps();
  if (metrics::MpsNeedsAttention(mps)) {
    spdlog::warn("CUDA MPS ({}): {}", mps.pipe_directory(), mps.verdict());
  } else if (mps.active()) {
    spdlog::info("CUDA MPS ({}): {}", mps.pipe_directory(), mps.verdict());
  }
  // Ids count from random bases so that a stale id from the previous instance names nothing.
  id_.instance_id = session::NewInstanceId();
  id_.lineage_id = id_.instance_id;
  spdlog::info("instance {}", id_.instance_id);
  KVRAIL_RETURN_IF_ERROR(StartRegions());
  KVRAIL_RETURN_IF_ERROR(StartEngines());
  KVRAIL_RETURN_IF_ERROR(StartDirectory());
  KVRAIL_RETURN_IF_ERROR(StartFabric());
  KVRAIL_RETURN_IF_ERROR(StartTransfers());
  KVRAIL_RETURN_IF_ERROR(BeginTakeover());
  // A successor opens the metrics port once its predecessor has let go of it (StartServer).
  if (hot_.takeover == nullptr) KVRAIL_RETURN_IF_ERROR(StartMetrics());
  KVRAIL_RETURN_IF_ERROR(StartSessions());
  KVRAIL_RETURN_IF_ERROR(StartServer());
  KVRAIL_RETURN_IF_ERROR(StartHandoverListener());
  if (fabric_) fabric_->StartLiveness();
  spdlog::info("ready: {} ({}{}{})", c.unix_socket(), engine_->Describe(), cuda_engine_ ? "; " : "",
               cuda_engine_ ? cuda_engine_->Describe() : "");
  return absl::OkStatus();
}

absl::Status DaemonImpl::StartRegions() {
  session_table_ =
      sessions::SessionTable::Create(sessions::SessionLimits{}, sessions::RandomIdBase());
  regions_ =
      regions::RegionTable::Create(clock_, session_table_.get(), sessions::RandomIdBase(),
                                   GpuNames(id_.topology.desc()), RegionLimitsFrom(config()));
  grants_ = access::Grants::Create(clock_, session_table_.get(), regions_.get());
  return absl::OkStatus();
}

absl::Status DaemonImpl::StartEngines() {
  const v1::DaemonConfig& c = config();
  const HostEngineOptions host = HostEngineOptionsFrom(c);
  engine_ = engine::CreateHostEngine(host.threads, host.limits, host.inline_max_bytes);
  if (c.cuda_engine() == "off") return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<engine::Engine>> created =
      engine::CreateCudaEngine(CudaEngineOptionsFrom(c));
  if (created.ok()) {
    cuda_engine_ = *std::move(created);
    spdlog::info("CUDA engine: {}", cuda_engine_->Describe());
    if (cuda_engine_->capabilities().gpu_count < id_.topology.desc().gpus_size()) {
      spdlog::warn(
          "CUDA engine: runs on {} of the {} GPUs the topology shows (CUDA sees fewer: "
          "NVIDIA_VISIBLE_DEVICES, CDI devices or CUDA_VISIBLE_DEVICES); transfers on "
          "the others are refused",
          cuda_engine_->capabilities().gpu_count, id_.topology.desc().gpus_size());
    }
  } else if (c.cuda_engine() == "required") {
    // Not served without its GPUs: a daemon that answered health checks here would be taken
    // for working. CUDA's initialisation error is sticky within a process, so the retry is a
    // new process: systemd's Restart= and the kubelet's crash-loop back-off pace it.
    absl::Status status = absl::FailedPreconditionError(absl::StrCat(
        "cuda_engine: required, but the CUDA engine did not start: ", created.status().ToString(),
        " (kvraild exits; its supervisor retries with back-off)"));
    status.SetPayload(kExitCodePayload, absl::Cord(absl::StrCat(kExitCudaRequired)));
    return status;
  } else {
    spdlog::warn(
        "no CUDA engine (cuda_engine: auto): {}; kvraild serves host memory only and "
        "refuses GPU regions (set cuda_engine: required on GPU nodes so this fails "
        "the start instead)",
        created.status().ToString());
  }
  return absl::OkStatus();
}

// The etcd directory (DaemonConfig.etcd; docs/fabric.md, "Directory") registers this node's
// record (Peer address, NICs with rails, GPUs by UUID, boot id, build) and follows the others;
// without etcd, the static peers.
absl::Status DaemonImpl::StartDirectory() {
  const v1::DaemonConfig& c = config();
  if (!c.has_etcd()) {
    directory_ =
        directory::CreateStaticDirectory({c.peers().begin(), c.peers().end()}, c.node_id());
    return absl::OkStatus();
  }
  directory::EtcdClientOptions client_options = EtcdClientOptionsFrom(c);
  KVRAIL_RETURN_IF_ERROR(ReadEtcdSecrets(c.etcd(), &client_options));
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<directory::EtcdClient> client,
                          directory::CreateGrpcEtcdClient(client_options));
  directory::NodeRecordInputs record =
      NodeRecordInputsFrom(c, id_.topology, id_.instance_id, id_.stats_base.build_info());
  record.now = absl::Now();
  KVRAIL_ASSIGN_OR_RETURN(directory_, directory::CreateEtcdDirectory(
                                          EtcdDirectoryOptionsFrom(c, record), std::move(client)));
  const v1::DirectoryStatus status = directory_->Status();
  spdlog::info("etcd directory: {} at {}, prefix {}, TTL {} s: {}{}{}; {} peers", status.kind(),
               absl::StrJoin(c.etcd().endpoints(), ","), c.etcd().prefix(), c.etcd().ttl_s(),
               status.state(), status.reason().empty() ? "" : ": ", status.reason(),
               status.peers());
  return absl::OkStatus();
}

// Peers authenticate with mTLS (docs/security.md, "Peers"); FinalizeConfig refused TCP or peers
// with neither peer_tls nor insecure_peers. The inter-node path starts when peers are configured
// or etcd may find them (with etcd, peers join later: the fabric takes them from the directory).
absl::Status DaemonImpl::StartFabric() {
  const v1::DaemonConfig& c = config();
  if (!c.peer_tls().ca_file().empty()) {
    KVRAIL_ASSIGN_OR_RETURN(peer_tls_, fabric::LoadPeerTls(c.peer_tls()));
    spdlog::info("peers: mTLS (CA {}, certificate {}: its CN must be '{}')", c.peer_tls().ca_file(),
                 c.peer_tls().cert_file(), c.node_id());
  } else if (c.insecure_peers()) {
    spdlog::warn(
        "insecure_peers: tcp_listen and the channels to peers are plaintext; any host "
        "that reaches {} may claim any node id (tests and closed networks only)",
        c.tcp_listen().empty() ? std::string("the peers") : c.tcp_listen());
  }
  if (directory_->Peers().empty() && !c.has_etcd()) return absl::OkStatus();
  fabric::FabricOptions options = FabricOptionsFrom(c, id_.topology);
  options.tls = peer_tls_;
  KVRAIL_ASSIGN_OR_RETURN(
      fabric_, fabric::Fabric::Create(options, regions_.get(), grants_.get(), directory_.get()));
  return absl::OkStatus();
}

absl::Status DaemonImpl::StartTransfers() {
  // Notification queues live as long as their sessions (a session's end drops its queue).
  notifications_ = transfers::NotificationHub::Create(
      [table = session_table_.get()](uint64_t session) { return table->SessionOpen(session); });
  session_table_->AddSessionEndHook(
      [hub = notifications_.get()](uint64_t s) { hub->EndSession(s); });
  transfers::Options options = TransferOptionsFrom(config(), id_.topology);
  options.notifications = notifications_.get();
  options.remote = fabric_.get();
  options.on_finished = [this](const v1::TransferStatus& status) {
    if (metrics::Metrics* m = metrics_sink_.load(std::memory_order_acquire)) {
      m->OnTransferFinished(status);
    }
    LogTransferEnded(status);
  };
  // The engines local transfers run on, one line each (engine_registry.h).
  transfers::EngineRegistry engines;
  engines.Add(engine_.get());
  engines.Add(cuda_engine_.get());  // null when there is none
  transfers_ =
      transfers::TransferManager::Create(regions_.get(), grants_.get(), engines, clock_, options);
  // Inbound fabric transfers are recorded by the manager (detached in the destructor).
  if (fabric_) fabric_->SetInboundSink(transfers_.get());
  // A session's end fails the transfers waiting for readiness only it could give.
  session_table_->AddSessionEndHook([t = transfers_.get()](uint64_t s) { t->EndSession(s); });
  return absl::OkStatus();
}

v1::Stats DaemonImpl::CurrentStats() const {
  v1::Stats stats = id_.stats_base;
  stats.set_version(kVersion);
  stats.set_started_unix_us(id_.started_us);
  stats.set_node_id(config().node_id());
  stats.set_instance_id(id_.instance_id);
  stats.set_lineage_id(id_.lineage_id);
  stats.set_regions(regions_->size());
  transfers_->FillStats(&stats);
  *stats.mutable_directory() = directory_->Status();
  return stats;
}

absl::Status DaemonImpl::StartMetrics() {
  if (config().metrics_listen().empty()) {
    if (config().has_metrics_tls() || !config().metrics_bearer_token_file().empty()) {
      return absl::InvalidArgumentError(
          "metrics_tls / metrics_bearer_token_file: set without metrics_listen");
    }
    return absl::OkStatus();
  }
  metrics::MetricsOptions options =
      MetricsOptionsFrom(config(), id_.topology.desc().gpus_size(),
                         cuda_engine_ ? cuda_engine_->capabilities().gpu_count : 0);
  if (const std::string& file = config().metrics_bearer_token_file(); !file.empty()) {
    std::ifstream in(file);
    std::getline(in, options.bearer_token);
    options.bearer_token = std::string(absl::StripAsciiWhitespace(options.bearer_token));
    if (!in && !in.eof()) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics_bearer_token_file: cannot read '", file, "'"));
    }
    if (options.bearer_token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics_bearer_token_file: '", file, "' has no token on its first line"));
    }
  }
  options.build_info = id_.stats_base.build_info();
  for (const v1::Gpu& g : id_.topology.desc().gpus()) {
    options.gpu_labels.push_back({g.index(), g.uuid(), g.name()});
  }
  if (fabric_) options.peers = [d = directory_.get()] { return d->List(); };
  options.stats = [this] { return CurrentStats(); };
  options.session_admission = [this] {
    metrics::SessionAdmission out;
    absl::MutexLock lock(&sessions_view_mu_);
    if (sessions_view_ != nullptr) {
      const session::SessionServer::AdmissionDepth depth = sessions_view_->admission_depth();
      out.queued = depth.queued;
      out.running = depth.running;
      out.deepest = depth.deepest;
      out.promoted = depth.promoted;
    }
    return out;
  };
  options.session_wake = [this] {
    metrics::SessionWake out;
    out.spins = session_wake_.spins.load(std::memory_order_relaxed);
    out.hits = session_wake_.hits.load(std::memory_order_relaxed);
    out.misses = session_wake_.misses.load(std::memory_order_relaxed);
    return out;
  };
  KVRAIL_ASSIGN_OR_RETURN(metrics_, metrics::Metrics::Start(std::move(options)));
  metrics_sink_.store(metrics_.get(), std::memory_order_release);
  spdlog::info("metrics on {} (port {}{}{})", config().metrics_listen(), metrics_->port(),
               config().metrics_tls().cert_file().empty() ? "" : ", TLS",
               config().metrics_bearer_token_file().empty() ? "" : ", bearer token required");
  return absl::OkStatus();
}

absl::Status DaemonImpl::StartSessions() {
  session::SessionServerOptions options = SessionOptionsFrom(config(), id_.fd_limit);
  options.wake_counts = &session_wake_;
  // The greeting names the lineage: a client's session outlives a hot restart.
  options.instance_id = id_.lineage_id;
  transfers::TransferManager* transfers = transfers_.get();
  options.post = [transfers](const sessions::Caller& caller, const v1::PostTransferRequest& post) {
    return transfers->Post(caller, post);
  };
  options.submit = [transfers](const v1::TransferSpec& spec) {
    return transfers->SubmitWithinNode(spec);
  };
  options.wait = [transfers](const sessions::Caller& caller, uint64_t id,
                             std::function<void(const v1::TransferStatus&)> done) {
    return transfers->WhenEnded(caller, id, std::move(done));
  };
  options.cancel = [transfers](const sessions::Caller& caller, uint64_t id) {
    return transfers->Cancel(caller, id);
  };
  options.follow = [transfers](const sessions::Caller& caller, uint64_t id,
                               std::function<void(const v1::TransferStatus&)> done) {
    // The completion queue's entry reads only the end's fields.
    return transfers->WhenEnded(caller, id, std::move(done), /*counted=*/false,
                                transfers::StatusDetail::kEnd);
  };
  spdlog::info(
      "caps: {} sessions ({} per uid), {} transfers in flight and {} waits/watches per "
      "session",
      options.max_sessions, options.max_sessions_per_uid, config().max_transfers_per_session(),
      config().max_watchers_per_session());
  if (hot_.takeover != nullptr) {
    // The predecessor's listener and connections, served from the commit on (StartServer).
    handover::Bundle& bundle = hot_.takeover->bundle();
    KVRAIL_ASSIGN_OR_RETURN(sessions_,
                            session::SessionServer::Adopt(options, session_table_.get(),
                                                          bundle.state.sessions(), &bundle.fds));
    for (const handover::QueuedNotification& queued : bundle.state.notifications()) {
      notifications_->Deliver(queued.session_id(), queued.notification());
    }
    ShowSessions();
    return absl::OkStatus();
  }
  KVRAIL_ASSIGN_OR_RETURN(sessions_, session::SessionServer::Start(options, session_table_.get()));
  ShowSessions();
  return absl::OkStatus();
}

absl::Status DaemonImpl::StartServer() {
  const v1::DaemonConfig& c = config();
  server::ServerOptions options = ServerOptionsFrom(c);
  options.instance_id = id_.instance_id;
  options.lineage_id = id_.lineage_id;
  options.stats_base = id_.stats_base;
  options.notifications = notifications_.get();
  options.topology = id_.topology;
  // gRPC binds its socket in a private directory; it is renamed into place with its mode below
  // (never reachable with the umask's permissions).
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<server::PrivateBind> grpc_bind,
                          server::PrivateBind::Create(c.unix_socket()));
  options.listen.insert(options.listen.begin(), "unix:" + grpc_bind->bind_path());
  options.tcp_credentials = fabric::PeerServerCredentials(peer_tls_);
  if (c.tcp_serves_api()) {
    spdlog::warn(
        "tcp_serves_api: Transfer and Admin answer on {} too (anonymous callers: they "
        "reach regions only through grants)",
        c.tcp_listen());
  }
  options.directory_status = [d = directory_.get()] { return d->Status(); };
  if (fabric_) {
    options.list_peers = [d = directory_.get()] { return d->List(); };
    options.extra_services.push_back(fabric_->peer_service());
    options.export_region = [f = fabric_.get()](uint64_t region_id, const std::string& peer_node) {
      return f->ExportRegion(region_id, peer_node);
    };
  }
  KVRAIL_ASSIGN_OR_RETURN(
      server_, server::Server::Start(options, session_table_.get(), regions_.get(), grants_.get(),
                                     transfers_.get()));
  if (hot_.takeover != nullptr) {
    // Nothing can fail any more: the predecessor lets go, then this daemon serves (its gRPC
    // socket renamed over the predecessor's: no moment without one at the path). Calls still
    // reaching the predecessor are sent here, to the socket's private path.
    KVRAIL_RETURN_IF_ERROR(
        hot_.takeover->Commit(hot_.options.release_timeout, "unix:" + grpc_bind->bind_path()));
    hot_.takeover.reset();
    sessions_->Resume();
    spdlog::info("take_over: committed; serving the predecessor's sessions");
  }
  KVRAIL_RETURN_IF_ERROR(grpc_bind->Publish(c.socket_mode()));
  grpc_bind.reset();
  struct stat published {};
  if (::stat(c.unix_socket().c_str(), &published) == 0) hot_.grpc_socket_inode = published.st_ino;
  if (metrics_ == nullptr && !c.metrics_listen().empty()) {
    // After a commit the daemon serves: a metrics port still taken is logged, not fatal.
    if (absl::Status metrics = StartMetrics(); !metrics.ok()) {
      spdlog::error("metrics: {} (serving without them)", metrics.ToString());
    }
  }
  if (server_->tcp_port() != 0) spdlog::info("listening on TCP port {}", server_->tcp_port());
  // The health service's "kvrail.v1.Directory" follows the directory (ok / degraded); the
  // listener is removed before the server goes away (the destructor).
  directory_->SetStateListener([s = server_.get()](const v1::DirectoryStatus& status) {
    s->SetDirectoryServing(status.state() == v1::DIRECTORY_STATE_OK);
  });
  server_->SetDirectoryServing(directory_->Status().state() == v1::DIRECTORY_STATE_OK);
  return absl::OkStatus();
}

std::string DaemonImpl::Summary() const {
  v1::Stats stats;
  transfers_->FillStats(&stats);
  return absl::StrCat("serving ", config().unix_socket(), ": ", regions_->size(), " regions, ",
                      stats.transfers_active(), " transfers active, ", stats.transfers_succeeded(),
                      " succeeded, ", stats.transfers_failed(), " failed; ", stats.bytes_moved(),
                      " bytes moved");
}

void DaemonImpl::Serve() {
  const v1::DaemonConfig& c = config();
  // systemd (Type=notify): ready now; the status line is refreshed every 10 s until a signal.
  NotifyReady(Summary());
  int signal_number = 0;
  const timespec refresh{10, 0};
  while ((signal_number = sigtimedwait(&signals_, nullptr, &refresh)) < 0 ||
         (signal_number == SIGUSR2 && !hot_.released.load())) {
    if (signal_number < 0) NotifyStatus(Summary());
  }
  hot_.listener.reset();  // waits for a handover in progress
  if (hot_.released.load()) {
    // Everything was handed over: the sockets and their paths are the successor's. No
    // STOPPING=1: the unit goes on with the successor as its main process (it sent MAINPID).
    spdlog::info("handed over to the successor");
    // Clients' gRPC connections close with this server: they reconnect to the path, which must
    // name the successor's socket by then (it renames it there right after the release).
    for (int i = 0; i < 500; ++i) {
      struct stat now {};
      if (::stat(c.unix_socket().c_str(), &now) != 0 || now.st_ino != hot_.grpc_socket_inode) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    server_->Shutdown(absl::Seconds(1));
    StopSessions();
    if (hot_.options.linger_after_handover) {
      spdlog::info("--linger-after-handover: idle until SIGTERM");
      while ((signal_number = sigwaitinfo(&signals_, nullptr)) == SIGUSR2 || signal_number < 0) {
      }
    }
    spdlog::info("stopped");
    return;
  }
  spdlog::info("signal {}: draining (up to {} ms)", signal_number, c.drain_timeout_ms());
  NotifyStopping(absl::StrCat("draining (up to ", c.drain_timeout_ms(), " ms)"));
  server_->SetNotServing();
  transfers_->Drain(absl::Milliseconds(c.drain_timeout_ms()));
  server_->Shutdown(absl::Seconds(1));
  StopSessions();
  ::unlink(c.unix_socket().c_str());
  ::unlink((c.unix_socket() + ".session").c_str());
  metrics_sink_.store(nullptr, std::memory_order_release);
  metrics_.reset();
  spdlog::info("stopped");
}

absl::Status DaemonImpl::BeginTakeover() {
  const v1::DaemonConfig& c = config();
  const std::string& path = hot_.options.take_over_path;
  if (path.empty()) return absl::OkStatus();
  // The predecessor finishes its running transfers first (at most drain_timeout_ms).
  absl::StatusOr<std::unique_ptr<handover::Takeover>> begun =
      handover::Takeover::Begin(path, hot_.options.bundle_timeout);
  if (!begun.ok()) {
    if (hot_.options.cold_when_nobody_answers && absl::IsUnavailable(begun.status())) {
      spdlog::info("take_over: auto: no predecessor answers {}; starting cold", path);
      KVRAIL_ASSIGN_OR_RETURN(socket_lock_, server::SocketLock::Acquire(c.unix_socket()));
      return absl::OkStatus();
    }
    return begun.status();
  }
  hot_.takeover = *std::move(begun);
  handover::Bundle& bundle = hot_.takeover->bundle();
  const int32_t lock_index = bundle.state.socket_lock_fd();
  if (lock_index < 0 || static_cast<size_t>(lock_index) >= bundle.fds.size()) {
    return absl::InvalidArgumentError("handover: socket_lock_fd is not in the bundle");
  }
  KVRAIL_ASSIGN_OR_RETURN(
      socket_lock_, server::SocketLock::Adopt(std::move(bundle.fds[lock_index]), c.unix_socket()));
  id_.lineage_id = bundle.state.lineage_id();
  spdlog::info(
      "take_over: {} (instance {}, kvraild {}) hands over {} sessions, {} regions, {} "
      "connections; lineage {}",
      path, bundle.state.predecessor_instance_id(), bundle.state.predecessor_version(),
      bundle.state.regions().sessions_size(), bundle.state.regions().regions_size(),
      bundle.state.sessions().connections_size(), id_.lineage_id);
  // Sessions and fd tokens first (the regions' owners and uids), then the regions, then the
  // grants of them.
  KVRAIL_RETURN_IF_ERROR(session_table_->ImportState(bundle.state.regions(), &bundle.fds));
  KVRAIL_RETURN_IF_ERROR(regions_->ImportState(bundle.state.regions(), &bundle.fds));
  grants_->ImportState(bundle.state.regions());
  transfers_->ImportState(bundle.state.transfers());
  return absl::OkStatus();
}

absl::Status DaemonImpl::StartHandoverListener() {
  handover::Predecessor predecessor;
  predecessor.prepare = [this] { return PrepareHandover(); };
  predecessor.resume = [this] { ResumeAfterHandover(); };
  predecessor.released = [this](const std::string& address) { Released(address); };
  KVRAIL_ASSIGN_OR_RETURN(
      hot_.listener, handover::Listener::Start(hot_.options.listen_path, std::move(predecessor),
                                               hot_.options.commit_timeout));
  return absl::OkStatus();
}

absl::StatusOr<handover::Bundle> DaemonImpl::PrepareHandover() {
  // Nothing changes from here on: gRPC changes wait, the session socket is not read, and the
  // transfers already started finish (their waiters are answered as they end).
  server_->HoldChanges();
  sessions_->Pause();
  KVRAIL_RETURN_IF_ERROR(transfers_->Quiesce(absl::Milliseconds(config().drain_timeout_ms())));
  handover::Bundle bundle;
  bundle.state.set_lineage_id(id_.lineage_id);
  bundle.state.set_predecessor_instance_id(id_.instance_id);
  bundle.state.set_predecessor_version(kVersion);
  UniqueFd lock(::fcntl(socket_lock_->fd(), F_DUPFD_CLOEXEC, 0));
  if (!lock.valid()) return absl::ResourceExhaustedError("handover: cannot duplicate the lock");
  bundle.fds.push_back(std::move(lock));
  bundle.state.set_socket_lock_fd(0);
  KVRAIL_RETURN_IF_ERROR(session_table_->ExportState(bundle.state.mutable_regions(), &bundle.fds));
  KVRAIL_RETURN_IF_ERROR(regions_->ExportState(bundle.state.mutable_regions(), &bundle.fds));
  grants_->ExportState(bundle.state.mutable_regions());
  transfers_->ExportState(bundle.state.mutable_transfers());
  KVRAIL_RETURN_IF_ERROR(sessions_->ExportState(bundle.state.mutable_sessions(), &bundle.fds));
  hot_.held_back.clear();
  for (const handover::SessionRecord& session : bundle.state.regions().sessions()) {
    absl::StatusOr<std::vector<v1::Notification>> queued = notifications_->Take(
        session.session_id(), static_cast<uint32_t>(transfers::kNotificationQueueLimit),
        absl::ZeroDuration());
    if (!queued.ok()) continue;
    for (v1::Notification& n : *queued) {
      handover::QueuedNotification* q = bundle.state.add_notifications();
      q->set_session_id(session.session_id());
      *q->mutable_notification() = n;
      hot_.held_back.emplace_back(session.session_id(), std::move(n));
    }
  }
  spdlog::info("handover: {} sessions, {} regions, {} connections, {} descriptors",
               bundle.state.regions().sessions_size(), bundle.state.regions().regions_size(),
               bundle.state.sessions().connections_size(), bundle.fds.size());
  return bundle;
}

void DaemonImpl::ResumeAfterHandover() {
  for (auto& [session, notification] : hot_.held_back) {
    notifications_->Deliver(session, std::move(notification));
  }
  hot_.held_back.clear();
  sessions_->Resume();
  server_->ResumeChanges();
}

void DaemonImpl::Released(const std::string& successor_address) {
  hot_.released.store(true);
  server_->ForwardChanges(successor_address);
  // The metrics port is the successor's from now on.
  metrics_sink_.store(nullptr, std::memory_order_release);
  metrics_.reset();
  ::kill(::getpid(), SIGUSR2);  // Serve returns
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(v1::DaemonConfig config) {
  const sigset_t signals = BlockShutdownSignals();
  auto daemon = std::make_unique<DaemonImpl>(std::move(config), signals);
  KVRAIL_RETURN_IF_ERROR(daemon->Start());
  return std::unique_ptr<Daemon>(std::move(daemon));
}

int Daemon::ExitCodeOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kExitCodePayload);
  int code = 0;
  if (payload.has_value() && absl::SimpleAtoi(std::string(*payload), &code)) return code;
  return kExitStartFailed;
}

}  // namespace kvrail::daemon

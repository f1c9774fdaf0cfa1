#include "daemon/metrics/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <atomic>
#include <cctype>
#include <exception>
#include <map>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/dcheck.h"
#include "daemon/metrics/process_stats.h"
#include "daemon/metrics/secure_front.h"

namespace kvrail::metrics {
namespace {

std::string EnumLabel(const std::string& name, const std::string& prefix) {
  std::string out = name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

prometheus::MetricFamily Family(const std::string& name, const std::string& help,
                                prometheus::MetricType type) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  return family;
}

prometheus::MetricFamily Gauge(const std::string& name, const std::string& help) {
  return Family(name, help, prometheus::MetricType::Gauge);
}

prometheus::MetricFamily Counter(const std::string& name, const std::string& help) {
  return Family(name, help, prometheus::MetricType::Counter);
}

// One sample of a gauge or counter family (the value goes where the family's type reads it).
void AddSample(prometheus::MetricFamily* family, double value,
               std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric metric;
  metric.label = std::move(labels);
  if (family->type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family->metric.push_back(std::move(metric));
}

// The standard process_* families (names and meanings as Prometheus' client libraries export
// them, so the usual dashboards and alerts work). Nothing when /proc cannot be read.
void AppendProcessFamilies(std::vector<prometheus::MetricFamily>* out) {
  const absl::StatusOr<ProcessStats> p = ReadProcessStats();
  if (!p.ok()) return;
  const std::pair<prometheus::MetricFamily, double> families[] = {
      {Counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds."),
       p->cpu_seconds},
      {Gauge("process_resident_memory_bytes", "Resident memory size in bytes."), p->resident_bytes},
      {Gauge("process_virtual_memory_bytes", "Virtual memory size in bytes."), p->virtual_bytes},
      {Gauge("process_open_fds", "Number of open file descriptors."), p->open_fds},
      {Gauge("process_max_fds", "Maximum number of open file descriptors."), p->max_fds},
      {Gauge("process_start_time_seconds",
             "Start time of the process since unix epoch in seconds."),
       p->start_time_seconds},
  };
  for (const auto& [family, value] : families) {
    prometheus::MetricFamily f = family;
    AddSample(&f, value);
    out->push_back(std::move(f));
  }
}

// Gauges and counters computed from a Stats snapshot (and the peer list) when Prometheus scrapes.
class StatsCollectable final : public prometheus::Collectable {
 public:
  explicit StatsCollectable(MetricsOptions options) : options_(std::move(options)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const v1::Stats s = options_.stats();
    std::vector<prometheus::MetricFamily> out;
    auto build = Gauge("kvrail_build_info", "Always 1; the labels say how kvraild was built.");
    AddSample(&build, 1, {{"version", options_.version}, {"build", options_.build_info}});
    out.push_back(std::move(build));
    auto gpus = Gauge("kvrail_gpus", "GPUs in the node's topology (NVML, or the topology file).");
    AddSample(&gpus, options_.gpus);
    out.push_back(std::move(gpus));
    auto gpu_info = Gauge("kvrail_gpu_info",
                          "Always 1, one sample per GPU of the topology: kvraild's index (gpuN in "
                          "link names) with dcgm-exporter's UUID and modelName labels.");
    for (const GpuLabel& g : options_.gpu_labels) {
      AddSample(&gpu_info, 1,
                {{"gpu", std::to_string(g.index)}, {"UUID", g.uuid}, {"modelName", g.name}});
    }
    out.push_back(std::move(gpu_info));
    auto cuda_gpus = Gauge("kvrail_cuda_gpus",
                           "GPUs the CUDA engine runs transfers on (0: no CUDA engine); mode is "
                           "cuda_engine (auto, required, off).");
    AddSample(&cuda_gpus, options_.cuda_gpus, {{"mode", options_.cuda_mode}});
    out.push_back(std::move(cuda_gpus));
    auto regions = Gauge("kvrail_regions", "Registered regions.");
    AddSample(&regions, static_cast<double>(s.regions()));
    out.push_back(std::move(regions));
    auto active = Gauge("kvrail_transfers_active", "Transfers queued or running.");
    AddSample(&active, static_cast<double>(s.transfers_active()));
    out.push_back(std::move(active));
    auto queued =
        Gauge("kvrail_queued_tiles", "Tiles waiting in engine queues, by priority class.");
    for (const auto& [priority, tiles] : s.queued_tiles()) {
      AddSample(&queued, static_cast<double>(tiles), {{"priority", priority}});
    }
    out.push_back(std::move(queued));
    auto draining = Gauge("kvrail_draining", "1 once SIGTERM arrived and new work is refused.");
    AddSample(&draining, s.draining() ? 1 : 0);
    out.push_back(std::move(draining));
    // One sample per engine under its stable name; what changes is in kvrail_engine_<gauge>.
    auto engines = Gauge("kvrail_engine_info", "Always 1, one sample per engine (host, cuda).");
    std::map<std::string, prometheus::MetricFamily> engine_gauges;
    for (const v1::OpsEngineState& e : s.engine_states()) {
      AddSample(&engines, 1, {{"engine", e.name()}});
      for (const auto& [gauge, value] : e.gauges()) {
        const EngineSeries series = EngineSeriesOf(gauge, value);
        auto it = engine_gauges.find(series.name);
        if (it == engine_gauges.end()) {
          it = engine_gauges
                   .emplace(series.name, Family(series.name, "Engine state: " + gauge + ".",
                                                series.counter ? prometheus::MetricType::Counter
                                                               : prometheus::MetricType::Gauge))
                   .first;
        }
        AddSample(&it->second, series.value, {{"engine", e.name()}});
      }
    }
    out.push_back(std::move(engines));
    for (auto& [name, family] : engine_gauges) out.push_back(std::move(family));
    auto bytes = Counter("kvrail_bytes_total",
                         "Bytes moved, by path and priority, counted tile by tile as tiles land.");
    for (const v1::OpsByteCount& b : s.bytes_by_class()) {
      AddSample(&bytes, static_cast<double>(b.bytes()),
                {{"path", b.path()}, {"priority", b.priority()}});
    }
    out.push_back(std::move(bytes));
    auto link_bytes =
        Counter("kvrail_link_bytes_total",
                "Bytes moved by link, tile by tile: host, gpu0, gpu0-gpu1, gpu0-host, and "
                "fabric:<sender node>-><receiver node> (the same name on both daemons).");
    for (const auto& [link, n] : s.bytes_by_link()) {
      AddSample(&link_bytes, static_cast<double>(n), {{"link", link}});
    }
    out.push_back(std::move(link_bytes));
    auto rejected = Counter("kvrail_submits_rejected_total",
                            "Submits refused (gRPC and session socket), by status code.");
    for (const auto& [code, n] : s.rejected_by_code()) {
      AddSample(&rejected, static_cast<double>(n), {{"code", code}});
    }
    out.push_back(std::move(rejected));
    if (options_.session_admission) {
      const SessionAdmission a = options_.session_admission();
      auto queued_admissions =
          Gauge("kvrail_session_admission_queued",
                "Session socket submits (SUBMIT packets, submission queue batches) and the "
                "packets behind them waiting for an admission worker, every session together.");
      AddSample(&queued_admissions, static_cast<double>(a.queued));
      out.push_back(std::move(queued_admissions));
      auto running = Gauge("kvrail_session_admission_running",
                           "Session socket admissions running on the admission workers.");
      AddSample(&running, static_cast<double>(a.running));
      out.push_back(std::move(running));
      auto deepest = Gauge("kvrail_session_admission_queue_max",
                           "The most tasks waiting in one session's admission queue (refused "
                           "beyond the per-session cap).");
      AddSample(&deepest, static_cast<double>(a.deepest));
      out.push_back(std::move(deepest));
      auto promoted = Counter("kvrail_session_admission_bulk_promoted_total",
                              "Bulk admissions (large SUBMITs, run in SCHED_IDLE) still running at "
                              "session_admission_bulk_deadline_ms and lifted to normal priority: "
                              "the node's CPU was saturated meanwhile.");
      AddSample(&promoted, static_cast<double>(a.promoted));
      out.push_back(std::move(promoted));
    }
    if (options_.session_wake) {
      const SessionWake w = options_.session_wake();
      auto spins = Counter("kvrail_session_predicted_spins_total",
                           "The session poll thread's spins around a request predicted from a "
                           "steady cadence (predictive_wake), by outcome: begun, hit (the "
                           "request came within the spin), miss (it did not: the thread slept).");
      AddSample(&spins, static_cast<double>(w.spins), {{"outcome", "begun"}});
      AddSample(&spins, static_cast<double>(w.hits), {{"outcome", "hit"}});
      AddSample(&spins, static_cast<double>(w.misses), {{"outcome", "miss"}});
      out.push_back(std::move(spins));
    }
    if (options_.peers) {
      auto peer_up = Gauge("kvrail_peer_up", "1 when the peer daemon answers heartbeats, else 0.");
      for (const v1::PeerInfo& p : options_.peers()) {
        AddSample(&peer_up, p.state() == v1::PEER_STATE_UP ? 1 : 0, {{"peer", p.node_id()}});
      }
      out.push_back(std::move(peer_up));
    }
    if (s.has_directory()) {  // the peer directory (docs/fabric.md, "Directory")
      auto dir_up = Gauge("kvrail_directory_up",
                          "1 when the peer directory is ok, 0 when degraded (etcd unreachable: "
                          "known peers keep working, new ones are not seen).");
      AddSample(
          &dir_up, s.directory().state() == v1::DIRECTORY_STATE_OK ? 1 : 0,
          {{"kind", EnumLabel(v1::DirectoryKind_Name(s.directory().kind()), "DIRECTORY_KIND_")}});
      out.push_back(std::move(dir_up));
      auto registrations = Counter("kvrail_directory_registrations_total",
                                   "Times this daemon registered its node record in etcd.");
      AddSample(&registrations, static_cast<double>(s.directory().registrations()));
      out.push_back(std::move(registrations));
    }
    if (s.has_mps()) {
      auto mps = Gauge("kvrail_mps_active", "1 when a CUDA MPS control daemon was found at start.");
      AddSample(&mps, s.mps().active() ? 1 : 0);
      out.push_back(std::move(mps));
      auto corun = Gauge("kvrail_mps_corunning",
                         "1 when kvraild and the MPS server run as one user (kernels co-run); 0 "
                         "when they differ or it cannot be told yet. Only with MPS active.");
      if (s.mps().active())
        AddSample(&corun, s.mps().verdict().rfind("co-running", 0) == 0 ? 1 : 0);
      out.push_back(std::move(corun));
    }
    auto invariants =
        Counter("kvrail_invariant_violations_total",
                "Internal invariants found broken (KVRAIL_DCHECK in a release "
                "build: counted, logged once per place, and survived). Any is a bug.");
    AddSample(&invariants, static_cast<double>(InvariantViolations()));
    out.push_back(std::move(invariants));
    auto up = Gauge("kvrail_start_time_seconds", "Unix time the daemon started.");
    AddSample(&up, static_cast<double>(s.started_unix_us()) / 1e6);
    out.push_back(std::move(up));
    AppendProcessFamilies(&out);
    return out;
  }

 private:
  const MetricsOptions options_;
};

class MetricsImpl final : public Metrics {
 public:
  MetricsImpl(std::unique_ptr<prometheus::Exposer> exposer, MetricsOptions options)
      : exposer_(std::move(exposer)),
        registry_(std::make_shared<prometheus::Registry>()),
        transfers_(prometheus::BuildCounter()
                       .Name("kvrail_transfers_total")
                       .Help("Transfers that ended, by path, priority and result.")
                       .Register(*registry_)),
        latency_(prometheus::BuildHistogram()
                     .Name("kvrail_transfer_duration_seconds")
                     .Help("Submit-to-end time of ended transfers, by path and priority.")
                     .Register(*registry_)),
        queue_wait_(
            prometheus::BuildHistogram()
                .Name("kvrail_transfer_queue_wait_seconds")
                .Help("Submit-to-first-tile time of ended transfers that started, by "
                      "priority (layer-wise transfers include the wait for the first layer).")
                .Register(*registry_)),
        collectable_(std::make_shared<StatsCollectable>(std::move(options))) {
    exposer_->RegisterCollectable(registry_);
    exposer_->RegisterCollectable(collectable_);
  }

  void OnTransferFinished(const v1::TransferStatus& status) override {
    const v1::Path path = status.path();
    const v1::Priority priority = status.spec().priority();
    Ended(path, priority, status.state()).Increment();
    if (status.finished_unix_us() >= status.submitted_unix_us()) {
      Latency(path, priority)
          .Observe(static_cast<double>(status.finished_unix_us() - status.submitted_unix_us()) /
                   1e6);
    }
    if (status.started_unix_us() > 0 && status.started_unix_us() >= status.submitted_unix_us()) {
      QueueWait(priority).Observe(
          static_cast<double>(status.started_unix_us() - status.submitted_unix_us()) / 1e6);
    }
  }

  int port() const override {
    if (front_ != nullptr) return front_->port();
    const std::vector<int> ports = exposer_->GetListeningPorts();
    return ports.empty() ? 0 : ports.front();
  }
  // The exposer's port (on 127.0.0.1 behind a front).
  int exposer_port() const {
    const std::vector<int> ports = exposer_->GetListeningPorts();
    return ports.empty() ? 0 : ports.front();
  }
  void set_front(std::unique_ptr<internal::SecureFront> front) { front_ = std::move(front); }

 private:
  // A transfer's end runs OnTransferFinished on the thread that ended it: for a small host
  // transfer run inline, the admitting thread, before the client's acknowledgement. Family::Add
  // builds a label map and looks it up under the family's lock (three per end, ~1.3 us in all
  // on the build machine), so each series is looked up once, by its enum values, and kept here
  // (Family::Add returns the same child for the same labels: a race stores the same pointer).
  // Enum values outside the proto's (a peer's newer one) take Family::Add every time.
  static constexpr int kPaths = v1::Path_ARRAYSIZE, kPriorities = v1::Priority_ARRAYSIZE,
                       kStates = v1::TransferState_ARRAYSIZE;
  template <typename T, typename Make>
  static T& Cached(std::atomic<T*>& slot, Make make) {
    T* child = slot.load(std::memory_order_acquire);
    if (child == nullptr) {
      child = &make();
      slot.store(child, std::memory_order_release);
    }
    return *child;
  }
  static bool In(int value, int size) { return value >= 0 && value < size; }

  prometheus::Counter& Ended(v1::Path path, v1::Priority priority, v1::TransferState state) {
    auto make = [&]() -> prometheus::Counter& {
      return transfers_.Add({{"path", PathLabel(path)},
                             {"priority", PriorityLabel(priority)},
                             {"result", ResultLabel(state)}});
    };
    if (!In(path, kPaths) || !In(priority, kPriorities) || !In(state, kStates)) return make();
    return Cached(ended_[path][priority][state], make);
  }
  prometheus::Histogram& Latency(v1::Path path, v1::Priority priority) {
    static const prometheus::Histogram::BucketBoundaries kBuckets = {
        1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
    auto make = [&]() -> prometheus::Histogram& {
      return latency_.Add({{"path", PathLabel(path)}, {"priority", PriorityLabel(priority)}},
                          kBuckets);
    };
    if (!In(path, kPaths) || !In(priority, kPriorities)) return make();
    return Cached(latency_of_[path][priority], make);
  }
  prometheus::Histogram& QueueWait(v1::Priority priority) {
    static const prometheus::Histogram::BucketBoundaries kWaitBuckets = {
        1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.5, 1, 5};
    auto make = [&]() -> prometheus::Histogram& {
      return queue_wait_.Add({{"priority", PriorityLabel(priority)}}, kWaitBuckets);
    };
    if (!In(priority, kPriorities)) return make();
    return Cached(queue_wait_of_[priority], make);
  }

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& transfers_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Histogram>& queue_wait_;
  std::atomic<prometheus::Counter*> ended_[kPaths][kPriorities][kStates] = {};
  std::atomic<prometheus::Histogram*> latency_of_[kPaths][kPriorities] = {};
  std::atomic<prometheus::Histogram*> queue_wait_of_[kPriorities] = {};
  std::shared_ptr<StatsCollectable> collectable_;
  // Declared last: stopped before the exposer it asks.
  std::unique_ptr<internal::SecureFront> front_;
};

// A fresh secret for the exposer behind a front: 32 hex digits from the OS's random source.
std::string RandomSecret() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&out, absl::Hex(rd(), absl::kZeroPad8));
  return out;
}

}  // namespace

std::string PathLabel(v1::Path path) { return EnumLabel(v1::Path_Name(path), "PATH_"); }
std::string PriorityLabel(v1::Priority priority) {
  if (priority == v1::PRIORITY_UNSPECIFIED) return "normal";
  return EnumLabel(v1::Priority_Name(priority), "PRIORITY_");
}
std::string ResultLabel(v1::TransferState state) {
  return EnumLabel(v1::TransferState_Name(state), "TRANSFER_STATE_");
}

EngineSeries EngineSeriesOf(const std::string& gauge, double value) {
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  EngineSeries out{EngineGaugeName(gauge), value, ends_with(gauge, "_total")};
  // Prometheus spells units out, in base units.
  if (ends_with(out.name, "_ms")) {
    out.name = out.name.substr(0, out.name.size() - 3) + "_seconds";
    out.value = value / 1e3;
  } else if (ends_with(out.name, "_us")) {
    out.name = out.name.substr(0, out.name.size() - 3) + "_seconds";
    out.value = value / 1e6;
  }
  return out;
}

std::string EngineGaugeName(const std::string& gauge) {
  std::string name = "kvrail_engine_" + gauge;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') c = '_';
  }
  return name;
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen,
                                                        std::function<v1::Stats()> stats) {
  MetricsOptions options;
  options.listen = listen;
  options.stats = std::move(stats);
  return Start(std::move(options));
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(MetricsOptions options) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "metrics_tls: cert_file and key_file go together (both or neither)");
  }
  if (!options.tls_client_ca_file.empty() && options.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("metrics_tls.client_ca_file: needs cert_file and key_file");
  }
  const bool fronted = !options.tls_cert_file.empty() || !options.bearer_token.empty();
  const std::string bind = fronted ? "127.0.0.1:0" : options.listen;
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // civetweb reports bind failures by throwing; this is the one place exceptions are caught.
    exposer = std::make_unique<prometheus::Exposer>(bind, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics_listen: cannot serve metrics on '", bind, "': ", e.what()));
  }
  internal::SecureFrontOptions front;
  if (fronted) {
    const std::string secret = RandomSecret();
    exposer->RegisterAuth(
        [secret](const std::string& user, const std::string& password) {
          return user == "kvraild" && password == secret;
        },
        "kvraild");
    front.listen = options.listen;
    front.cert_file = options.tls_cert_file;
    front.key_file = options.tls_key_file;
    front.client_ca_file = options.tls_client_ca_file;
    front.bearer_token = options.bearer_token;
    front.backend_authorization = "Basic " + absl::Base64Escape("kvraild:" + secret);
  }
  auto metrics = std::make_unique<MetricsImpl>(std::move(exposer), std::move(options));
  if (fronted) {
    front.backend_port = metrics->exposer_port();
    absl::StatusOr<std::unique_ptr<internal::SecureFront>> started =
        internal::SecureFront::Start(std::move(front));
    if (!started.ok()) return started.status();
    metrics->set_front(std::move(*started));
  }
  return std::unique_ptr<Metrics>(std::move(metrics));
}

}  // namespace kvrail::metrics

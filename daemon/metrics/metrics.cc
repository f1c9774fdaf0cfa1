#include "daemon/metrics/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cctype>
#include <exception>

#include "absl/strings/str_cat.h"

namespace kvrail::metrics {
namespace {

std::string EnumLabel(const std::string& name, const std::string& prefix) {
  std::string out = name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

prometheus::MetricFamily Gauge(const std::string& name, const std::string& help) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = prometheus::MetricType::Gauge;
  return family;
}

void AddSample(prometheus::MetricFamily* family, double value,
               std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric metric;
  metric.label = std::move(labels);
  metric.gauge.value = value;
  family->metric.push_back(std::move(metric));
}

// Gauges computed from a Stats snapshot when Prometheus scrapes.
class StatsCollectable final : public prometheus::Collectable {
 public:
  explicit StatsCollectable(std::function<v1::Stats()> stats) : stats_(std::move(stats)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const v1::Stats s = stats_();
    std::vector<prometheus::MetricFamily> out;
    auto regions = Gauge("kvrail_regions", "Registered regions.");
    AddSample(&regions, static_cast<double>(s.regions()));
    out.push_back(std::move(regions));
    auto active = Gauge("kvrail_transfers_active", "Transfers queued or running.");
    AddSample(&active, static_cast<double>(s.transfers_active()));
    out.push_back(std::move(active));
    auto queued = Gauge("kvrail_queued_tiles", "Tiles waiting in engine queues, by priority class.");
    for (const auto& [priority, tiles] : s.queued_tiles()) {
      AddSample(&queued, static_cast<double>(tiles), {{"priority", priority}});
    }
    out.push_back(std::move(queued));
    auto draining = Gauge("kvrail_draining", "1 once SIGTERM arrived and new work is refused.");
    AddSample(&draining, s.draining() ? 1 : 0);
    out.push_back(std::move(draining));
    auto engines = Gauge("kvrail_engine_info",
                         "One sample per engine; the label describes its state (threads, SM budget).");
    for (const std::string& e : s.engines()) AddSample(&engines, 1, {{"engine", e}});
    out.push_back(std::move(engines));
    auto up = Gauge("kvrail_start_time_seconds", "Unix time the daemon started.");
    AddSample(&up, static_cast<double>(s.started_unix_us()) / 1e6);
    out.push_back(std::move(up));
    return out;
  }

 private:
  const std::function<v1::Stats()> stats_;
};

class MetricsImpl final : public Metrics {
 public:
  MetricsImpl(std::unique_ptr<prometheus::Exposer> exposer, std::function<v1::Stats()> stats)
      : exposer_(std::move(exposer)),
        registry_(std::make_shared<prometheus::Registry>()),
        transfers_(prometheus::BuildCounter()
                       .Name("kvrail_transfers_total")
                       .Help("Transfers that ended, by path, priority and result.")
                       .Register(*registry_)),
        bytes_(prometheus::BuildCounter()
                   .Name("kvrail_bytes_total")
                   .Help("Bytes moved by ended transfers, by path and priority.")
                   .Register(*registry_)),
        link_bytes_(prometheus::BuildCounter()
                        .Name("kvrail_link_bytes_total")
                        .Help("Bytes moved by ended transfers, by link (host, gpu0-gpu1, fabric NIC).")
                        .Register(*registry_)),
        latency_(prometheus::BuildHistogram()
                     .Name("kvrail_transfer_duration_seconds")
                     .Help("Submit-to-end time of ended transfers, by path and priority.")
                     .Register(*registry_)),
        collectable_(std::make_shared<StatsCollectable>(std::move(stats))) {
    exposer_->RegisterCollectable(registry_);
    exposer_->RegisterCollectable(collectable_);
  }

  void OnTransferFinished(const v1::TransferStatus& status) override {
    const std::string path = PathLabel(status.path());
    const std::string priority = PriorityLabel(status.spec().priority());
    transfers_.Add({{"path", path}, {"priority", priority}, {"result", ResultLabel(status.state())}})
        .Increment();
    bytes_.Add({{"path", path}, {"priority", priority}})
        .Increment(static_cast<double>(status.bytes_done()));
    // Per link: a fabric transfer's bytes are split evenly over the NICs that carried it.
    if (status.nics_size() > 0) {
      for (const std::string& nic : status.nics()) {
        link_bytes_.Add({{"link", "nic:" + nic}})
            .Increment(static_cast<double>(status.bytes_done()) / status.nics_size());
      }
    } else if (!status.link().empty()) {
      link_bytes_.Add({{"link", status.link()}}).Increment(static_cast<double>(status.bytes_done()));
    }
    if (status.finished_unix_us() >= status.submitted_unix_us()) {
      static const prometheus::Histogram::BucketBoundaries kBuckets = {
          1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
      latency_.Add({{"path", path}, {"priority", priority}}, kBuckets)
          .Observe(static_cast<double>(status.finished_unix_us() - status.submitted_unix_us()) / 1e6);
    }
  }

  int port() const override {
    const std::vector<int> ports = exposer_->GetListeningPorts();
    return ports.empty() ? 0 : ports.front();
  }

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& transfers_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Counter>& link_bytes_;
  prometheus::Family<prometheus::Histogram>& latency_;
  std::shared_ptr<StatsCollectable> collectable_;
};

}  // namespace

std::string PathLabel(v1::Path path) { return EnumLabel(v1::Path_Name(path), "PATH_"); }
std::string PriorityLabel(v1::Priority priority) {
  if (priority == v1::PRIORITY_UNSPECIFIED) return "normal";
  return EnumLabel(v1::Priority_Name(priority), "PRIORITY_");
}
std::string ResultLabel(v1::TransferState state) {
  return EnumLabel(v1::TransferState_Name(state), "TRANSFER_STATE_");
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen,
                                                        std::function<v1::Stats()> stats) {
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // civetweb reports bind failures by throwing; this is the one place exceptions are caught.
    exposer = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics_listen: cannot serve metrics on '", listen, "': ", e.what()));
  }
  return std::unique_ptr<Metrics>(std::make_unique<MetricsImpl>(std::move(exposer), std::move(stats)));
}

}  // namespace kvrail::metrics

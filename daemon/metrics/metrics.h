// Prometheus metrics: counters and latency histograms updated as transfers end, plus gauges read
// from a Stats snapshot at scrape time (regions, active transfers, queue depths, engine state).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "proto/kvrail/v1/admin.pb.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::metrics {

// Thread-safe. Serves GET /metrics on its own HTTP threads (civetweb, inside prometheus-cpp).
class Metrics {
 public:
  virtual ~Metrics() = default;
  // Binds `listen` ("127.0.0.1:9464"; port 0 picks one). `stats` is called at each scrape.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& listen,
                                                        std::function<v1::Stats()> stats);
  // Counts a transfer that reached a final state.
  virtual void OnTransferFinished(const v1::TransferStatus& status) = 0;
  virtual int port() const = 0;
};

// Label values used by the metrics (lower case, stable): "host_local", "nvlink_p2p", ...
std::string PathLabel(v1::Path path);
std::string PriorityLabel(v1::Priority priority);
std::string ResultLabel(v1::TransferState state);

}  // namespace kvrail::metrics

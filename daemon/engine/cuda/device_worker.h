// One GPU of the CUDA engine: its parts and their threads. The dispatcher thread binds the GPU,
// makes what serving needs (the gate's streams and abort page, the staging slots, the warm-up)
// and then runs the Dispatcher; the gate's watchdog runs on a thread of its own (stream_wait).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/engine/cuda/cuda_engine_options.h"
#include "daemon/engine/cuda/dispatch_queues.h"
#include "daemon/engine/cuda/dispatcher.h"
#include "daemon/engine/cuda/gpu_gate.h"
#include "daemon/engine/cuda/gpu_ops.h"
#include "daemon/engine/cuda/worker_stats.h"
#include "daemon/engine/engine.h"

namespace kvrail::engine::cuda_detail {

// Thread contract: every public method from any thread (the parts they reach are thread-safe).
class DeviceWorker {
 public:
  DeviceWorker(const CudaEngineOptions& options, std::unique_ptr<GpuOps> ops);
  ~DeviceWorker();  // stops the dispatcher (gated waits released), then the watchdog

  void Enqueue(const std::shared_ptr<Job>& job, const std::vector<uint32_t>& tiles) {
    queues_.Enqueue(job, tiles);
  }
  // Engine::Expect for this GPU: a sleeping dispatcher wakes now and spins up to
  // dispatcher_spin_us for the job being planned. Nothing without the spin.
  void Expect() {
    if (options_.wake_on_submit && options_.dispatcher_spin_us > 0) queues_.Expect();
  }
  size_t Remove(const Job* job) { return queues_.Remove(job); }
  void FinishStartedFirst() { queues_.FinishStartedFirst(); }
  void AddQueued(std::vector<uint64_t>* out) const { queues_.AddQueued(out); }
  // Engine::AdmitGated for this GPU (scheduler::GateSlots decides).
  bool AdmitGated(const std::shared_ptr<Job>& job);
  std::string Describe() const;
  // This GPU's numeric state for metrics (WorkerStats::Gauges).
  std::map<std::string, double> Gauges() const { return stats_.Gauges(); }
  // Blocks until the dispatcher has warmed its GPU up (or found it cannot).
  void AwaitWarm() const { stats_.AwaitWarm(); }

 private:
  void Serve();

  const CudaEngineOptions options_;
  const std::unique_ptr<GpuOps> ops_;
  const int critical_ctas_;
  DispatchQueues queues_;
  WorkerStats stats_;
  GpuGate gate_;
  Dispatcher dispatcher_;
  std::thread thread_;
};

}  // namespace kvrail::engine::cuda_detail

// Engines execute plans tile by tile. The transfer layer hands an engine a job (//daemon/job) and
// the tiles that are ready; the engine runs them in the order the scheduler's policy decides
// (//daemon/scheduler: tile_queues, cuda_batch_policy: critical > normal > background, re-chosen
// per tile or batch, so preemption at that granularity) and reports each tile. This header is the
// interface only (no CUDA); the engines are //daemon/engine:host_engine (host_engine.h) and
// //daemon/engine:cuda_engine (cuda_engine.h, the only target that links CUDA).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/job/job.h"
#include "daemon/planner/planner.h"

namespace kvrail::engine {

// The job package's types, as the engines name them.
using job::ClassLimits;
using job::DeviceSides;
using job::DoneWord;
using job::Job;
using job::kNumPriorityClasses;
using job::Placement;
using job::PriorityClass;
using job::PriorityClassName;
using job::PriorityLimits;
using job::ReadyGate;

// What an engine declares it can do, fixed once it is made. The transfer layer routes and asks
// by these (//daemon/transfers:engine_registry), never by an engine's name.
struct Capabilities {
  // The memory it moves: transfers between two host regions, and transfers with a side in GPU
  // memory (either side or both).
  bool host_to_host = false;
  bool gpu_memory = false;
  // GPUs it runs transfers on (kvrail_cuda_gpus); 0 for engines without GPUs.
  int gpu_count = 0;
  // AdmitGated may take a job's tiles before their layers are ready (the GPU-side readiness
  // wait); false: it is never asked.
  bool gated_admission = false;
  // It hashes tiles when Job::wants_digest (TransferSpec.digest); false: such transfers are
  // refused before they are queued.
  bool digest = false;
  // Where plans it may run keep their block tables (PlanOptions.tables); nullptr: any memory.
  // The CUDA engine's pool is pinned host memory, which it uploads asynchronously; the host
  // engine's recycles heap buffers (//daemon/planner:table_pool).
  planner::TableAllocator* table_pool = nullptr;
};

// Thread-safe.
class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string name() const = 0;
  virtual Capabilities capabilities() const = 0;
  // Queues `tiles` of `job` (they may start at once). The engine keeps `job` alive until each
  // queued tile is reported or removed.
  virtual void Enqueue(const std::shared_ptr<Job>& job, const std::vector<uint32_t>& tiles) = 0;
  // Enqueue from the thread that admits `job`, holding no lock that the job's reports take (its
  // end runs the transfer's waiters): an engine may run small work right here, on the calling
  // thread, where handing it to a sleeping worker would cost a wake-up longer than the work
  // (HostEngine: jobs of at most its inline byte limit). The tiles are then reported before it
  // returns. Default: Enqueue.
  virtual void EnqueueAdmitted(const std::shared_ptr<Job>& job,
                               const std::vector<uint32_t>& tiles) {
    Enqueue(job, tiles);
  }
  // Removes the job's queued, not yet started tiles and returns how many were removed; those are
  // never reported. Tiles already running still report.
  virtual size_t Remove(const Job* job) = 0;
  // Queued tiles per priority class.
  virtual std::vector<uint64_t> QueuedTiles() const = 0;
  // Seconds until `bytes` more of class `priority` would be done, counting the work queued ahead
  // of it (its class and higher ones), from the throughput measured so far; nullopt until the
  // engine has measured enough to say. Used to fail transfers early that cannot meet a deadline.
  virtual std::optional<double> EstimateSeconds(uint64_t bytes, PriorityClass priority) const {
    return std::nullopt;
  }
  // A line for humans ("host: 4 threads").
  virtual std::string Describe() const = 0;
  // The engine's numeric state by name ("threads", "worker_bytes_per_second", "max_ctas"), for
  // metrics gauges (a changing measurement never goes into a label). Empty by default.
  virtual std::map<std::string, double> Gauges() const { return {}; }
  // GPU-side readiness wait: true when the engine takes all of `job`'s tiles now, before their
  // layers are ready (Job::ready_gate), and waits for the flags on the GPU; false: hand the tiles
  // over as their layers become ready (the readiness poller). Called once per job, before its
  // first Enqueue, when Capabilities::gated_admission.
  virtual bool AdmitGated(const std::shared_ptr<Job>& job) { return false; }
  // A hint, before a submit between `src` and `dst` is planned: a job between them is likely to
  // be enqueued soon. An engine whose worker sleeps may wake it now, so its wake-up overlaps the
  // planning instead of delaying the first tile. No effect on what runs. Any thread.
  virtual void Expect(const Placement& src, const Placement& dst) {}
  // The drain's order, from now on and for good: queued tiles of started jobs before any tile of
  // a job not started yet, and within a priority class one job's tiles to its end before the
  // next job's (the one with the fewest tiles left first) - so the drain's time finishes
  // transfers instead of advancing every one of them a little. Any thread.
  virtual void FinishStartedFirst() {}
};

}  // namespace kvrail::engine

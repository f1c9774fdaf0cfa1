// Engines execute plans tile by tile. The transfer layer hands an engine a job and the tiles that
// are ready; the engine runs them in priority order (critical > normal > background, round robin
// within a class, re-chosen per tile: preemption at tile granularity) and reports each tile.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/planner/planner.h"

namespace kvrail::engine {

enum class PriorityClass { kCritical = 0, kNormal = 1, kBackground = 2 };
inline constexpr int kNumPriorityClasses = 3;
const char* PriorityClassName(PriorityClass p);

// One transfer as an engine sees it. Implemented by the transfer layer. OnTileDone may be called
// from any engine thread, concurrently for different tiles.
class Job {
 public:
  virtual ~Job() = default;
  virtual const planner::Plan& plan() const = 0;
  virtual const uint8_t* src_base() const = 0;
  virtual uint8_t* dst_base() const = 0;
  virtual PriorityClass priority() const = 0;
  // Called by the worker that is about to move `tile`.
  virtual void OnTileStart(uint32_t tile) = 0;
  // `status` is OK when the tile's bytes landed.
  virtual void OnTileDone(uint32_t tile, const absl::Status& status) = 0;
};

// Thread-safe.
class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string name() const = 0;
  // Queues `tiles` of `job` (they may start at once). The engine keeps `job` alive until each
  // queued tile is reported or removed.
  virtual void Enqueue(const std::shared_ptr<Job>& job, const std::vector<uint32_t>& tiles) = 0;
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
};

// Runs tiles with memcpy on `threads` worker threads (the host twin of the kernels' arithmetic).
std::unique_ptr<Engine> CreateHostEngine(int threads);

}  // namespace kvrail::engine

// Engines execute plans tile by tile. The transfer layer hands an engine a job and the tiles that
// are ready; the engine runs them in priority order (critical > normal > background, round robin
// within a class, re-chosen per tile: preemption at tile granularity) and reports each tile.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/planner/planner.h"

namespace kvrail::engine {

enum class PriorityClass { kCritical = 0, kNormal = 1, kBackground = 2 };
inline constexpr int kNumPriorityClasses = 3;
const char* PriorityClassName(PriorityClass p);

// Where one side of a job lives.
struct MemoryRef {
  bool cuda = false;        // device memory of GPU `device`; else host memory
  int device = -1;          // CUDA ordinal (cuda only)
  uint8_t* base = nullptr;  // the region's base in the daemon (host or device address)
};

// One transfer as an engine sees it. Implemented by the transfer layer. OnTileDone may be called
// from any engine thread, concurrently for different tiles.
class Job {
 public:
  enum class Side { kSrc, kDst };
  virtual ~Job() = default;
  virtual const planner::Plan& plan() const = 0;
  virtual const uint8_t* src_base() const = 0;
  virtual uint8_t* dst_base() const = 0;
  // Placement of each side; the defaults describe host memory at src_base() / dst_base().
  virtual MemoryRef src() const { return MemoryRef{false, -1, const_cast<uint8_t*>(src_base())}; }
  virtual MemoryRef dst() const { return MemoryRef{false, -1, dst_base()}; }
  // The address CUDA code running on GPU `accessor` uses for a side (host memory pinned and
  // mapped on first use; a peer GPU's memory mapped into the accessor's context). Called by the
  // CUDA engine only.
  virtual absl::StatusOr<uint8_t*> DeviceAddress(Side side, int accessor) const {
    return absl::UnimplementedError("this job has no device addresses");
  }
  // The engine says how it moved (some of) the job's tiles: "cuda-kernel", "cuda-copy-engine".
  virtual void OnEngineUsed(absl::string_view engine) {}
  virtual PriorityClass priority() const = 0;
  // Whether more tiles may still come (a layer-wise job between layers). Engines keep per-job
  // state (an uploaded plan, pinned addresses) while this holds, instead of setting it up again
  // for every layer.
  virtual bool MayGetMoreTiles() const { return false; }
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
  // Where plans this engine may run keep their block tables (PlanOptions.tables); nullptr: any
  // memory. The CUDA engine's pool is pinned host memory, which it uploads asynchronously.
  virtual planner::TablePool* table_pool() const { return nullptr; }
};

// What one priority class may use at once; 0 means no limit.
struct ClassLimits {
  uint32_t max_ctas = 0;            // CUDA engine only
  uint64_t max_inflight_bytes = 0;  // a class with nothing in flight may always start one tile
};
using PriorityLimits = std::array<ClassLimits, kNumPriorityClasses>;

// Whether a class with `inflight` bytes being moved may start `next` more under `limit`.
inline bool MayStart(const ClassLimits& limit, uint64_t inflight, uint64_t next) {
  return limit.max_inflight_bytes == 0 || inflight == 0 ||
         inflight + next <= limit.max_inflight_bytes;
}

// Runs tiles with memcpy on `threads` worker threads (the host twin of the kernels' arithmetic).
std::unique_ptr<Engine> CreateHostEngine(int threads, const PriorityLimits& limits = {});

// The CUDA engine (see docs/architecture.md, "CUDA engine"): one dispatcher thread and stream per
// GPU; each job runs on one GPU (cuda_internal::ExecutingDevice).
struct CudaEngineOptions {
  // SM budget: the most CTAs (of 512 threads) one launch may use. 0: copy engines only.
  int max_ctas = 32;
  // > 0: always launch this many CTAs (capped by max_ctas); 0: find the knee at run time.
  int fixed_ctas = 0;
  // Plans whose coalesced contiguous runs average at least this many bytes go to the copy
  // engines (cudaMemcpyBatchAsync) instead of the kernel.
  uint64_t copy_engine_min_run_bytes = 1 << 20;
  // Bytes one launch (batch of consecutive tiles) aims for.
  uint64_t batch_bytes = 64 << 20;
  // Batches between two re-probes of the CTA knee.
  int reprobe_batches = 256;
  // GPU-to-GPU transfers run on the destination GPU (its SMs load from the peer) instead of the
  // source GPU (its SMs store into the peer).
  bool run_on_destination = false;
  // Devices to serve; empty: every GPU the runtime sees.
  std::vector<int> devices;
  // Per priority class: CTAs per launch and bytes in flight.
  PriorityLimits limits;
};

// FAILED_PRECONDITION (with the runtime's reason) when there is no driver or no GPU.
absl::StatusOr<std::unique_ptr<Engine>> CreateCudaEngine(const CudaEngineOptions& options);

}  // namespace kvrail::engine

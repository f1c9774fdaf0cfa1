// Engines execute plans tile by tile. The transfer layer hands an engine a job and the tiles that
// are ready; the engine runs them in the order the scheduler's policy decides (//daemon/scheduler:
// tile_queues, cuda_batch_policy: critical > normal > background, re-chosen per tile or batch, so
// preemption at that granularity) and reports each tile. This header is the interface only (no
// CUDA); the engines are //daemon/engine:host_engine (host_engine.h) and
// //daemon/engine:cuda_engine (cuda_engine.h, the only target that links CUDA).
#pragma once

#include <array>
#include <cstdint>
#include <map>
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
  // Per-layer sides (planner::Plan::src_per_layer): the layers' addresses for CUDA code on GPU
  // `accessor` (Region::DeviceLayerBases); nullptr for a side of one base.
  virtual absl::StatusOr<std::shared_ptr<const planner::LayerBases>> DeviceLayerBases(
      Side side, int accessor) const {
    return std::shared_ptr<const planner::LayerBases>();
  }
  // The engine says how it moved (some of) the job's tiles: "cuda-kernel", "cuda-copy-engine".
  virtual void OnEngineUsed(absl::string_view engine) {}
  // The engine says why it moved the job as it did when that is worth an operator's attention
  // (the copy-engine-only mode handing a plan to a small kernel, or keeping a slow one): shown
  // after the route's reason in TransferStatus.path_reason. The latest note wins.
  virtual void OnEngineNote(absl::string_view note) {}
  virtual PriorityClass priority() const = 0;
  // Whether more tiles may still come (a layer-wise job between layers). Engines keep per-job
  // state (an uploaded plan, pinned addresses) while this holds, instead of setting it up again
  // for every layer.
  virtual bool MayGetMoreTiles() const { return false; }
  // TransferSpec.digest: whether the engine hashes the job's tiles (kernels/digest.h):
  // the source bytes while moving them, the destination's bytes read back after they landed. It
  // then calls OnTileDigest before OnTileDone for each tile it moved, and reports a tile whose
  // digests differ as failed (planner::DigestMismatchError, DATA_LOSS). Off: no hashing at all.
  virtual bool wants_digest() const { return false; }
  virtual void OnTileDigest(uint32_t tile, uint64_t source, uint64_t destination) {}
  // GPU-side readiness wait (scheduler/stream_gate.h): a layer-wise job whose layers
  // are gated by producer flag words. Word L (of `count`) gates the tiles of transfer layer L: they
  // may move once it has reached `value` (wrapping order). Set only by jobs that an engine admitted
  // with Engine::AdmitGated; such a job hands its tiles before they are ready.
  struct ReadyGate {
    uint32_t* host_words = nullptr;  // the daemon's mapping (read, and raised on a release)
    uint64_t device_words = 0;       // the same words as the GPU sees them (mapped host memory)
    uint32_t count = 0;
    uint32_t value = 0;
    std::string field;                 // "spec.ready_flags"
    std::shared_ptr<const void> keep;  // keeps the words mapped while the engine holds the gate
  };
  virtual std::optional<ReadyGate> ready_gate(int accessor) const { return std::nullopt; }
  // OK while the job goes on; once it ended early (cancelled, deadline, the producer gone) the
  // status it ended with, and `*producer_gone` whether nobody may write its ready words any more.
  // The CUDA engine polls it while gated copies wait.
  virtual absl::Status ended(bool* producer_gone) const { return absl::OkStatus(); }
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
  // The engine's numeric state by name ("threads", "worker_bytes_per_second", "max_ctas"), for
  // metrics gauges (a changing measurement never goes into a label). Empty by default.
  virtual std::map<std::string, double> Gauges() const { return {}; }
  // Where plans this engine may run keep their block tables (PlanOptions.tables); nullptr: any
  // memory. The CUDA engine's pool is pinned host memory, which it uploads asynchronously; the
  // host engine's recycles heap buffers (//daemon/planner:table_pool).
  virtual planner::TableAllocator* table_pool() const { return nullptr; }
  // GPU-side readiness wait: true when the engine takes all of `job`'s tiles now, before their
  // layers are ready (Job::ready_gate), and waits for the flags on the GPU; false: hand the tiles
  // over as their layers become ready (the readiness poller). Called once per job, before its
  // first Enqueue.
  virtual bool AdmitGated(const std::shared_ptr<Job>& job) { return false; }
  // A hint, before a submit between `src` and `dst` is planned: a job between them is likely to
  // be enqueued soon. An engine whose worker sleeps may wake it now, so its wake-up overlaps the
  // planning instead of delaying the first tile. No effect on what runs. Any thread.
  virtual void Expect(const MemoryRef& src, const MemoryRef& dst) {}
  // GPUs this engine runs transfers on (0 for engines without GPUs): kvrail_cuda_gpus.
  virtual int gpu_count() const { return 0; }
  // The drain's order, from now on and for good: queued tiles of started jobs before any tile of
  // a job not started yet, and within a priority class one job's tiles to its end before the
  // next job's (the one with the fewest tiles left first) - so the drain's time finishes
  // transfers instead of advancing every one of them a little. Any thread.
  virtual void FinishStartedFirst() {}
};

// What one priority class may use at once; 0 means no limit.
struct ClassLimits {
  uint32_t max_ctas = 0;            // CUDA engine only
  uint64_t max_inflight_bytes = 0;  // a class with nothing in flight may always start one tile
};
using PriorityLimits = std::array<ClassLimits, kNumPriorityClasses>;

}  // namespace kvrail::engine

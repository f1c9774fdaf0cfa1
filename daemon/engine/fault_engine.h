// A fault-injecting decorator for any Engine (tests and fault drills): it fails or delays chosen
// tiles and hands the rest to the engine it wraps, keeping the Engine contract: every enqueued
// tile reports exactly once unless Remove took it off a queue (the decorator's own holding queue
// or the wrapped engine's), and Remove counts both.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "daemon/engine/engine.h"

namespace kvrail::engine {

// A tile as the fault policy sees it. Jobs carry no transfer id, so a job is named by the order
// in which the decorator first saw it (0, 1, ...) or by its pointer.
struct TileRef {
  const Job* job = nullptr;
  uint64_t job_ordinal = 0;   // 0 for the first job enqueued on this decorator, 1 for the next
  uint32_t tile = 0;          // the tile's index in the job's plan
  uint64_t tile_ordinal = 0;  // 0 for the first tile enqueued on this decorator, across jobs
};

// What happens to one tile.
struct Fault {
  enum class Kind {
    kNone,   // handed to the wrapped engine at once
    kFail,   // never runs: reported (OnTileStart, then OnTileDone with `status`) from the
             // decorator's thread; no byte of it moves
    kHold,   // held until ReleaseHeld()
    kDelay,  // held until `delay` has passed on the decorator's clock
  };
  Kind kind = Kind::kNone;
  absl::Status status;
  absl::Duration delay;

  static Fault None() { return Fault{}; }
  static Fault Fail(absl::Status status) { return Fault{Kind::kFail, std::move(status), {}}; }
  static Fault Hold() { return Fault{Kind::kHold, absl::OkStatus(), absl::InfiniteDuration()}; }
  static Fault Delay(absl::Duration delay) { return Fault{Kind::kDelay, absl::OkStatus(), delay}; }
};

// Decides each tile's fault when it is enqueued. Called under the decorator's lock: it must be
// quick and must not call into the decorator or the job.
using FaultPolicy = std::function<Fault(const TileRef&)>;

// Every `n`th tile enqueued (the n-th, 2n-th, ...) fails with `status`.
FaultPolicy FailEveryNth(uint64_t n, absl::Status status);
// Tiles `tiles` of the job with ordinal `job_ordinal` fail with `status`.
FaultPolicy FailTiles(uint64_t job_ordinal, std::vector<uint32_t> tiles, absl::Status status);

// Thread-safe (engine.h). Destroy only after every job's tiles have reported or been removed
// (as for any engine); the wrapped engine must outlive the decorator.
class FaultInjectingEngine : public Engine {
 public:
  // `inner` is not owned. `clock` (not owned; nullptr: the real one) measures kDelay.
  static std::unique_ptr<FaultInjectingEngine> Create(Engine* inner, FaultPolicy policy,
                                                      Clock* clock = nullptr);
  // Replaces the policy for tiles enqueued from now on.
  virtual void SetPolicy(FaultPolicy policy) = 0;
  // Hands every held tile (kHold, and kDelay not yet due) to the wrapped engine now.
  virtual void ReleaseHeld() = 0;
  // Tiles now held by the decorator (not yet handed on, not removed).
  virtual size_t held() const = 0;
  // Tiles failed by injection so far (reported).
  virtual uint64_t failed() const = 0;
};

}  // namespace kvrail::engine

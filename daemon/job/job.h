// Jobs: one transfer as the scheduler's queues and the engines see it, its priority class and the
// classes' limits, and where each of its sides lives. Below //daemon/scheduler and
// //daemon/engine (both include this, neither the other's headers for these types); no CUDA.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/planner/planner.h"

namespace kvrail::job {

enum class PriorityClass { kCritical = 0, kNormal = 1, kBackground = 2 };
inline constexpr int kNumPriorityClasses = 3;
const char* PriorityClassName(PriorityClass p);

// What one priority class may use at once; 0 means no limit.
struct ClassLimits {
  uint32_t max_ctas = 0;            // CUDA engine only
  uint64_t max_inflight_bytes = 0;  // a class with nothing in flight may always start one tile
};
using PriorityLimits = std::array<ClassLimits, kNumPriorityClasses>;

// Where one side of a transfer lives: the route's input (//daemon/scheduler:route), the engines'
// view of a job's side, the fabric's region side when it packs or scatters a tile.
struct Placement {
  bool cuda = false;        // device memory of GPU `device`; else host memory of this node
  int device = -1;          // CUDA ordinal (cuda only)
  uint8_t* base = nullptr;  // the region's base in the daemon (host or device address); may be
                            // null where only the memory's kind matters (routing)

  static Placement Host(uint8_t* base = nullptr) { return Placement{false, -1, base}; }
  static Placement Gpu(int device, uint8_t* base = nullptr) {
    return Placement{true, device, base};
  }
};

// A side of a job.
enum class Side { kSrc, kDst };

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

// The GPU-written completion (TransferSpec.done_word): one 64-bit word in the submitter's own
// host memory, pinned and mapped for the GPU. An engine that supports it stores `value` there in
// stream order after every byte of the job landed, so the client sees the end before the daemon
// does; it stores nothing for a job that failed, was cancelled or released, or hashes its bytes
// (a digest is compared on the CPU after the copy).
struct DoneWord {
  uint64_t device_word = 0;          // the word as CUDA code on the accessor GPU addresses it
  uint64_t value = 0;                // never 0
  std::shared_ptr<const void> keep;  // keeps the word mapped while the engine holds it
};

// A job's sides as engines that run CUDA code (the CUDA engine, the fabric's GPU pack) reach
// them: where each lives, its device addresses, the ready flags' gate, and the GPU mode report.
// Engines without GPUs never ask for it. Thread-safe; valid while tiles of its job run (the
// transfer layer keeps the sides until then).
class DeviceSides {
 public:
  virtual ~DeviceSides() = default;
  virtual Placement src() const = 0;
  virtual Placement dst() const = 0;
  // The address CUDA code running on GPU `accessor` uses for a side (host memory pinned and
  // mapped on first use; a peer GPU's memory mapped into the accessor's context).
  virtual absl::StatusOr<uint8_t*> DeviceAddress(Side side, int accessor) const = 0;
  // Per-layer sides (planner::Plan::src_per_layer): the layers' addresses for CUDA code on GPU
  // `accessor` (Region::DeviceLayerBases); nullptr for a side of one base.
  virtual absl::StatusOr<std::shared_ptr<const planner::LayerBases>> DeviceLayerBases(
      Side side, int accessor) const {
    return std::shared_ptr<const planner::LayerBases>();
  }
  // The GPU-side readiness wait's words on GPU `accessor` (ReadyGate); nullopt: none. Set only
  // for jobs that an engine admitted with Engine::AdmitGated.
  virtual std::optional<ReadyGate> ready_gate(int accessor) const { return std::nullopt; }
  // The word the GPU writes when the job's last tile landed (DoneWord), its device address on GPU
  // `accessor`; nullopt: none (the daemon's completion is the only one).
  virtual std::optional<DoneWord> done_word(int accessor) const { return std::nullopt; }
  // The engine says how it moved (some of) the job's tiles: "cuda-kernel", "cuda-copy-engine".
  virtual void OnEngineUsed(absl::string_view engine) {}
};

// One transfer as an engine sees it: a small core every engine uses, and device_sides() for
// engines that run CUDA code. Implemented by the transfer layer. OnTileDone may be called from
// any engine thread, concurrently for different tiles.
class Job {
 public:
  using Side = job::Side;
  using ReadyGate = job::ReadyGate;
  virtual ~Job() = default;
  virtual const planner::Plan& plan() const = 0;
  virtual PriorityClass priority() const = 0;
  // The sides' bases in the daemon: host memory that the host engine reads and writes (for GPU
  // memory, an address in its GPU's context: see device_sides()).
  virtual const uint8_t* src_base() const = 0;
  virtual uint8_t* dst_base() const = 0;
  // Called by the worker that is about to move `tile`.
  virtual void OnTileStart(uint32_t tile) = 0;
  // `status` is OK when the tile's bytes landed.
  virtual void OnTileDone(uint32_t tile, const absl::Status& status) = 0;
  // OK while the job goes on; once it ended early (cancelled, deadline, the producer gone) the
  // status it ended with, and `*producer_gone` whether nobody may write its ready words any more.
  // The CUDA engine polls it while gated copies wait.
  virtual absl::Status ended(bool* producer_gone) const { return absl::OkStatus(); }
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
  // The engine says why it moved the job as it did when that is worth an operator's attention
  // (the copy-engine-only mode handing a plan to a small kernel, or keeping a slow one): shown
  // after the route's reason in TransferStatus.path_reason. The latest note wins.
  virtual void OnEngineNote(absl::string_view note) {}
  // The job's GPU side; nullptr: both sides are host memory at src_base() / dst_base().
  virtual DeviceSides* device_sides() const { return nullptr; }

  // Placement of each side: device_sides()'s, else host memory at src_base() / dst_base().
  Placement src() const {
    const DeviceSides* sides = device_sides();
    return sides != nullptr ? sides->src() : Placement::Host(const_cast<uint8_t*>(src_base()));
  }
  Placement dst() const {
    const DeviceSides* sides = device_sides();
    return sides != nullptr ? sides->dst() : Placement::Host(dst_base());
  }
};

}  // namespace kvrail::job

// Plan buffers kept on the GPU between jobs of the same shape (kernels/plan_image.h:
// PlanShapeKey: the whole image but its block ids), so a repeated request shape uploads only its
// block ids (GpuOps::UploadBlockIds) instead of allocating and uploading its whole image.
//
// A buffer belongs to one job at a time: Take hands it out of the cache and the job's state holds
// it until the state is dropped, so no other job rewrites its ids while a batch of its holder may
// still be launched; a second job of that shape meanwhile misses and gets a buffer of its own (one
// buffer per job in flight). Give puts it back with an event recorded on the main stream after its
// holder's last use, and Take passes over a buffer whose event the stream has not passed: ids are
// never rewritten under a kernel that reads them. Bounded by entries and bytes; the least
// recently given back goes first. Gated jobs keep out (the gate's abort zeroes the tile count in
// their uploaded header); Clear drops everything (a sticky fault leaves the buffers unusable).
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <optional>
#include <string>

#include "daemon/engine/cuda/gpu_ops.h"

namespace kvrail::engine::cuda_detail {

// Thread contract: the dispatcher thread only.
class WarmPlans {
 public:
  struct Limits {
    size_t max_entries = 0;  // 0: nothing is kept
    size_t max_bytes = 0;
  };
  // What a job holds of a kept buffer beside the buffer itself: its shape, its size, its event.
  struct Ticket {
    std::string key;
    size_t bytes = 0;
    std::unique_ptr<GpuEvent> released;  // nullptr until first given back
  };
  struct Kept {
    std::unique_ptr<GpuPlan> plan;
    Ticket ticket;
  };

  WarmPlans(GpuOps* ops, Limits limits) : ops_(ops), limits_(limits) {}

  bool enabled() const { return limits_.max_entries > 0 && limits_.max_bytes > 0; }
  // A kept buffer of `key`'s shape whose last holder the main stream has passed, out of the
  // cache (the most recently given back first); nullopt: none.
  std::optional<Kept> Take(const std::string& key);
  // Keeps `plan` (uploaded for ticket.key's shape, ticket.bytes on the GPU) after everything
  // enqueued on the main stream so far; evicts the least recently given back beyond the bounds.
  // A plan that cannot be kept (larger than max_bytes, its event not recorded) is freed (in
  // stream order).
  void Give(Ticket ticket, std::unique_ptr<GpuPlan> plan);
  // Frees every kept buffer (in stream order).
  void Clear();

  size_t entries() const { return lru_.size(); }
  size_t bytes() const { return bytes_; }

 private:
  using Lru = std::list<Kept>;  // most recently given back first
  void Erase(Lru::iterator it);

  GpuOps* const ops_;
  const Limits limits_;
  Lru lru_;
  size_t bytes_ = 0;
};

}  // namespace kvrail::engine::cuda_detail

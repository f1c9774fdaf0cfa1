// Internal to the transfers module: prepared transfers (TransferManager::Prepare / Post). A
// Prepared is a shape resolved and planned once; PreparedTable holds them by id for the session
// that prepared them, and forgets them when that session ends or either region is unregistered,
// so a prepared id never outlives what it was checked against.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/engine/engine.h"
#include "daemon/planner/planner.h"
#include "daemon/regions/regions.h"
#include "daemon/transfers/grant_uses.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::transfers {

// A prepared transfer's shape, fixed at Prepare. Immutable once made: read by posts on any
// thread without a lock (held by shared_ptr while a post uses it).
struct Prepared {
  uint64_t session = 0;    // the owner: the only session that may post or release it
  v1::TransferSpec light;  // the validated spec (no block ids; session_id set)
  std::shared_ptr<regions::Region> src, dst;
  engine::PriorityClass priority = engine::PriorityClass::kNormal;
  v1::Path path = v1::PATH_UNSPECIFIED;
  std::string path_reason;
  engine::Engine* engine = nullptr;  // not owned
  bool on_cuda = false;              // the CUDA engine runs it (each post tells it: Expect)
  std::string link;
  planner::PlanTemplate plan;
  // The sides used on a grant (GrantUsesOf): rechecked by every post, and registered with each
  // posted transfer so the grant's end ends it.
  std::vector<GrantUse> grant_uses;
};

// The answer for a prepared id that is unknown, released, gone with its session or region, or
// another session's: NOT_FOUND naming prepared_id, the same message for all.
absl::Status UnknownPrepared(uint64_t id);

// Thread-safe (mu_).
class PreparedTable {
 public:
  explicit PreparedTable(uint32_t max_per_session) : max_per_session_(max_per_session) {}
  // Keeps `prepared` for its session under a new id; RESOURCE_EXHAUSTED naming
  // max_prepared_per_session when the session holds the cap already.
  absl::StatusOr<uint64_t> Add(std::shared_ptr<const Prepared> prepared);
  // The prepared transfer `id` if `session` owns it; UnknownPrepared otherwise.
  absl::StatusOr<std::shared_ptr<const Prepared>> Find(uint64_t id, uint64_t session) const;
  // Drops `id` if `session` owns it; UnknownPrepared otherwise.
  absl::Status Release(uint64_t id, uint64_t session);
  // Drops every prepared transfer of `session`, and every one using a region `session` owns.
  void EndSession(uint64_t session);
  // Drops every prepared transfer using region `region_id` (unregistered).
  void DropRegion(uint64_t region_id);
  // Prepared transfers held (all sessions; of one session).
  size_t size() const;
  size_t held_by(uint64_t session) const;

 private:
  // Drops every entry for which `gone` is true. Takes mu_; the entries are destroyed outside it.
  template <typename Pred>
  void DropIf(Pred gone);

  const uint32_t max_per_session_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<const Prepared>> by_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint32_t> per_session_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvrail::transfers

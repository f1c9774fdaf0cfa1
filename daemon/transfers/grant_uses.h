// Internal to the transfers module: the transfers that move bytes on a grant (docs/security.md,
// "Grants"), so that the grant's end ends them. A grant is checked at submit; a transfer may run
// long after (a layer-wise one waits for its producer), so revocation, expiry, the region's
// unregistration and its owner's session end (each drops the grant) must also end every transfer
// still depending on it, before any further tile of it is queued or started. The region table
// calls Recheck after each such change (RegionTable::AddAccessHook), the deadline loop calls
// Expire, and both end the transfers whose grants no longer hold with PERMISSION_DENIED naming
// the field. The owner of a region a transfer uses on a grant may also cancel that transfer
// (OwnerOf).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/access/access.h"
#include "daemon/regions/regions.h"
#include "daemon/transfers/record.h"
#include "daemon/transfers/resolve.h"

namespace kvrail::transfers {

// One side of a transfer used on a grant: the region, who used it, and what the grant had to
// allow (RegionTable::CheckAccess's arguments).
struct GrantUse {
  std::shared_ptr<regions::Region> region;
  uint64_t session = 0;  // the submitting session (0: another node's, inbound)
  std::string grant;
  v1::GrantAccess access = v1::GRANT_ACCESS_READ;
  uint32_t layer_begin = 0, layer_end = 0;
  std::string field;  // "spec.src", "spec.dst", "spec.ready_flags", "spec.arrival_flags"
};

// The uses of a resolved local or remote submit that rest on a grant (sides whose region the
// submitter does not own): source, destination (local only), ready and arrival flags.
std::vector<GrantUse> GrantUsesOf(const ResolvedRequest& request);

// Thread-safe (mu_). Calls into the region table (CheckAccess, GrantExpiresUs) and ends records
// (their engine's Remove, Record::RequestEnd) outside mu_.
class GrantUses {
 public:
  explicit GrantUses(const access::Grants* grants) : grants_(grants) {}

  // Registers `record`'s uses (none: nothing is kept), then checks them at once: a grant that
  // ended between the submit's check and now ends the record here.
  void Add(const std::shared_ptr<Record>& record, std::vector<GrantUse> uses);
  // Checks every registered transfer's grants; ends those that no longer hold.
  void Recheck();
  // Ends the transfers holding a grant that expired by `now_us` (the table's clock).
  void Expire(int64_t now_us);
  // Whether `session` owns a region transfer `id` uses on a grant (it may cancel the transfer).
  bool UsesRegionOf(uint64_t id, uint64_t session) const;
  size_t size() const;

 private:
  struct Entry {
    std::weak_ptr<Record> record;
    std::vector<GrantUse> uses;
    int64_t expires_us = 0;  // the earliest expiry among the uses' grants
  };
  // OK, or the first use whose grant no longer holds (PERMISSION_DENIED naming its field).
  absl::Status Check(const Entry& entry) const;
  static void EndRecord(const std::shared_ptr<Record>& record, const absl::Status& why);
  // Drops entries whose record ended or is gone (every kPruneEvery adds).
  void PruneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const access::Grants* const grants_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);  // by record id
  // (expiry, record id) of every entry, so Expire looks only at the expired (an id whose entry
  // is gone is skipped; PruneLocked rebuilds it).
  std::multimap<int64_t, uint64_t> by_expiry_ ABSL_GUARDED_BY(mu_);
  uint64_t adds_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvrail::transfers

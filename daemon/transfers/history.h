// Internal to the transfers module: the manager's index of transfers: by id, in submission
// order (bounded), by idempotency key (with reservations for submits in progress), and those
// with a deadline.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "daemon/transfers/record.h"

namespace kvrail::transfers {

// Thread-compatible: the manager guards it with its mutex. Calls Record::IsFinal (the record's
// lock is taken under the caller's).
class History {
 public:
  // Keeps at most `limit` ended transfers beyond the open ones.
  explicit History(uint32_t limit) : limit_(limit) {}

  // Adds an admitted record; `key` (may be empty) now names it, replacing a reservation. Then
  // forgets the oldest ended transfers beyond the limit.
  void Add(const std::shared_ptr<Record>& record, const std::string& key, uint64_t fingerprint = 0);
  std::shared_ptr<Record> Find(uint64_t id) const;
  // Newest first.
  std::vector<std::shared_ptr<Record>> Newest() const;
  std::vector<std::shared_ptr<Record>> Open() const;
  size_t size() const { return records_.size(); }

  // Idempotency keys (the manager scopes them to the submitting session). A key is free,
  // reserved (a submit with it is in progress) or names a transfer still in the history (ByKey),
  // with the fingerprint of the spec it was submitted with (*fingerprint, when not null).
  std::shared_ptr<Record> ByKey(const std::string& key, uint64_t* fingerprint = nullptr) const;
  bool Reserved(const std::string& key) const;
  void Reserve(const std::string& key);
  // Frees a reservation that was not followed by Add (the submit failed); no-op otherwise.
  void Unreserve(const std::string& key);

  // Transfers with a deadline at or before `now` that have not ended; ended ones leave the
  // deadline index.
  std::vector<std::shared_ptr<Record>> Late(absl::Time now);

 private:
  struct Entry {
    std::shared_ptr<Record> record;
    std::string key;           // its idempotency key (kept here: reading it must not copy a status)
    uint64_t fingerprint = 0;  // of the spec submitted under `key`
    std::list<uint64_t>::iterator order;
  };
  static constexpr uint64_t kReserved = 0;  // transfer ids are never 0
  void Trim();

  const uint32_t limit_;
  absl::flat_hash_map<uint64_t, Entry> records_;
  std::list<uint64_t> order_;  // oldest first
  absl::flat_hash_map<std::string, uint64_t> by_key_;
  std::list<std::weak_ptr<Record>> with_deadline_;
};

}  // namespace kvrail::transfers

#include "daemon/transfers/history.h"

namespace kvrail::transfers {

void History::Add(const std::shared_ptr<Record>& record, const std::string& key,
                  uint64_t fingerprint) {
  order_.push_back(record->id());
  records_[record->id()] = Entry{record, key, fingerprint, std::prev(order_.end())};
  if (!key.empty()) by_key_[key] = record->id();
  if (record->deadline().has_value()) with_deadline_.push_back(record);
  Trim();
}

void History::Trim() {
  // Open transfers are skipped, not a stop: one transfer left open (a layer-wise one whose
  // producer went away) must not keep every later one in the history.
  for (auto it = order_.begin(); records_.size() > limit_ && it != order_.end();) {
    auto entry = records_.find(*it);
    if (!entry->second.record->IsFinal()) {
      ++it;
      continue;
    }
    const std::string& key = entry->second.key;
    if (!key.empty()) {
      auto k = by_key_.find(key);
      if (k != by_key_.end() && k->second == entry->first) by_key_.erase(k);
    }
    records_.erase(entry);
    it = order_.erase(it);
  }
}

std::shared_ptr<Record> History::Find(uint64_t id) const {
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : it->second.record;
}

std::vector<std::shared_ptr<Record>> History::Newest() const {
  std::vector<std::shared_ptr<Record>> out;
  out.reserve(order_.size());
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) out.push_back(records_.at(*it).record);
  return out;
}

std::vector<std::shared_ptr<Record>> History::Open() const {
  std::vector<std::shared_ptr<Record>> out;
  for (const auto& [id, entry] : records_) {
    if (!entry.record->IsFinal()) out.push_back(entry.record);
  }
  return out;
}

std::shared_ptr<Record> History::ByKey(const std::string& key, uint64_t* fingerprint) const {
  if (key.empty()) return nullptr;
  auto it = by_key_.find(key);
  if (it == by_key_.end() || it->second == kReserved) return nullptr;
  auto entry = records_.find(it->second);
  if (entry == records_.end()) return nullptr;
  if (fingerprint != nullptr) *fingerprint = entry->second.fingerprint;
  return entry->second.record;
}

bool History::Reserved(const std::string& key) const {
  auto it = by_key_.find(key);
  return it != by_key_.end() && it->second == kReserved;
}

void History::Reserve(const std::string& key) { by_key_[key] = kReserved; }

void History::Unreserve(const std::string& key) {
  auto it = by_key_.find(key);
  if (it != by_key_.end() && it->second == kReserved) by_key_.erase(it);
}

std::vector<std::shared_ptr<Record>> History::Late(absl::Time now) {
  std::vector<std::shared_ptr<Record>> late;
  // Only transfers with a deadline that have not ended are looked at (not the whole history).
  for (auto it = with_deadline_.begin(); it != with_deadline_.end();) {
    std::shared_ptr<Record> record = it->lock();
    if (record == nullptr || record->IsFinal()) {
      it = with_deadline_.erase(it);
      continue;
    }
    if (*record->deadline() <= now) late.push_back(std::move(record));
    ++it;
  }
  return late;
}

}  // namespace kvrail::transfers

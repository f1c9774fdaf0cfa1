// Internal to the fabric module: the receiver's scatters in flight on one unpack
// thread. Each entry is an arrival whose GPU scatter kernel was launched (or a repeat of a tile
// whose first copy is still in flight); an entry is retired - its slot's credit goes back - when
// ITS work has ended, in any order, instead of after a wait for the device. Pure: the completion
// test is passed in (the receiver asks the entry's CUDA event; CI passes fakes).
// Thread contract: one thread (the unpack thread owning it).
#pragma once

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace kvrail::fabric {

template <typename T>
class ScatterWindow {
 public:
  // How long the unpack thread may wait for a new arrival before it polls the window again:
  // unbounded with nothing in flight, else `poll` (a credit waits at most about that long after
  // its kernel ended).
  static absl::Duration WaitFor(bool empty, absl::Duration poll = absl::Microseconds(20)) {
    return empty ? absl::InfiniteDuration() : poll;
  }

  void Add(T entry) { entries_.push_back(std::move(entry)); }
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }

  // Asks `done(entry)` (-> std::optional<R>) for every entry, oldest first; each that answers is
  // removed and handed to `retire(entry, answer)` at once (so an entry answered later in the same
  // pass sees what an earlier one's retirement did: a repeat sees its first copy land). Returns
  // how many were retired.
  template <typename Done, typename Retire>
  size_t Poll(Done done, Retire retire) {
    size_t kept = 0, retired = 0;
    for (size_t i = 0; i < entries_.size(); ++i) {
      auto answer = done(entries_[i]);
      if (answer.has_value()) {
        retire(entries_[i], *answer);
        ++retired;
      } else {
        if (kept != i) entries_[kept] = std::move(entries_[i]);
        ++kept;
      }
    }
    entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(kept), entries_.end());
    return retired;
  }

 private:
  std::vector<T> entries_;
};

}  // namespace kvrail::fabric

// A job's queued tile ids held as ranges [first, first + count): a transfer's tiles are queued in
// id order, so a whole transfer of up to 2^20 tiles costs one range, not one entry per tile (issue
// 17: each queued tile was a deque entry, so one large request held megabytes in every queue that
// carried it). The interface is the part of std::deque<uint32_t> the engines' takers use (front,
// pop_front, push_back, size, empty, iteration), so a taker reads ids one at a time as before.
//
// Thread contract: none of its own; it lives inside a TileQueues, guarded by its owner's lock.
#ifndef KVRAIL_DAEMON_SCHEDULER_TILE_RANGES_H_
#define KVRAIL_DAEMON_SCHEDULER_TILE_RANGES_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>

namespace kvrail::scheduler {

class TileRanges {
 public:
  struct Range {
    uint32_t first;
    uint32_t count;
  };

  TileRanges() = default;
  template <typename It>
  TileRanges(It begin, It end) {
    for (; begin != end; ++begin) push_back(*begin);
  }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  // How many ranges hold the ids (the memory this queue entry costs).
  size_t num_ranges() const { return ranges_.size(); }

  // The next id to take; the queue must not be empty.
  uint32_t front() const { return ranges_.front().first; }
  void pop_front() {
    Range& r = ranges_.front();
    ++r.first;
    --size_;
    if (--r.count == 0) ranges_.pop_front();
  }
  // Appends `id`; an id that continues the last range extends it.
  void push_back(uint32_t id) {
    if (!ranges_.empty()) {
      Range& last = ranges_.back();
      if (last.count < UINT32_MAX && static_cast<uint64_t>(last.first) + last.count == id) {
        ++last.count;
        ++size_;
        return;
      }
    }
    ranges_.push_back(Range{id, 1});
    ++size_;
  }
  template <typename It>
  void insert_back(It begin, It end) {
    for (; begin != end; ++begin) push_back(*begin);
  }

  // Forward iteration over the ids in queue order.
  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = uint32_t;
    using difference_type = std::ptrdiff_t;
    using pointer = const uint32_t*;
    using reference = uint32_t;

    const_iterator(std::deque<Range>::const_iterator range, uint32_t offset)
        : range_(range), offset_(offset) {}
    uint32_t operator*() const { return range_->first + offset_; }
    const_iterator& operator++() {
      if (++offset_ == range_->count) {
        ++range_;
        offset_ = 0;
      }
      return *this;
    }
    bool operator==(const const_iterator& o) const {
      return range_ == o.range_ && offset_ == o.offset_;
    }
    bool operator!=(const const_iterator& o) const { return !(*this == o); }

   private:
    std::deque<Range>::const_iterator range_;
    uint32_t offset_;
  };
  const_iterator begin() const { return const_iterator(ranges_.begin(), 0); }
  const_iterator end() const { return const_iterator(ranges_.end(), 0); }

 private:
  std::deque<Range> ranges_;
  size_t size_ = 0;
};

}  // namespace kvrail::scheduler

#endif  // KVRAIL_DAEMON_SCHEDULER_TILE_RANGES_H_

// Internal to the fabric module: lane failover's pure part. The sender keeps one
// LaneHealth per peer: for each lane (NIC i -> the peer's NIC i) whether tiles may go out on it,
// which of its send slots wait for the peer's credit, and when it last made progress. A lane
// fails on a write error (at once) or on silence: tiles in flight and no credit on it for
// `timeout` while another lane to the peer returned one meanwhile (a cut link over tcp is
// silence, not an error); lanes all silent together are the peer's matter (slow or gone:
// liveness) unless that lasts `peer_timeout`. A failed lane hands back the slots it was waiting
// on (their tiles are re-sent elsewhere), rests `cooldown`, then lets one tile through as a
// probe: its credit brings the lane back up, its failure starts another cool-down. No lane left
// (every lane failed and resting) is the transfer's failure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace kvrail::fabric {

enum class LaneState { kUp, kFailed, kProbing };
const char* LaneStateName(LaneState state);

// Thread contract: none (the sender guards each instance with its lock). Pure: the time is passed
// in, so tests drive it with a manual clock.
class LaneHealth {
 public:
  LaneHealth(uint32_t lanes, uint32_t slots, absl::Duration timeout, absl::Duration cooldown,
             absl::Duration peer_timeout);

  uint32_t lanes() const { return static_cast<uint32_t>(lanes_.size()); }
  LaneState state(uint32_t lane) const { return lanes_[lane].state; }
  // Why the lane last failed ("" while it never did).
  const std::string& why(uint32_t lane) const { return lanes_[lane].why; }

  // Whether a tile may be written on `lane` at `now`: up; or failed and rested (it turns probing)
  // with no probe out yet.
  bool MayUse(uint32_t lane, absl::Time now);
  // A tile went out on (lane, slot) at `now`; on a probing lane it is the probe.
  void OnSent(uint32_t lane, uint32_t slot, absl::Time now);
  // The peer's credit for (lane, slot) came at `now`: progress; a probe's credit brings its lane
  // up. A credit for a slot no longer waited on (handed back by Fail) is progress too.
  void OnCredit(uint32_t lane, uint32_t slot, absl::Time now);
  // The slot's write never reached the wire (freed locally): no longer waited on.
  void OnReleased(uint32_t lane, uint32_t slot);
  // Fails `lane` at `now` with `why` (a no-op on a lane already failed): the slots it was waiting
  // on, in slot order, whose tiles the caller re-sends on other lanes.
  std::vector<uint32_t> Fail(uint32_t lane, absl::Time now, const std::string& why);
  // The lanes to fail at `now` for silence (see above), each with its reason.
  std::vector<std::pair<uint32_t, std::string>> Silent(absl::Time now) const;
  // Whether some lane is left: up, probing, or failed and rested.
  bool AnyLeft(absl::Time now) const;
  // "nic lane 2: no credit for 200 ms while other lanes returned them; lane 3: write error ..."
  std::string Describe() const;

  uint64_t failovers() const { return failovers_; }
  uint32_t waiting(uint32_t lane) const { return lanes_[lane].waiting_count; }

 private:
  struct Lane {
    LaneState state = LaneState::kUp;
    std::vector<bool> waiting;  // per slot: a tile out, its credit not back
    uint32_t waiting_count = 0;
    // The last credit, or the first tile out after the lane was idle: silence counts from here.
    absl::Time progress = absl::InfinitePast();
    absl::Time last_credit = absl::InfinitePast();
    absl::Time failed_at = absl::InfinitePast();
    bool probe_out = false;
    std::string why;
  };
  const absl::Duration timeout_, cooldown_, peer_timeout_;
  std::vector<Lane> lanes_;
  uint64_t failovers_ = 0;
};

}  // namespace kvrail::fabric

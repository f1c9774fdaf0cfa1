#include "daemon/fabric/lane_health.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvrail::fabric {

const char* LaneStateName(LaneState state) {
  switch (state) {
    case LaneState::kUp:
      return "up";
    case LaneState::kFailed:
      return "failed";
    case LaneState::kProbing:
      return "probing";
  }
  return "?";
}

LaneHealth::LaneHealth(uint32_t lanes, uint32_t slots, absl::Duration timeout,
                       absl::Duration cooldown, absl::Duration peer_timeout)
    : timeout_(timeout), cooldown_(cooldown), peer_timeout_(peer_timeout), lanes_(lanes) {
  for (Lane& l : lanes_) l.waiting.assign(slots, false);
}

bool LaneHealth::MayUse(uint32_t lane, absl::Time now) {
  Lane& l = lanes_[lane];
  switch (l.state) {
    case LaneState::kUp:
      return true;
    case LaneState::kFailed:
      if (now - l.failed_at < cooldown_) return false;
      l.state = LaneState::kProbing;
      l.probe_out = false;
      return true;
    case LaneState::kProbing:
      return !l.probe_out;
  }
  return false;
}

void LaneHealth::OnSent(uint32_t lane, uint32_t slot, absl::Time now) {
  Lane& l = lanes_[lane];
  if (slot >= l.waiting.size() || l.waiting[slot]) return;
  if (l.waiting_count == 0) l.progress = now;  // silence counts from the first tile out
  l.waiting[slot] = true;
  ++l.waiting_count;
  if (l.state == LaneState::kProbing) l.probe_out = true;
}

void LaneHealth::OnCredit(uint32_t lane, uint32_t slot, absl::Time now) {
  Lane& l = lanes_[lane];
  l.progress = now;
  l.last_credit = now;
  if (slot < l.waiting.size() && l.waiting[slot]) {
    l.waiting[slot] = false;
    --l.waiting_count;
  }
  if (l.state == LaneState::kProbing && l.probe_out) {
    l.state = LaneState::kUp;
    l.probe_out = false;
  }
}

void LaneHealth::OnReleased(uint32_t lane, uint32_t slot) {
  Lane& l = lanes_[lane];
  if (slot < l.waiting.size() && l.waiting[slot]) {
    l.waiting[slot] = false;
    --l.waiting_count;
  }
}

std::vector<uint32_t> LaneHealth::Fail(uint32_t lane, absl::Time now, const std::string& why) {
  Lane& l = lanes_[lane];
  std::vector<uint32_t> slots;
  if (l.state == LaneState::kFailed) return slots;
  if (l.state == LaneState::kUp) ++failovers_;  // a probe failing again is not a new failover
  l.state = LaneState::kFailed;
  l.failed_at = now;
  l.probe_out = false;
  l.why = why;
  for (uint32_t s = 0; s < l.waiting.size(); ++s) {
    if (l.waiting[s]) slots.push_back(s);
    l.waiting[s] = false;
  }
  l.waiting_count = 0;
  return slots;
}

std::vector<std::pair<uint32_t, std::string>> LaneHealth::Silent(absl::Time now) const {
  // Evidence that the peer itself still consumes: another lane's credit since this lane's
  // silence began (another lane's credit from before it says nothing about now).
  std::vector<std::pair<uint32_t, std::string>> silent;
  for (uint32_t i = 0; i < lanes_.size(); ++i) {
    const Lane& l = lanes_[i];
    if (l.state == LaneState::kFailed || l.waiting_count == 0) continue;
    const absl::Duration quiet = now - l.progress;
    if (quiet < timeout_) continue;
    bool others_alive = false;
    for (uint32_t j = 0; j < lanes_.size(); ++j) {
      if (j != i && lanes_[j].state != LaneState::kFailed && lanes_[j].last_credit > l.progress) {
        others_alive = true;
      }
    }
    const std::string ms = absl::StrCat(absl::ToInt64Milliseconds(quiet), " ms");
    if (l.state == LaneState::kProbing) {
      silent.emplace_back(i, absl::StrCat("probe tile not credited in ", ms));
    } else if (others_alive) {
      silent.emplace_back(i, absl::StrCat("no credit for ", ms, " with ", l.waiting_count,
                                          " tiles out while other lanes returned them"));
    } else if (quiet >= peer_timeout_) {
      silent.emplace_back(i, absl::StrCat("no credit for ", ms, " with ", l.waiting_count,
                                          " tiles out (no lane to the peer returns any)"));
    }
  }
  return silent;
}

bool LaneHealth::AnyLeft(absl::Time now) const {
  for (const Lane& l : lanes_) {
    if (l.state != LaneState::kFailed || now - l.failed_at >= cooldown_) return true;
  }
  return false;
}

std::string LaneHealth::Describe() const {
  std::vector<std::string> parts;
  for (uint32_t i = 0; i < lanes_.size(); ++i) {
    if (lanes_[i].state == LaneState::kUp) continue;
    parts.push_back(absl::StrCat("lane ", i, " ", LaneStateName(lanes_[i].state),
                                 lanes_[i].why.empty() ? "" : ": ", lanes_[i].why));
  }
  return parts.empty() ? "all lanes up" : absl::StrJoin(parts, "; ");
}

}  // namespace kvrail::fabric

// The sender's slot bookkeeping on the lanes' proxy threads and its watchdog: credits complete
// tiles and free slots, write errors and silent lanes fail a lane toward a peer (lane failover:
// its tiles go out again on the others), and the lanes' health as gauges.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/fabric/lane_health.h"
#include "daemon/fabric/relay.h"
#include "daemon/fabric/sender_impl.h"
#include "spdlog/spdlog.h"

namespace kvrail::fabric {

// ---- credits and failures (proxy threads) ----

void SenderImpl::OnCredit(uint32_t lane, uint32_t peer_index, uint32_t slot, uint32_t tile,
                          bool applied) {
  if (peer_index >= peers_->size() || slot >= options_.slots) return;
  PeerConn* peer = peers_->at(peer_index);
  // A retired index (its peer left; its transfers failed): nothing is owed.
  if (peer->retired.load(std::memory_order_acquire)) return;
  SlotOwner owner;
  {
    absl::MutexLock lock(&peer->mu);
    if (lane >= peer->owners.size()) return;
    // The credit word lies in this peer's registration (only it holds the key): a completion
    // naming this peer while the word does not show the slot returned did not come from it (the
    // immediate data is forgeable by any peer); and the word, not the imm bit, says "applied".
    if (!peer->credits[lane]->Returned(slot)) {
      spdlog::warn(
          "fabric: credit naming '{}' slot {} lane {} ignored: its credit word shows no "
          "return",
          peer->node_id, slot, lane);
      return;
    }
    applied = !peer->credits[lane]->NotApplied(slot);
    owner = std::move(peer->owners[lane][slot]);
    peer->owners[lane][slot] = SlotOwner{};
    if (owner.outbound) Unowned(lane);
    absl::MutexLock health_lock(&health_mu_);
    HealthOf(peer).OnCredit(lane, slot, absl::Now());
  }
  slots_cv_.SignalAll();
  if (!owner.outbound || owner.tile != tile) return;  // orphaned by a failure: slot freed only
  const bool digest = owner.outbound->job->wants_digest();
  if (applied && digest) {
    // The receiver applies a digest tile only when its read-back digest equals the one sent.
    uint64_t sent = 0;
    {
      absl::MutexLock lock(&owner.outbound->mu);
      if (tile < owner.outbound->digests.size()) sent = owner.outbound->digests[tile];
    }
    owner.outbound->job->OnTileDigest(tile, sent, sent);
  }
  FinishTile(owner.outbound, tile,
             applied ? absl::OkStatus()
                     : absl::UnavailableError(absl::StrCat(
                           "peer '", peer->node_id, "' dropped tile ", tile,
                           digest ? " (the transfer ended there, or the tile's read-back digest "
                                    "did not match: DATA_LOSS in the peer's transfer)"
                                  : " (the transfer ended there)")));
}

SlotOwner SenderImpl::ReleaseUnsentSlot(PeerConn* peer, uint32_t lane, uint32_t slot) {
  SlotOwner owner;
  {
    absl::MutexLock lock(&peer->mu);
    owner = std::move(peer->owners[lane][slot]);
    peer->owners[lane][slot] = SlotOwner{};
    if (owner.outbound) Unowned(lane);
    peer->credits[lane]->ReturnLocally(slot);  // never reached the peer: no credit will come
    absl::MutexLock health_lock(&health_mu_);
    HealthOf(peer).OnReleased(lane, slot);
  }
  slots_cv_.SignalAll();
  return owner;
}

void SenderImpl::OnWriteFailed(uint32_t peer_index, uint32_t lane, uint32_t slot,
                               const absl::Status& error) {
  if (peer_index >= peers_->size() || slot >= options_.slots) return;
  PeerConn* peer = peers_->at(peer_index);
  // Lane failover: a write error fails the lane for this peer at once; the failed write's tile
  // and every other tile waiting on the lane go out again on the remaining lanes.
  const std::string why = absl::StrCat("write error: ", error.message());
  const absl::Time now = absl::Now();
  std::vector<SlotOwner> tiles;
  bool any_left = false;
  std::string state;
  {
    absl::MutexLock lock(&peer->mu);
    if (lane >= peer->owners.size()) return;
    SlotOwner owner = std::move(peer->owners[lane][slot]);
    peer->owners[lane][slot] = SlotOwner{};
    if (owner.outbound) Unowned(lane);
    peer->credits[lane]->ReturnLocally(slot);  // never reached the peer: no credit will come
    {
      absl::MutexLock health_lock(&health_mu_);
      HealthOf(peer).OnReleased(lane, slot);
    }
    tiles = FailLaneLocked(peer, lane, now, why, &any_left, &state);
    if (owner.outbound) tiles.insert(tiles.begin(), std::move(owner));
  }
  slots_cv_.SignalAll();
  Resend(peer, lane, std::move(tiles), now, why, any_left, state);
}

// ---- lane failover ----

LaneHealth& SenderImpl::HealthOf(const PeerConn* peer) {
  std::unique_ptr<LaneHealth>& h = health_[peer];
  if (h == nullptr) {
    h = std::make_unique<LaneHealth>(lanes_->size(), options_.slots, options_.lane_timeout,
                                     options_.lane_cooldown, options_.liveness_timeout);
  }
  return *h;
}

std::vector<SlotOwner> SenderImpl::FailLaneLocked(PeerConn* peer, uint32_t lane, absl::Time now,
                                                  const std::string& why, bool* any_left,
                                                  std::string* state) {
  std::vector<uint32_t> slots;
  {
    absl::MutexLock health_lock(&health_mu_);
    LaneHealth& health = HealthOf(peer);
    slots = health.Fail(lane, now, why);
    *any_left = health.AnyLeft(now);
    *state = health.Describe();
  }
  std::vector<SlotOwner> tiles;
  for (uint32_t s : slots) {
    SlotOwner& o = peer->owners[lane][s];
    if (o.outbound) {
      Unowned(lane);
      tiles.push_back(std::move(o));
    }
    o = SlotOwner{};  // the slot stays used: a late credit (or a write error) frees it
  }
  return tiles;
}

void SenderImpl::Resend(PeerConn* peer, uint32_t lane, std::vector<SlotOwner> tiles,
                        absl::Time detected, const std::string& why, bool any_left,
                        const std::string& state) {
  const std::string lane_name = lanes_->at(lane).nic->name();
  if (!any_left) {
    spdlog::warn("fabric: lane {} to '{}' failed ({}); no lane to it is left: {}", lane_name,
                 peer->node_id, why, state);
    // The tiles taken from the lane are still counted in flight: finish them with the peer's
    // failure (FailPeer fails the transfers, the queued tiles and the other lanes' tiles).
    const absl::Status failed = absl::UnavailableError(
        absl::StrCat("peer '", peer->node_id, "': no fabric lane left (", state, ")"));
    FailPeer(peer, failed);
    for (SlotOwner& o : tiles) FinishTile(o.outbound, o.tile, failed);
    return;
  }
  std::vector<PackItem> items;
  std::vector<SlotOwner> ended;
  absl::flat_hash_map<Outbound*, uint32_t> per_transfer;
  for (SlotOwner& o : tiles) {
    Outbound& out = *o.outbound;
    absl::MutexLock lock(&out.mu);
    if (out.failed.has_value() || out.closed) {
      ended.push_back(std::move(o));
      continue;
    }
    if (out.inflight > 0) --out.inflight;  // queued again: counted in flight when re-taken
    if (per_transfer[&out]++ == 0) {
      ++out.failovers;
      out.failover_detected = detected;
      out.failover_what = absl::StrCat(lane_name, " to '", peer->node_id, "' failed (", why, ")");
    }
    items.push_back(PackItem{o.outbound, o.tile, true, detected});
  }
  spdlog::warn(
      "fabric: lane {} to '{}' failed ({}): {} tiles of {} transfers re-sent on the "
      "other lanes ({})",
      lane_name, peer->node_id, why, items.size(), per_transfer.size(), state);
  {
    absl::MutexLock lock(&health_mu_);
    tiles_resent_ += items.size();
  }
  {
    absl::MutexLock lock(&mu_);
    // At the front of their classes, in their order: they were the oldest tiles out.
    for (auto it = items.rbegin(); it != items.rend(); ++it) {
      queues_[static_cast<int>(it->out->job->priority())].push_front(std::move(*it));
    }
  }
  for (SlotOwner& o : ended) {
    absl::Status status;
    {
      absl::MutexLock lock(&o.outbound->mu);
      status = o.outbound->failed.value_or(absl::CancelledError("ended by the sender"));
    }
    FinishTile(o.outbound, o.tile, status);
  }
}

void SenderImpl::WatchLoop() {
  const absl::Duration tick =
      std::clamp(options_.lane_timeout / 20, absl::Milliseconds(1), absl::Milliseconds(20));
  while (!stop_.load()) {
    absl::SleepFor(tick);
    for (uint32_t p = 0; p < peers_->size(); ++p) {
      PeerConn* peer = peers_->at(p);
      const absl::Time now = absl::Now();
      std::vector<std::pair<uint32_t, std::string>> silent;
      {
        absl::MutexLock lock(&peer->mu);
        absl::MutexLock health_lock(&health_mu_);
        auto it = health_.find(peer);
        if (it == health_.end()) continue;
        silent = it->second->Silent(now);
      }
      for (const auto& [lane, why] : silent) {
        std::vector<SlotOwner> tiles;
        bool any_left = false;
        std::string state;
        {
          absl::MutexLock lock(&peer->mu);
          tiles = FailLaneLocked(peer, lane, now, why, &any_left, &state);
        }
        slots_cv_.SignalAll();
        Resend(peer, lane, std::move(tiles), now, why, any_left, state);
      }
    }
  }
}

std::map<std::string, double> SenderImpl::Gauges() const {
  absl::MutexLock lock(&health_mu_);
  double up = 0, failed = 0, probing = 0, failovers = 0;
  for (const auto& [peer, h] : health_) {
    failovers += static_cast<double>(h->failovers());
    for (uint32_t l = 0; l < h->lanes(); ++l) {
      switch (h->state(l)) {
        case LaneState::kUp:
          ++up;
          break;
        case LaneState::kFailed:
          ++failed;
          break;
        case LaneState::kProbing:
          ++probing;
          break;
      }
    }
  }
  return {
      {"fabric_lane_failovers_total", failovers},
      {"fabric_lanes_up", up},
      {"fabric_lanes_failed", failed},
      {"fabric_lanes_probing", probing},
      {"fabric_tiles_resent_total", static_cast<double>(tiles_resent_)},
      {"fabric_failover_first_resend_ms", last_resend_ms_},
      // Tiles through a relay slot in this process (this daemon), each side.
      {"fabric_relay_tiles_sent_total", static_cast<double>(ProcessRelayedTiles(RelaySide::kSend))},
      {"fabric_relay_tiles_received_total",
       static_cast<double>(ProcessRelayedTiles(RelaySide::kReceive))}};
}
}  // namespace kvrail::fabric

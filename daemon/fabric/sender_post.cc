// The sender's packers: a free slot on some lane of the transfer's peer, the tile packed into it
// (host pack, digest, relay hop or the fabric kernel), its command posted to the lane's ring.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "daemon/fabric/command_ring.h"
#include "daemon/fabric/lane_route.h"
#include "daemon/fabric/sender_impl.h"
#include "daemon/fabric/tile_copy.h"
#include "daemon/fabric/tile_pack.h"
#include "spdlog/spdlog.h"

namespace kvrail::fabric {

// ---- packing ----

bool SenderImpl::HasPackWork() const {
  if (stopping_) return true;
  for (const auto& q : queues_) {
    if (!q.empty()) return true;
  }
  return false;
}

std::optional<std::pair<uint32_t, uint32_t>> SenderImpl::TakeSlot(const PackItem& item,
                                                                  uint32_t rr) {
  const std::shared_ptr<Outbound>& out = item.out;
  PeerConn* peer = out->peer;
  while (true) {
    {
      absl::MutexLock lock(&out->mu);
      // Ended (aborted, cancelled, past its deadline) while this tile waited for a slot: the
      // tile fails and the packer moves on (waiting on held up every transfer behind it).
      if (out->removed && !out->failed.has_value()) {
        out->failed = absl::CancelledError("the transfer ended while its tile waited for a slot");
      }
      if (out->failed.has_value()) return std::nullopt;
    }
    absl::MutexLock lock(&peer->mu);
    const uint32_t lanes = peer->lanes;
    const absl::Time now = absl::Now();
    {
      // Released before the wait below (which gives up only the peer's mu).
      absl::MutexLock health_lock(&health_mu_);
      LaneHealth& health = HealthOf(peer);
      if (!health.AnyLeft(now)) {
        // Every lane to the peer failed and rests: the transfer fails (lane failover's end).
        const absl::Status why = absl::UnavailableError(absl::StrCat(
            "peer '", peer->node_id, "': no fabric lane left (", health.Describe(), ")"));
        absl::MutexLock out_lock(&out->mu);
        if (!out->failed.has_value()) out->failed = why;
        return std::nullopt;
      }
      // The transfer's lanes (rail-aware), least loaded first: the tiles this
      // daemon has out on each lane to every peer, ties round robin from `rr`
      // (LaneTryOrderByLoad); when none of them is usable (failed and resting, or its probe is
      // out), the peer's other lanes (lane failover).
      const LaneRoute& route = out->route;
      std::vector<bool> usable(lanes, false);
      bool chosen_usable = false;
      for (uint32_t l = 0; l < lanes; ++l) {
        const bool chosen =
            route.all || std::find(route.lanes.begin(), route.lanes.end(), l) != route.lanes.end();
        if (chosen && health.MayUse(l, now)) usable[l] = chosen_usable = true;
      }
      for (uint32_t l = 0; l < lanes && !chosen_usable; ++l) {
        if (health.MayUse(l, now)) usable[l] = true;
      }
      for (uint32_t l : LaneTryOrderByLoad(route, usable, LaneLoad(), rr)) {
        if (l >= lanes) continue;
        auto& owners = peer->owners[l];
        const int slot =
            peer->credits[l]->Acquire([&](uint32_t s) { return owners[s].outbound == nullptr; });
        if (slot >= 0) {
          owners[slot] = SlotOwner{out, item.tile};
          lane_out_[l].fetch_add(1, std::memory_order_relaxed);
          health.OnSent(l, static_cast<uint32_t>(slot), now);
          return std::make_pair(l, static_cast<uint32_t>(slot));
        }
      }
    }
    // All slots in flight: wait for a credit (OnCredit signals slots_cv_).
    slots_cv_.WaitWithTimeout(&peer->mu, absl::Milliseconds(20));
    if (stop_.load()) return std::nullopt;
  }
}

void SenderImpl::PackLoop() {
  uint32_t rr = 0;
  while (true) {
    PackItem item;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SenderImpl::HasPackWork));
      if (stopping_) return;
      for (auto& queue : queues_) {
        if (queue.empty()) continue;
        item = std::move(queue.front());
        queue.pop_front();
        break;
      }
    }
    std::shared_ptr<Outbound>& out = item.out;
    PeerConn* peer = out->peer;
    // A slot on some lane of the peer: round robin over lanes (striping), waiting for credits.
    const std::optional<std::pair<uint32_t, uint32_t>> taken = TakeSlot(item, rr);
    ++rr;
    if (!taken.has_value()) {
      std::optional<absl::Status> why;
      {
        absl::MutexLock lock(&out->mu);
        why = out->failed;
      }
      if (!why.has_value()) return;  // stopping
      out->job->OnTileDone(item.tile, *why);
      continue;
    }
    const auto [lane, slot] = *taken;
    {
      absl::MutexLock lock(&out->mu);
      ++out->inflight;
    }
    out->job->OnTileStart(item.tile);
    const uint64_t bytes = TileBytes(out->job->plan(), item.tile);
    const job::Placement src = out->job->src();
    const RegionSide src_side{src.cuda, src.device, src.base};
    uint8_t* const staging = lanes_->SendSlot(lane, peer->index, slot);
    absl::Status packed;
    bool published = false;  // the command is in the ring already (written by the GPU)
    uint64_t wire_bytes = bytes;
    if (out->job->wants_digest()) {  // spec.digest: hashed while packing, sent after the bytes
      const absl::StatusOr<uint64_t> digest =
          PackTileWithDigest(out->job->plan(), item.tile, src_side, staging);
      packed = digest.status();
      if (digest.ok()) {
        wire_bytes += kDigestTrailerBytes;
        absl::MutexLock lock(&out->mu);
        if (out->digests.size() <= item.tile) out->digests.resize(out->job->plan().num_tiles());
        out->digests[item.tile] = *digest;
      }
    } else if (out->relay != nullptr) {
      // Through a relay slot (GPU R's memory, or the host twin) into the send slot.
      packed = out->relay->Pack(item.tile, staging);
    } else if (out->gpu != nullptr) {
      // The GPU gathers the tile into the slot and publishes its command in the ring.
      // Enqueued on the transfer's stream, not waited for: this thread goes on to the next
      // free slot, so a kernel per free slot is in flight; the proxy polls while the ring holds
      // reserved numbers. The slot is the tile's until its credit, which needs the command.
      kernels::NicCommand engine{};
      engine.peer = static_cast<uint16_t>(peer->index);
      engine.remote_handle = static_cast<uint16_t>(out->handle);
      engine.transfer_tag = out->id;
      packed =
          out->gpu->PackAndPublish(item.tile, slot, staging, lanes_->at(lane).ring.get(), engine);
      published = packed.ok();
    } else {
      packed = PackTile(out->job->plan(), item.tile, src_side, staging);
    }
    if (!packed.ok()) {
      // The slot never reached the wire: give it back here, and fail the tile.
      (void)ReleaseUnsentSlot(peer, lane, slot);
      FinishTile(out, item.tile, packed);  // fails the transfer; aborts it on the peer
      continue;
    }
    kernels::NicCommand cmd{};
    cmd.opcode = kOpWriteTile;
    cmd.tile = item.tile;
    cmd.slot = slot;
    cmd.peer = static_cast<uint16_t>(peer->index);
    cmd.remote_handle = static_cast<uint16_t>(out->handle);
    cmd.transfer_tag = out->id;
    cmd.bytes = static_cast<uint32_t>(wire_bytes);
    if (published) {
      // Wakes a proxy asleep in fi_cq_sread; it then polls until the kernel's command appears.
      lanes_->at(lane).nic->Signal();
    } else {
      lanes_->PostCommand(lane, cmd);
    }
    if (item.resend) {
      // Lane failover: the first re-sent tile of a failover is on its new lane's ring.
      const absl::Time posted = absl::Now();
      std::string note;
      std::optional<double> resend_ms;
      {
        absl::MutexLock lock(&out->mu);
        ++out->resent;
        if (out->failover_detected.has_value() && *out->failover_detected == item.detected) {
          const double ms = absl::ToDoubleMilliseconds(posted - item.detected);
          note = absl::StrCat("lane failover: ", out->failover_what, "; first re-sent tile on ",
                              lanes_->at(lane).nic->name(), " ", absl::StrFormat("%.3f", ms),
                              " ms after detection");
          out->failover_detected.reset();
          spdlog::warn("fabric: transfer {} to '{}': {}", out->id, peer->node_id, note);
          resend_ms = ms;
        }
      }
      if (resend_ms.has_value()) {
        absl::MutexLock health_lock(&health_mu_);  // never inside an Outbound's mu (TakeSlot)
        last_resend_ms_ = *resend_ms;
      }
      if (!note.empty()) out->job->OnEngineNote(note);
    }
  }
}
}  // namespace kvrail::fabric

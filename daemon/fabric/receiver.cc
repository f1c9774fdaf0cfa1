#include "daemon/fabric/receiver.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/logging.h"
#include "base/status.h"
#include "daemon/engine/engine.h"
#include "daemon/fabric/inbound_admit.h"
#include "daemon/fabric/lane_route.h"
#include "daemon/fabric/peer_auth.h"
#include "daemon/fabric/relay.h"
#include "daemon/fabric/scatter_window.h"
#include "daemon/fabric/tile_copy.h"
#include "daemon/fabric/tile_pack.h"
#include "daemon/planner/planner.h"
#include "kernels/plan_math.h"
#include "spdlog/spdlog.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

namespace {

// One transfer this daemon receives. Thread contract: the fields above `mu` are fixed before it
// is published in the handle table; `mu` guards the tile accounting and `ended`.
struct Inbound {
  uint32_t handle = 0;
  uint32_t peer = 0;
  uint64_t sender_transfer_id = 0;
  std::string sender_node;
  std::shared_ptr<regions::Region> dst;
  planner::Plan plan;
  // This node's record of the transfer (InboundSink); tiles report to it until `ended`.
  uint64_t local_id = 0;
  std::shared_ptr<engine::Job> job;
  absl::Mutex mu;
  std::vector<bool> applied ABSL_GUARDED_BY(mu);
  // spec.digest: tiles arrive with the sender's digest after them (tile_copy.h), checked against
  // the destination read back after the scatter.
  bool digest = false;
  uint32_t applied_count ABSL_GUARDED_BY(mu) = 0;
  // Per tile: scattered (and checked). A repeat waits for it (lane failover, sender.cc).
  std::vector<bool> landed ABSL_GUARDED_BY(mu);
  uint32_t repeats ABSL_GUARDED_BY(mu) = 0;  // tiles that arrived again after landing
  bool Settled(uint32_t tile) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return landed[tile] || !applied[tile];
  }
  bool ended ABSL_GUARDED_BY(mu) = false;
  // The fabric kernel for a GPU destination (scatters from the mapped receive slot);
  // null: the copy engines / host unpack. Set by Begin, before publication; after `plan`.
  std::unique_ptr<GpuTileKernels> gpu;
  // The hierarchical path's relay hop (relay.h): the receive slot through a relay
  // slot (GPU R's memory, or the host twin) into the destination; null: the direct path.
  std::unique_ptr<RelayTransfer> relay;
  explicit Inbound(planner::Plan p) : plan(std::move(p)) {}
};

// A transfer that ended here (End, or its peer dropped) while its peer may still have tiles of it
// in flight: enough to find where such a tile's seal lies, so a tile its peer really wrote is
// credited back to that peer "not applied" (its slot is freed) and anything else is refused.
struct Retired {
  uint32_t peer = 0;
  uint64_t seq = 0;  // retirement order (the table keeps the newest kMaxRetired)
  kernels::PlanHeader header{};
  uint32_t num_tiles = 0;
  bool digest = false;
};
// Retired handles kept (their handles are not reused meanwhile): 60,000 inbound + these < 2^16.
constexpr size_t kMaxRetired = 4096;
// Inbound transfers open at once (with kMaxRetired, fewer than the 16-bit handles).
constexpr size_t kMaxInbound = 60000;

// Whether the `n`th refused arrival is logged: a flood of forged arrivals must not flood the log.
bool LogRefusal(uint64_t n) { return n <= 16 || (n & (n - 1)) == 0; }

// Thread contract: see Receiver. mu_ guards the handle table and the arrival queue; each
// Inbound has its own lock; sink_mu_ is held (shared) while the sink is called.
class ReceiverImpl final : public Receiver {
 public:
  ReceiverImpl(const FabricOptions& options, Lanes* lanes, PeerTable* peers, const Leases* leases,
               regions::RegionTable* regions, const access::Grants* grants)
      : options_(options),
        lanes_(lanes),
        peers_(peers),
        leases_(leases),
        regions_(regions),
        grants_(grants),
        relay_(RelayStage::Create(RelaySide::kReceive, options,
                                  ParseRelayConfig(options.relay.c_str()))) {}
  ~ReceiverImpl() override { Stop(); }
  void Start();

  absl::Status Begin(const peer_v1::BeginRemoteTransferRequest& request,
                     peer_v1::BeginRemoteTransferResponse* response) override;
  absl::StatusOr<uint32_t> End(const std::string& sender, uint32_t handle, bool abort,
                               const std::string& why) override;
  void DropPeer(PeerConn* peer, const absl::Status& why) override;
  bool HasTransfers(const PeerConn* peer) const override {
    absl::MutexLock lock(&mu_);
    for (const auto& [handle, in] : inbound_) {
      if (in->peer == peer->index) return true;
    }
    return false;
  }
  void SetInboundSink(transfers::InboundSink* sink) override;
  void Stop() override;
  void OnArrival(const Arrival& arrival) override;
  uint64_t refused_arrivals() const override { return refused_arrivals_.load(); }

 private:
  bool HasArrivals() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the seal after arrival `a`'s tile (at `wire` bytes into its slot) shows it as written
  // by the peer its immediate data names, for its handle and tile, and not consumed before;
  // consumes it when so.
  bool CheckSeal(const Arrival& a, uint64_t wire);
  void UnpackLoop();
  // Scatters an arrived tile of `in` (once: a repeat is not applied again) and reports it to the
  // local record; whether it was applied.
  bool ApplyTile(Inbound& in, const Arrival& a);
  // An arrival for a GPU destination without spec.digest: its scatter kernel is
  // launched and the arrival goes into `window` (nullopt; credited by RetireScatters when its
  // kernel has ended), or, when nothing was launched, whether it was applied (credit it now).
  // A repeat whose first copy is still in flight waits in the window too (never blocks here).
  struct PendingScatter {
    Arrival a;
    std::shared_ptr<Inbound> in;
    uint64_t ticket = 0;  // GpuTileKernels::UnpackAsync's
    bool repeat = false;
  };
  std::optional<bool> StartScatter(const std::shared_ptr<Inbound>& in, const Arrival& a,
                                   ScatterWindow<PendingScatter>* window);
  // Credits every entry of `window` whose kernel has ended (or whose first copy has settled).
  void RetireScatters(ScatterWindow<PendingScatter>* window);
  // A repeat of a tile that has settled: whether its first copy landed (noted once per repeat).
  bool RepeatSettledLocked(Inbound& in, uint32_t tile) ABSL_EXCLUSIVE_LOCKS_REQUIRED(in.mu);
  // The end of applying a tile once its scatter returned `unpacked` (no spec.digest check left):
  // reported to the local record, counted; whether applied.
  bool LandTileLocked(Inbound& in, const Arrival& a, const absl::Status& unpacked)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(in.mu);
  // Returns the arrival's slot to its peer (credit word, then the RMA), `applied` or not.
  void Credit(const Arrival& a, bool applied);
  // Ends `in`'s local record (if any) with `why` unless it has ended; then no tile of it reports.
  void EndInboundRecord(Inbound& in, const absl::Status& why);
  // Begin's steps after admission: this side's unpack path (GPU kernel, relay or CPU; the path
  // reason returned), this node's record of the transfer (when a sink is set), and a handle.
  std::string ChooseUnpackPath(Inbound& in);
  absl::Status RecordInbound(const peer_v1::BeginRemoteTransferRequest& request,
                             const planner::RegionView& src_view,
                             const std::shared_ptr<Inbound>& in, const std::string& unpack_why);
  absl::Status Register(const std::shared_ptr<Inbound>& in);
  // Keeps what finds the seals of `in`'s tiles still in flight (see Retired).
  void Retire(const Inbound& in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const FabricOptions options_;
  Lanes* const lanes_;
  PeerTable* const peers_;
  const Leases* const leases_;
  regions::RegionTable* const regions_;
  const access::Grants* const grants_;
  const std::unique_ptr<RelayStage> relay_;  // the relay hop (PATH_HIERARCHICAL)
  std::vector<std::thread> unpackers_;

  // The TransferManager, for inbound records; readers hold sink_mu_ while they call it.
  mutable absl::Mutex sink_mu_;
  transfers::InboundSink* sink_ ABSL_GUARDED_BY(sink_mu_) = nullptr;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint32_t, std::shared_ptr<Inbound>> inbound_ ABSL_GUARDED_BY(mu_);
  uint32_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<Arrival> arrivals_ ABSL_GUARDED_BY(mu_);
  // Ended transfers by handle, and their handles oldest first (handle, seq).
  std::map<uint32_t, Retired> retired_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<uint32_t, uint64_t>> retired_order_ ABSL_GUARDED_BY(mu_);
  uint64_t retired_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> refused_arrivals_{0};
};

void ReceiverImpl::Start() {
  for (int i = 0; i < std::max(1, options_.unpack_threads); ++i) {
    unpackers_.emplace_back([this] { UnpackLoop(); });
  }
}

void ReceiverImpl::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : unpackers_) {
    if (t.joinable()) t.join();
  }
}

// ---- Begin / End (gRPC threads) ----

// Admission, step by step (inbound_admit.h): bounds, sender, destination and grant, plan, hello;
// then this side's unpack path, this node's record, and the handle.
absl::Status ReceiverImpl::Begin(const peer_v1::BeginRemoteTransferRequest& request,
                                 peer_v1::BeginRemoteTransferResponse* response) {
  // Every size the peer supplies is bounded before anything is planned or allocated.
  KVRAIL_RETURN_IF_ERROR(CheckBeginBounds(request, options_.slot_bytes));
  PeerConn* peer = peers_->Find(request.sender_node_id());
  if (peer == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat("node '", request.sender_node_id(),
                                                    "' is not in this daemon's peer directory"));
  }
  KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<regions::Region> dst,
                          AdmitDestination(request, *leases_, *regions_, *grants_));
  KVRAIL_ASSIGN_OR_RETURN(InboundPlan planned,
                          PlanInbound(request, dst->view(), options_.slot_bytes));
  KVRAIL_RETURN_IF_ERROR(CheckIntroduced(*peer, request.sender_boot_id()));
  auto in = std::make_shared<Inbound>(std::move(planned.plan));
  in->peer = peer->index;
  in->sender_transfer_id = request.sender_transfer_id();
  in->sender_node = peer->node_id;
  in->digest = request.spec().digest();
  in->dst = std::move(dst);
  {
    absl::MutexLock lock(&in->mu);
    in->applied.assign(in->plan.num_tiles(), false);
    in->landed.assign(in->plan.num_tiles(), false);
  }
  const std::string unpack_why = ChooseUnpackPath(*in);
  KVRAIL_RETURN_IF_ERROR(RecordInbound(request, planned.src_view, in, unpack_why));
  KVRAIL_RETURN_IF_ERROR(Register(in));
  spdlog::info(
      "fabric: inbound transfer {} from '{}' into region {}: {} bytes, {} tiles (handle {})",
      in->sender_transfer_id, in->sender_node, request.spec().dst().region_id(),
      in->plan.bytes_total(), in->plan.num_tiles(), in->handle);
  response->set_handle(in->handle);
  const v1::RegionSpec& dst_spec = in->dst->spec();
  if (dst_spec.memory_kind() == v1::MEMORY_KIND_CUDA) {
    response->set_dst_gpu_uuid(dst_spec.device_uuid());
  }
  return absl::OkStatus();
}

std::string ReceiverImpl::ChooseUnpackPath(Inbound& in) {
  std::string why;
  const v1::RegionSpec& dst_spec = in.dst->spec();
  const bool cuda = dst_spec.memory_kind() == v1::MEMORY_KIND_CUDA;
  const RegionSide side{cuda, cuda ? dst_spec.device() : -1, in.dst->data()};
  in.gpu = GpuTileKernels::ForDestination(in.plan, side, options_.gpu_pack_kernels, &why);
  // The relay hop (relay.h): this side's GPU R' for the destination GPU, or none.
  const int gpu_index =
      cuda && options_.topology != nullptr
          ? GpuIndexOf(*options_.topology, dst_spec.device_uuid(), dst_spec.device())
          : -1;
  RelayNote relay_note;
  in.relay = relay_->ForTransfer(in.plan, side, gpu_index, in.digest, &relay_note);
  // the relay scatters (a kernel from R's slot, or the host twin)
  if (in.relay != nullptr) in.gpu.reset();
  NoteRelay(relay_note, &why);
  return why;
}

absl::Status ReceiverImpl::RecordInbound(const peer_v1::BeginRemoteTransferRequest& request,
                                         const planner::RegionView& src_view,
                                         const std::shared_ptr<Inbound>& in,
                                         const std::string& unpack_why) {
  absl::ReaderMutexLock sink_lock(&sink_mu_);
  if (sink_ == nullptr) return absl::OkStatus();
  KVRAIL_ASSIGN_OR_RETURN(
      transfers::InboundSink::Admitted admitted,
      sink_->BeginInbound(
          request.spec(), in->plan,
          MakeLeasedRegion(SourceLease(request, options_.node_id), src_view, "source"), in->dst,
          in->sender_node, in->sender_transfer_id));
  in->local_id = admitted.id;
  in->job = std::move(admitted.job);
  if (!unpack_why.empty()) in->job->OnEngineNote(unpack_why);
  return absl::OkStatus();
}

absl::Status ReceiverImpl::Register(const std::shared_ptr<Inbound>& in) {
  absl::MutexLock lock(&mu_);
  std::optional<uint32_t> handle;
  if (inbound_.size() < kMaxInbound) {
    handle = NextFreeHandle(next_handle_, [this](uint32_t h) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return inbound_.count(h) > 0 || retired_.count(h) > 0;
    });
  }
  if (!handle.has_value()) {
    EndInboundRecord(*in, absl::ResourceExhaustedError("too many inbound transfers"));
    return absl::ResourceExhaustedError("too many inbound transfers");
  }
  in->handle = *handle;
  next_handle_ = (*handle + 1) & 0xffff;
  inbound_[in->handle] = in;
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> ReceiverImpl::End(const std::string& sender, uint32_t handle, bool abort,
                                           const std::string& why) {
  PeerConn* peer = peers_->Find(sender);
  std::shared_ptr<Inbound> in;
  {
    absl::MutexLock lock(&mu_);
    auto it = inbound_.find(handle);
    if (peer == nullptr || it == inbound_.end() || it->second->peer != peer->index) {
      return absl::NotFoundError(
          absl::StrCat("handle: no inbound transfer ", handle, " from '", sender, "'"));
    }
    in = it->second;
    inbound_.erase(it);
    Retire(*in);
  }
  uint32_t applied = 0;
  {
    absl::MutexLock lock(&in->mu);
    applied = in->applied_count;
  }
  if (abort) {
    spdlog::info("fabric: inbound transfer {} from '{}' aborted after {} of {} tiles: {}",
                 in->sender_transfer_id, sender, applied, in->plan.num_tiles(), why);
    EndInboundRecord(
        *in, absl::UnavailableError(absl::StrCat("aborted by the sender '", sender, "': ", why)));
  } else if (applied < in->plan.num_tiles()) {
    EndInboundRecord(
        *in, absl::DataLossError(absl::StrCat("the sender '", sender, "' ended the transfer after ",
                                              applied, " of ", in->plan.num_tiles(), " tiles")));
  }
  return applied;
}

void ReceiverImpl::DropPeer(PeerConn* peer, const absl::Status& why) {
  std::vector<std::shared_ptr<Inbound>> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = inbound_.begin(); it != inbound_.end();) {
      if (it->second->peer == peer->index) {
        spdlog::warn("fabric: inbound transfer {} from '{}' dropped: {}",
                     it->second->sender_transfer_id, peer->node_id, why.ToString());
        dropped.push_back(it->second);
        Retire(*it->second);
        it = inbound_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& in : dropped) {
    EndInboundRecord(*in, absl::UnavailableError(absl::StrCat("the sender '", peer->node_id,
                                                              "' is gone: ", why.message())));
  }
}

void ReceiverImpl::Retire(const Inbound& in) {
  Retired r;
  r.peer = in.peer;
  r.seq = ++retired_seq_;
  r.header = in.plan.header();
  r.num_tiles = in.plan.num_tiles();
  r.digest = in.digest;
  retired_[in.handle] = r;
  retired_order_.emplace_back(in.handle, r.seq);
  while (retired_order_.size() > kMaxRetired) {
    const auto [handle, seq] = retired_order_.front();
    retired_order_.pop_front();
    auto it = retired_.find(handle);
    if (it != retired_.end() && it->second.seq == seq) retired_.erase(it);
  }
}

void ReceiverImpl::EndInboundRecord(Inbound& in, const absl::Status& why) {
  {
    absl::MutexLock lock(&in.mu);
    if (in.ended || in.job == nullptr) return;
    in.ended = true;
  }
  absl::ReaderMutexLock sink_lock(&sink_mu_);
  if (sink_ != nullptr) sink_->EndInbound(in.local_id, why);
}

void ReceiverImpl::SetInboundSink(transfers::InboundSink* sink) {
  absl::MutexLock lock(&sink_mu_);
  sink_ = sink;
}

// ---- arrivals (proxy threads) and unpacking ----

void ReceiverImpl::OnArrival(const Arrival& arrival) {
  absl::MutexLock lock(&mu_);
  arrivals_.push_back(arrival);
}

bool ReceiverImpl::HasArrivals() const { return stopping_ || !arrivals_.empty(); }

bool ReceiverImpl::CheckSeal(const Arrival& a, uint64_t wire) {
  TileSeal seal;
  std::memcpy(&seal, lanes_->RecvSlot(a.lane, a.peer, a.slot) + wire, sizeof(seal));
  PeerConn* peer = peers_->at(a.peer);
  const uint64_t key = lanes_->PeerRegistration(a.lane, a.peer).key();
  const char* why = nullptr;
  {
    absl::MutexLock lock(&peer->mu);
    why = SealRefusal(seal, key, a.handle, a.tile, peer->sealed[a.lane][a.slot], peer->generation);
    if (why == nullptr) peer->sealed[a.lane][a.slot] = seal.nonce;
  }
  if (why != nullptr) {
    if (!LogRefusal(refused_arrivals_.fetch_add(1) + 1)) return false;
    spdlog::warn(
        "fabric: arrival naming '{}' handle {} tile {} slot {} on lane {} refused: {} "
        "(not written by that peer for that tile: not applied, not credited)",
        peer->node_id, a.handle, a.tile, a.slot, a.lane, why);
    return false;
  }
  return true;
}

bool ReceiverImpl::ApplyTile(Inbound& in, const Arrival& a) {
  {
    absl::MutexLock lock(&in.mu);
    if (in.applied[a.tile]) {
      // A repeat from the sender (its seal checked): a lane failover's re-send or the late
      // original after one. Not scattered again; once the first copy has landed the repeat is
      // credited "applied" too (the sender completes whichever copy it waits for), counted once.
      const uint32_t tile = a.tile;
      auto settled = [&in, tile]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(in.mu) { return in.Settled(tile); };
      in.mu.Await(absl::Condition(&settled));
      return RepeatSettledLocked(in, a.tile);
    }
    bool producer_gone = false;
    if (in.job != nullptr && (in.ended || !in.job->ended(&producer_gone).ok())) {
      // This node's record of the transfer ended (its destination's session ended, so the
      // memory is its dead owner's): nothing more is written into it, and the tile is credited
      // "not applied", so the sender's transfer fails instead of succeeding.
      return false;
    }
    in.applied[a.tile] = true;
  }
  const v1::RegionSpec& dst = in.dst->spec();
  const bool cuda = dst.memory_kind() == v1::MEMORY_KIND_CUDA;
  const uint8_t* const slot = lanes_->RecvSlot(a.lane, a.peer, a.slot);
  const RegionSide dst_side{cuda, cuda ? dst.device() : -1, in.dst->data()};
  const absl::Status unpacked = in.relay != nullptr ? in.relay->Unpack(a.tile, slot)
                                : in.gpu != nullptr ? in.gpu->Unpack(a.tile, slot)
                                                    : UnpackTile(in.plan, a.tile, slot, dst_side);
  // spec.digest: the destination read back after the scatter against the digest sent with it.
  absl::Status checked;
  uint64_t sent = 0, landed = 0;
  if (in.digest && unpacked.ok()) {
    sent = TrailerDigest(in.plan, a.tile, slot);
    // The slot's bytes are spent (scattered, trailer read): a GPU destination is read back into it.
    absl::StatusOr<uint64_t> read_back =
        DestinationTileDigest(in.plan, a.tile, dst_side, const_cast<uint8_t*>(slot));
    if (!read_back.ok()) {
      checked = read_back.status();
    } else {
      landed = *read_back;
      if (landed != sent) checked = planner::DigestMismatchError(in.plan, a.tile, sent, landed);
    }
  }
  absl::MutexLock lock(&in.mu);
  if (in.digest && unpacked.ok()) {
    const bool report = in.job != nullptr && !in.ended;
    const bool hashed = checked.ok() || checked.code() == absl::StatusCode::kDataLoss;
    if (report && hashed) in.job->OnTileDigest(a.tile, sent, landed);
    if (!checked.ok()) {
      // Not applied (the sender's tile fails); this node's transfer fails with DATA_LOSS.
      spdlog::warn("fabric: tile {} of transfer {} from '{}': {}", a.tile, in.sender_transfer_id,
                   in.sender_node, checked.ToString());
      in.applied[a.tile] = false;
      if (report) {
        in.job->OnTileStart(a.tile);
        in.job->OnTileDone(a.tile, checked);
      }
      return false;
    }
  }
  return LandTileLocked(in, a, unpacked);
}

bool ReceiverImpl::RepeatSettledLocked(Inbound& in, uint32_t tile) {
  if (in.landed[tile] && ++in.repeats > 0 && in.job != nullptr && !in.ended) {
    in.job->OnEngineNote(absl::StrCat(
        "lane failover on the sender: ", in.repeats,
        " tile(s) arrived twice (re-sent on another lane, and the original), kept once"));
  }
  return in.landed[tile];
}

bool ReceiverImpl::LandTileLocked(Inbound& in, const Arrival& a, const absl::Status& unpacked) {
  if (!unpacked.ok()) {
    // Reported to the sender as not applied (its transfer fails); the tile may come again.
    spdlog::warn("fabric: tile {} of transfer {} from '{}': {}", a.tile, in.sender_transfer_id,
                 in.sender_node, unpacked.ToString());
    in.applied[a.tile] = false;
    return false;
  }
  if (in.job != nullptr && !in.ended) {
    in.job->OnTileStart(a.tile);
    in.job->OnTileDone(a.tile, absl::OkStatus());
  }
  in.landed[a.tile] = true;
  if (++in.applied_count == in.plan.num_tiles()) {
    spdlog::info("fabric: inbound transfer {} from '{}' complete: {} tiles, {} bytes",
                 in.sender_transfer_id, in.sender_node, in.plan.num_tiles(), in.plan.bytes_total());
  }
  return true;
}

std::optional<bool> ReceiverImpl::StartScatter(const std::shared_ptr<Inbound>& in_ptr,
                                               const Arrival& a,
                                               ScatterWindow<PendingScatter>* window) {
  Inbound& in = *in_ptr;
  {
    absl::MutexLock lock(&in.mu);
    if (in.applied[a.tile]) {
      // A repeat (see ApplyTile): credited once its first copy has settled, which may be in
      // flight in this very window (waiting here would never end).
      if (in.Settled(a.tile)) return RepeatSettledLocked(in, a.tile);
      window->Add(PendingScatter{a, in_ptr, 0, /*repeat=*/true});
      return std::nullopt;
    }
    bool producer_gone = false;
    if (in.job != nullptr && (in.ended || !in.job->ended(&producer_gone).ok())) {
      // This node's record of the transfer ended (its destination's session ended, so the
      // memory is its dead owner's): nothing more is written into it, and the tile is credited
      // "not applied", so the sender's transfer fails instead of succeeding.
      return false;
    }
    in.applied[a.tile] = true;
  }
  const absl::StatusOr<uint64_t> ticket =
      in.gpu->UnpackAsync(a.tile, lanes_->RecvSlot(a.lane, a.peer, a.slot));
  if (!ticket.ok()) {
    absl::MutexLock lock(&in.mu);
    return LandTileLocked(in, a, ticket.status());
  }
  window->Add(PendingScatter{a, in_ptr, *ticket, /*repeat=*/false});
  return std::nullopt;
}

void ReceiverImpl::RetireScatters(ScatterWindow<PendingScatter>* window) {
  window->Poll(
      [this](PendingScatter& p) -> std::optional<bool> {
        Inbound& in = *p.in;
        if (p.repeat) {
          absl::MutexLock lock(&in.mu);
          if (!in.Settled(p.a.tile)) return std::nullopt;
          return RepeatSettledLocked(in, p.a.tile);
        }
        const std::optional<absl::Status> done = in.gpu->Poll(p.ticket);
        if (!done.has_value()) return std::nullopt;
        absl::MutexLock lock(&in.mu);
        return LandTileLocked(in, p.a, *done);
      },
      [this](PendingScatter& p, bool applied) { Credit(p.a, applied); });
}

void ReceiverImpl::Credit(const Arrival& a, bool applied) {
  PeerConn* peer = peers_->at(a.peer);
  uint64_t value;
  {
    absl::MutexLock lock(&peer->mu);
    value = ++peer->consumed[a.lane][a.slot];
  }
  if (!applied) value |= kCreditNotApplied;  // the sender trusts the word, not the imm bit
  lanes_->QueueCredit(a.lane, CreditOp{a.peer, a.slot, a.tile, applied, value});
}

void ReceiverImpl::UnpackLoop() {
  // This thread's GPU scatters in flight: each arrival's credit goes back when its
  // own kernel has ended (its event), several kernels queued on the transfer's stream meanwhile.
  ScatterWindow<PendingScatter> window;
  while (true) {
    RetireScatters(&window);
    Arrival a;
    std::shared_ptr<Inbound> in;
    std::optional<Retired> retired;
    {
      absl::MutexLock lock(&mu_);
      if (!mu_.AwaitWithTimeout(absl::Condition(this, &ReceiverImpl::HasArrivals),
                                ScatterWindow<PendingScatter>::WaitFor(window.empty()))) {
        continue;  // no arrival yet: look at the scatters in flight again
      }
      if (stopping_) return;
      a = arrivals_.front();
      arrivals_.pop_front();
      auto it = inbound_.find(a.handle);
      if (it != inbound_.end() && it->second->peer == a.peer) {
        in = it->second;
      } else if (auto r = retired_.find(a.handle);
                 r != retired_.end() && r->second.peer == a.peer) {
        retired = r->second;
      }
    }
    if (a.peer >= peers_->size() || a.slot >= options_.slots) {
      spdlog::warn("fabric: arrival with peer index {} slot {} ignored", a.peer, a.slot);
      continue;
    }
    // An index whose peer left (retired, in quarantine): a late tile of it, or one
    // naming it, is neither applied nor credited (its staging goes when the quarantine ends).
    if (peers_->at(a.peer)->retired.load(std::memory_order_acquire)) {
      refused_arrivals_.fetch_add(1);
      continue;
    }
    // Where the tile's seal lies in the slot: after its bytes (and digest trailer), when the
    // arrival names a tile of a transfer the named peer has, or had, here.
    std::optional<uint64_t> wire;
    if (in != nullptr && a.tile < in->plan.num_tiles()) {
      wire = TileBytes(in->plan, a.tile) + (in->digest ? kDigestTrailerBytes : 0);
    } else if (retired.has_value() && a.tile < retired->num_tiles) {
      const kernels::TileDesc t = kernels::TileAt(retired->header, a.tile);
      wire = (t.byte_end - t.byte_begin) + (retired->digest ? kDigestTrailerBytes : 0);
    }
    // Providers need not report the length of a remote write (tcp reports 0); check it when given.
    if (!wire.has_value() || (a.len != 0 && a.len != *wire + kTileSealBytes)) {
      // Immediate data is forgeable: nothing shows the named peer sent this (a handle unknown
      // here, another peer's, a tile out of range or a length that does not fit), so it is
      // neither applied nor credited. Crediting the named peer's slot "not applied" let any peer
      // fail another's tiles in flight and skew its slot accounting (denial of service).
      const uint64_t n = refused_arrivals_.fetch_add(1) + 1;
      if (LogRefusal(n)) {
        spdlog::warn(
            "fabric: arrival naming '{}' handle {} tile {} slot {} on lane {} ({} bytes) "
            "refused: {} (not applied, not credited; {} refused so far)",
            peers_->at(a.peer)->node_id, a.handle, a.tile, a.slot, a.lane, a.len,
            in != nullptr || retired.has_value() ? "its tile or length does not fit that transfer"
                                                 : "no transfer of that peer has that handle here",
            n);
      }
      continue;
    }
    // The seal after the tile in the slot of the peer the immediate data names: written by that
    // peer (only it holds the key of that range) for this handle and tile, not consumed yet.
    // Anything else is not what that peer sent (another peer naming its index, a replay): not
    // applied, not credited (the peer's slot accounting is not touched).
    if (!CheckSeal(a, *wire)) continue;
    // That peer's own tile: applied (a live transfer) or dropped (one that ended here: End or the
    // peer dropped), and its slot credited either way.
    bool applied;
    if (in != nullptr && in->gpu != nullptr && !in->digest) {
      // Launched, credited when its kernel has ended (RetireScatters).
      const std::optional<bool> now = StartScatter(in, a, &window);
      if (!now.has_value()) continue;
      applied = *now;
    } else {
      applied = in != nullptr && ApplyTile(*in, a);
    }
    if (in == nullptr) {
      KVRAIL_DEBUG("fabric: tile {} for ended handle {} from '{}' dropped", a.tile, a.handle,
                   peers_->at(a.peer)->node_id);
    }
    Credit(a, applied);
  }
}

}  // namespace

std::unique_ptr<Receiver> Receiver::Create(const FabricOptions& options, Lanes* lanes,
                                           PeerTable* peers, const Leases* leases,
                                           regions::RegionTable* regions,
                                           const access::Grants* grants) {
  auto receiver = std::make_unique<ReceiverImpl>(options, lanes, peers, leases, regions, grants);
  receiver->Start();
  return receiver;
}

}  // namespace kvrail::fabric

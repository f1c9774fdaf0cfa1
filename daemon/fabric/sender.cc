#include "daemon/fabric/sender.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "daemon/fabric/lane_route.h"
#include "daemon/fabric/leases.h"
#include "daemon/fabric/peer_rpc.h"
#include "daemon/fabric/relay.h"
#include "daemon/fabric/sender_impl.h"
#include "daemon/fabric/tile_copy.h"
#include "spdlog/spdlog.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

void SenderImpl::Start() {
  lane_out_ = std::vector<std::atomic<uint32_t>>(lanes_->size());  // before any thread starts
  for (int i = 0; i < std::max(1, options_.pack_threads); ++i) {
    packers_.emplace_back([this] { PackLoop(); });
  }
  closer_ = std::thread([this] { CloseLoop(); });
  watcher_ = std::thread([this] { WatchLoop(); });
}

void SenderImpl::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  stop_.store(true);
  for (auto& t : packers_) {
    if (t.joinable()) t.join();
  }
  if (closer_.joinable()) closer_.join();
  if (watcher_.joinable()) watcher_.join();
}

// ---- RemotePath ----

absl::StatusOr<transfers::RemotePath::Prepared> SenderImpl::Prepare(const v1::TransferSpec& spec) {
  PeerConn* peer = peers_->Find(spec.dst().node_id());
  if (peer == nullptr) {
    return absl::NotFoundError(absl::StrCat("spec.dst.node_id: '", spec.dst().node_id(),
                                            "' is not in this daemon's peer directory"));
  }
  bool ready;
  {
    absl::MutexLock lock(&peer->mu);
    ready = peer->introduced && peer->up;
  }
  if (!ready) {
    absl::Status hello = introduce_(peer);
    if (!hello.ok()) {
      return absl::UnavailableError(absl::StrCat("spec.dst.node_id: peer '", peer->node_id,
                                                 "' is unreachable: ", hello.message()));
    }
  }
  peer_v1::GetLeaseRequest request;
  request.set_region_id(spec.dst().region_id());
  request.set_requester_node_id(options_.node_id);
  v1::RegionLease lease;
  auto context = PeerCallContext(absl::Seconds(5));
  KVRAIL_RETURN_IF_ERROR(
      FromPeerRpc(peer->stub->GetLease(context.get(), request, &lease), "spec.dst.region_id: "));
  KVRAIL_ASSIGN_OR_RETURN(
      planner::RegionView view,
      RemoteViewOf(lease.size_bytes(), lease.writable(),
                   lease.has_paged_kv() ? &lease.paged_kv() : nullptr, "lease.paged_kv."));
  Prepared prepared;
  prepared.dst = MakeLeasedRegion(std::move(lease), std::move(view));
  prepared.engine = this;
  // spec.digest: each tile travels with its 8-byte digest after it (tile_copy.h).
  // Every tile is followed by its seal (lanes.h TileSeal).
  prepared.max_tile_bytes =
      options_.slot_bytes - kTileSealBytes - (spec.digest() ? kDigestTrailerBytes : 0);
  return prepared;
}

absl::StatusOr<std::vector<std::string>> SenderImpl::Begin(
    uint64_t id, const v1::TransferSpec& spec, const regions::Region& src, uint64_t tile_bytes,
    const std::shared_ptr<engine::Job>& job) {
  PeerConn* peer = peers_->Find(spec.dst().node_id());
  if (peer == nullptr) return absl::NotFoundError("spec.dst.node_id: unknown peer");
  peer_v1::BeginRemoteTransferRequest request;
  request.set_sender_node_id(options_.node_id);
  request.set_sender_boot_id(boot_id_);
  request.set_sender_transfer_id(id);
  *request.mutable_spec() = spec;
  request.mutable_source()->set_size_bytes(src.spec().size_bytes());
  if (src.spec().has_paged_kv())
    *request.mutable_source()->mutable_paged_kv() = src.spec().paged_kv();
  request.set_tile_bytes(tile_bytes);
  request.set_bytes_total(job->plan().bytes_total());
  request.set_tiles_total(job->plan().num_tiles());
  peer_v1::BeginRemoteTransferResponse response;
  auto context = PeerCallContext(absl::Seconds(5));
  KVRAIL_RETURN_IF_ERROR(
      FromPeerRpc(peer->stub->BeginRemoteTransfer(context.get(), request, &response),
                  absl::StrCat("peer '", peer->node_id, "' refused the transfer: ")));
  auto out = std::make_shared<Outbound>();
  out->id = id;
  out->job = job;
  out->peer = peer;
  out->handle = response.handle();
  {
    // Per transfer: the GPU kernel for a GPU source, else the copy engines / host pack; said in
    // the path reason.
    const job::Placement src_ref = job->src();
    std::string why;
    out->gpu = GpuTileKernels::ForSource(job->plan(),
                                         RegionSide{src_ref.cuda, src_ref.device, src_ref.base},
                                         job->wants_digest(), options_.gpu_pack_kernels, &why);
    // Which lanes (rail-aware; all of them whenever something is unknown), and why.
    LaneRouteInput in;
    std::vector<std::string> remote_names;
    {
      absl::MutexLock lock(&peer->mu);
      in.lanes = peer->lanes;
      for (uint32_t l = 0; l < peer->lanes; ++l) remote_names.push_back(peer->remote[l].nic_name);
    }
    for (const std::string& name : remote_names) in.peer_lane_nics.push_back(NicOfLaneName(name));
    in.local = options_.topology.get();
    in.local_lane_nics = options_.lane_nics;
    in.lane_load = LaneLoad();  // the chosen lanes least loaded first
    if (in.local != nullptr && src.spec().memory_kind() == v1::MEMORY_KIND_CUDA) {
      in.src_gpu = GpuIndexOf(*in.local, src.spec().device_uuid(), src.spec().device());
    }
    std::optional<directory::Peer> listed;
    if (directory_ != nullptr) {
      absl::StatusOr<directory::Peer> p = directory_->Lookup(peer->node_id);
      if (p.ok() && p->has_record) listed = *std::move(p);
    }
    if (listed.has_value()) {
      in.peer = &listed->record;
      for (const auto& gpu : listed->record.gpus()) {
        if (!response.dst_gpu_uuid().empty() &&
            absl::EqualsIgnoreCase(gpu.uuid(), response.dst_gpu_uuid())) {
          in.dst_gpu = gpu.index();
        }
      }
    }
    // The relay hop (relay.h): the hierarchy's choice of GPU R for this side, or a
    // forced one; a relay packs through R and the tiles leave by R's NICs.
    RelayNote relay_note;
    out->relay =
        relay_->ForTransfer(job->plan(), RegionSide{src_ref.cuda, src_ref.device, src_ref.base},
                            in.src_gpu, job->wants_digest(), &relay_note);
    if (out->relay != nullptr) {
      out->gpu.reset();  // the relay packs (a kernel into R's slot, or the host twin)
      if (out->relay->plan().relay_gpu_index >= 0) in.src_gpu = out->relay->plan().relay_gpu_index;
    }
    NoteRelay(relay_note, &why);
    out->route = ChooseLanes(in);
    const std::string lanes_note = absl::StrCat("lanes: ", out->route.reason);
    job->OnEngineNote(why.empty() ? lanes_note : absl::StrCat(why, "; ", lanes_note));
  }
  {
    absl::MutexLock lock(&peer->mu);
    for (uint32_t l = 0; l < peer->lanes; ++l) {
      if (!out->route.all && std::find(out->route.lanes.begin(), out->route.lanes.end(), l) ==
                                 out->route.lanes.end()) {
        continue;
      }
      out->nics.push_back(absl::StrCat(lanes_->at(l).nic->name(), "->", peer->remote[l].nic_name));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    outbound_[job.get()] = out;
  }
  return out->nics;
}

// ---- engine::Engine ----

void SenderImpl::Enqueue(const std::shared_ptr<engine::Job>& job,
                         const std::vector<uint32_t>& tiles) {
  if (tiles.empty()) return;
  {
    absl::MutexLock lock(&mu_);
    auto it = outbound_.find(job.get());
    if (it != outbound_.end()) {
      auto& queue = queues_[static_cast<int>(job->priority())];
      for (uint32_t t : tiles) queue.push_back(PackItem{it->second, t});
      return;
    }
  }
  for (uint32_t t : tiles) job->OnTileDone(t, absl::InternalError("fabric: job was not begun"));
}

size_t SenderImpl::Remove(const engine::Job* job) {
  size_t removed = 0;
  std::shared_ptr<Outbound> out;
  {
    absl::MutexLock lock(&mu_);
    for (auto& queue : queues_) {
      for (auto it = queue.begin(); it != queue.end();) {
        if (it->out->job.get() == job) {
          out = it->out;
          ++removed;
          it = queue.erase(it);
        } else {
          ++it;
        }
      }
    }
    auto it = outbound_.find(job);
    if (it != outbound_.end()) out = it->second;
  }
  if (out) {
    {
      absl::MutexLock lock(&out->mu);
      out->removed = true;
    }
    MaybeClose(out);
  }
  return removed;
}

std::vector<uint64_t> SenderImpl::QueuedTiles() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> out(engine::kNumPriorityClasses, 0);
  for (int c = 0; c < engine::kNumPriorityClasses; ++c) out[c] = queues_[c].size();
  return out;
}

// ---- completion: tiles done, transfers closed, a peer's transfers failed ----

void SenderImpl::FinishTile(const std::shared_ptr<Outbound>& out, uint32_t tile,
                            const absl::Status& status) {
  {
    absl::MutexLock lock(&out->mu);
    if (out->inflight > 0) --out->inflight;
    if (status.ok()) {
      ++out->ok_tiles;
    } else if (!out->failed.has_value()) {
      out->failed = status;
    }
  }
  out->job->OnTileDone(tile, status);
  MaybeClose(out);
}

void SenderImpl::MaybeClose(const std::shared_ptr<Outbound>& out) {
  Closing closing{out, false, absl::OkStatus()};
  {
    absl::MutexLock lock(&out->mu);
    if (out->closed || out->inflight > 0) return;
    if (out->ok_tiles == out->job->plan().num_tiles()) {
      closing.end = true;
    } else if (out->failed.has_value() || out->removed) {
      closing.why = out->failed.value_or(absl::CancelledError("ended by the sender"));
    } else {
      return;
    }
    out->closed = true;
  }
  absl::MutexLock lock(&mu_);
  outbound_.erase(out->job.get());
  closing_.push_back(std::move(closing));
}

void SenderImpl::FailPeer(PeerConn* peer, const absl::Status& why) {
  std::vector<std::shared_ptr<Outbound>> outs;
  std::vector<PackItem> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [job, out] : outbound_) {
      if (out->peer == peer) outs.push_back(out);
    }
    for (auto& queue : queues_) {
      for (auto it = queue.begin(); it != queue.end();) {
        if (it->out->peer == peer) {
          dropped.push_back(std::move(*it));
          it = queue.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
  for (auto& out : outs) {
    absl::MutexLock lock(&out->mu);
    if (!out->failed.has_value()) out->failed = why;
  }
  // In-flight tiles: their slots stay reserved (orphaned) until a late credit or a re-base.
  std::vector<SlotOwner> orphaned;
  {
    absl::MutexLock lock(&peer->mu);
    for (uint32_t l = 0; l < peer->owners.size(); ++l) {
      for (SlotOwner& o : peer->owners[l]) {
        if (o.outbound) {
          Unowned(l);
          orphaned.push_back(std::move(o));
        }
        o = SlotOwner{};
      }
    }
  }
  slots_cv_.SignalAll();
  for (auto& o : orphaned) FinishTile(o.outbound, o.tile, why);
  for (auto& item : dropped) item.out->job->OnTileDone(item.tile, why);
  for (auto& out : outs) MaybeClose(out);
  {
    // Membership: a lost peer's lanes start afresh when it is back (restarted with a
    // new boot id, or listed by the directory again): its failed lanes were its death, not theirs.
    absl::MutexLock lock(&health_mu_);
    health_.erase(peer);
  }
}

// ---- End / Abort (the closing thread) ----

void SenderImpl::CloseLoop() {
  while (true) {
    Closing closing;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !closing_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (closing_.empty()) return;
      closing = std::move(closing_.front());
      closing_.pop_front();
    }
    SendEnd(closing);
  }
}

void SenderImpl::SendEnd(const Closing& closing) {
  const Outbound& out = *closing.out;
  auto context = PeerCallContext(absl::Seconds(2));
  peer_v1::EndRemoteTransferResponse response;
  grpc::Status status;
  if (closing.end) {
    peer_v1::EndRemoteTransferRequest request;
    request.set_sender_node_id(options_.node_id);
    request.set_handle(out.handle);
    request.set_sender_transfer_id(out.id);
    status = out.peer->stub->EndRemoteTransfer(context.get(), request, &response);
  } else {
    peer_v1::AbortRemoteTransferRequest request;
    request.set_sender_node_id(options_.node_id);
    request.set_handle(out.handle);
    request.set_sender_transfer_id(out.id);
    request.set_error_code(static_cast<int32_t>(closing.why.code()));
    request.set_error_message(std::string(closing.why.message()));
    status = out.peer->stub->AbortRemoteTransfer(context.get(), request, &response);
  }
  if (!status.ok()) {
    spdlog::info("fabric: {} of transfer {} on '{}' not delivered: {}",
                 closing.end ? "end" : "abort", out.id, out.peer->node_id, status.error_message());
  }
}

std::unique_ptr<Sender> Sender::Create(const FabricOptions& options, uint64_t boot_id, Lanes* lanes,
                                       PeerTable* peers, const directory::Directory* directory,
                                       Introduce introduce) {
  auto sender =
      std::make_unique<SenderImpl>(options, boot_id, lanes, peers, directory, std::move(introduce));
  sender->Start();
  return sender;
}

}  // namespace kvrail::fabric

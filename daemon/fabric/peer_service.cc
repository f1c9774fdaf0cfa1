// The fabric control path: the Peer gRPC service, hello and liveness, region exports and
// leases, remote transfer begin/end, and Fabric::Create.
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/fabric/fabric_service.h"
#include "spdlog/spdlog.h"

namespace kvrail::fabric {
namespace {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpc(const grpc::Status& status, const std::string& prefix) {
  if (status.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(status.error_code());
  // Transport failures (deadline, connection refused) mean the peer is unreachable.
  if (code == absl::StatusCode::kDeadlineExceeded) code = absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrCat(prefix, status.error_message()));
}

// `wait_for_ready`: ride out a reconnect in progress instead of failing at once (control RPCs;
// heartbeats fail fast).
std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout, bool wait_for_ready = true) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context->set_wait_for_ready(wait_for_ready);
  return context;
}

// A destination region on another node, as leased to this one: the planner's view only.
// Immutable; thread-safe.
class LeasedRegion final : public regions::Region {
 public:
  LeasedRegion(v1::RegionLease lease, planner::RegionView view, std::string what = "lease of")
      : lease_(std::move(lease)), view_(std::move(view)) {
    spec_.set_name(absl::StrCat(what, " region ", lease_.region_id(), " on '",
                                lease_.owner_node_id(), "'"));
    spec_.set_memory_kind(v1::MEMORY_KIND_HOST);
    spec_.set_size_bytes(lease_.size_bytes());
    spec_.set_writable(lease_.writable());
    if (lease_.has_paged_kv()) *spec_.mutable_paged_kv() = lease_.paged_kv();
  }
  uint64_t id() const override { return lease_.region_id(); }
  uint64_t session_id() const override { return 0; }
  uint8_t* data() const override { return nullptr; }
  absl::StatusOr<uint8_t*> DeviceAddress(int /*accessor*/) const override {
    return absl::FailedPreconditionError("a leased remote region has no local address");
  }
  const v1::RegionSpec& spec() const override { return spec_; }
  const planner::RegionView& view() const override { return view_; }
  v1::RegionInfo Info() const override {
    v1::RegionInfo info;
    info.set_region_id(id());
    *info.mutable_spec() = spec_;
    return info;
  }
  void AcquireUse() override {}
  void ReleaseUse() override {}

 private:
  const v1::RegionLease lease_;
  const planner::RegionView view_;
  v1::RegionSpec spec_;
};

absl::StatusOr<planner::RegionView> ViewOf(uint64_t size, bool writable,
                                           const v1::PagedKvLayout* paged,
                                           const std::string& field) {
  planner::RegionView view;
  view.size_bytes = size;
  view.writable = writable;
  if (paged != nullptr) {
    view.paged = true;
    KVRAIL_ASSIGN_OR_RETURN(view.layout, planner::ResolveLayout(*paged, size, field));
  }
  return view;
}

// Thread contract: gRPC calls these concurrently; FabricImpl is thread-safe.
class PeerServiceImpl final : public v1::Peer::Service {
 public:
  explicit PeerServiceImpl(FabricImpl* fabric) : fabric_(fabric) {}

  grpc::Status Hello(grpc::ServerContext*, const v1::HelloRequest* request,
                     v1::HelloResponse* response) override {
    auto hello = fabric_->OnHello(request->hello());
    if (!hello.ok()) return ToGrpc(hello.status());
    *response->mutable_hello() = *std::move(hello);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override {
    fabric_->OnHeartbeat(request->node_id(), request->boot_id());
    response->set_node_id(fabric_->node_id());
    response->set_boot_id(fabric_->boot_id());
    response->set_unix_us(absl::ToUnixMicros(absl::Now()));
    return grpc::Status::OK;
  }
  grpc::Status ExportRegion(grpc::ServerContext* context, const v1::ExportRegionRequest* request,
                            v1::RegionLease* response) override {
    if (context->peer().rfind("unix:", 0) != 0) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          "ExportRegion is served to local clients (the unix socket) only");
    }
    return Fill(fabric_->OnExport(request->region_id(), request->peer_node_id()), response);
  }
  grpc::Status GetLease(grpc::ServerContext*, const v1::GetLeaseRequest* request,
                        v1::RegionLease* response) override {
    return Fill(fabric_->OnGetLease(request->region_id(), request->requester_node_id()), response);
  }
  grpc::Status BeginRemoteTransfer(grpc::ServerContext*,
                                   const v1::BeginRemoteTransferRequest* request,
                                   v1::BeginRemoteTransferResponse* response) override {
    auto handle = fabric_->OnBegin(*request);
    if (!handle.ok()) return ToGrpc(handle.status());
    response->set_handle(*handle);
    return grpc::Status::OK;
  }
  grpc::Status EndRemoteTransfer(grpc::ServerContext*, const v1::EndRemoteTransferRequest* request,
                                 v1::EndRemoteTransferResponse* response) override {
    auto applied = fabric_->OnEnd(request->sender_node_id(), request->handle(), false, "");
    if (!applied.ok()) return ToGrpc(applied.status());
    response->set_tiles_applied(*applied);
    return grpc::Status::OK;
  }
  grpc::Status AbortRemoteTransfer(grpc::ServerContext*,
                                   const v1::AbortRemoteTransferRequest* request,
                                   v1::EndRemoteTransferResponse* response) override {
    auto applied = fabric_->OnEnd(request->sender_node_id(), request->handle(), true,
                                  request->error_message());
    if (!applied.ok()) return ToGrpc(applied.status());
    response->set_tiles_applied(*applied);
    return grpc::Status::OK;
  }

 private:
  static grpc::Status Fill(absl::StatusOr<v1::RegionLease> lease, v1::RegionLease* out) {
    if (!lease.ok()) return ToGrpc(lease.status());
    *out = *std::move(lease);
    return grpc::Status::OK;
  }
  FabricImpl* const fabric_;
};

}  // namespace

uint64_t FabricImpl::MakeBootId() {
  std::random_device rd;
  return (uint64_t{rd()} << 32 | rd()) | 1;
}

PeerConn* FabricImpl::FindPeer(const std::string& node_id) const {
  for (const auto& p : peers_) {
    if (p->node_id == node_id) return p.get();
  }
  return nullptr;
}

// ---- hello and liveness ----

v1::PeerHello FabricImpl::HelloFor(const PeerConn& peer) const {
  v1::PeerHello hello;
  hello.set_version(1);
  hello.set_node_id(options_.node_id);
  hello.set_boot_id(boot_id_);
  hello.set_provider(lanes_[0]->nic->provider());
  for (const auto& lane : lanes_) {
    v1::PeerNic* nic = hello.add_nics();
    nic->set_name(lane->nic->name());
    nic->set_fabric_address(lane->nic->address());
    nic->set_mr_key(lane->mr->key());
    const uint8_t* base = lane->memory.get();
    nic->set_recv_base(lane->mr->remote_base() + (RecvSlot(lane->index, peer.index, 0) - base));
    nic->set_credit_base(lane->mr->remote_base() +
                         (reinterpret_cast<uint8_t*>(CreditWords(lane->index, peer.index)) - base));
  }
  hello.set_slots(options_.slots);
  hello.set_slot_bytes(options_.slot_bytes);
  hello.set_your_index(peer.index);
  hello.set_topology_summary(options_.topology_summary);
  hello.set_software_version(options_.software_version);
  return hello;
}

absl::Status FabricImpl::ApplyHello(PeerConn* peer, const v1::PeerHello& hello) {
  if (hello.version() != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer '", hello.node_id(), "' speaks peer protocol ", hello.version(), ", not 1"));
  }
  if (hello.provider() != lanes_[0]->nic->provider()) {
    return absl::FailedPreconditionError(absl::StrCat("peer '", hello.node_id(), "' uses provider '",
                                                      hello.provider(), "', this daemon '",
                                                      lanes_[0]->nic->provider(), "'"));
  }
  if (hello.slots() != options_.slots || hello.slot_bytes() != options_.slot_bytes ||
      hello.nics_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "peer '", hello.node_id(), "' staging (", hello.slots(), " x ", hello.slot_bytes(),
        ") differs from this daemon's (fabric.slots, fabric.slot_bytes must match)"));
  }
  bool restarted = false;
  {
    absl::MutexLock lock(&peer->mu);
    restarted = peer->introduced && peer->boot_id != hello.boot_id();
  }
  if (restarted) {
    spdlog::warn("fabric: peer '{}' restarted (boot id changed)", peer->node_id);
    FailPeer(peer, absl::UnavailableError(absl::StrCat("peer '", peer->node_id, "' restarted")));
  }
  absl::MutexLock lock(&peer->mu);
  if (peer->introduced && peer->boot_id == hello.boot_id()) {
    peer->up = true;
    peer->last_ok = absl::Now();
    return absl::OkStatus();  // already applied (both sides say hello)
  }
  const uint32_t lanes = std::min<uint32_t>(lanes_.size(), hello.nics_size());
  for (uint32_t l = 0; l < lanes_.size(); ++l) {
    PeerConn::Remote& r = peer->remote[l];
    if (r.addr != FI_ADDR_UNSPEC) lanes_[l]->nic->RemoveAddress(r.addr);
    r = PeerConn::Remote{};
    if (l >= lanes) continue;
    const v1::PeerNic& nic = hello.nics(l);
    KVRAIL_ASSIGN_OR_RETURN(r.addr, lanes_[l]->nic->InsertAddress(nic.fabric_address()));
    r.key = nic.mr_key();
    r.recv_base = nic.recv_base();
    r.credit_base = nic.credit_base();
    r.nic_name = nic.name();
    if (restarted) {
      peer->credits[l]->Rebase();
      std::fill(peer->consumed[l].begin(), peer->consumed[l].end(), 0);
    }
  }
  peer->lanes = lanes;
  peer->index_at_peer = hello.your_index();
  peer->boot_id = hello.boot_id();
  peer->peer_slot_bytes = hello.slot_bytes();
  peer->introduced = true;
  peer->up = true;
  peer->last_ok = absl::Now();
  directory_->MarkUp(peer->node_id, peer->last_ok, peer->boot_id);
  spdlog::info("fabric: peer '{}' introduced: {} lanes, provider {}, {}", peer->node_id, lanes,
               hello.provider(), hello.topology_summary());
  return absl::OkStatus();
}

absl::Status FabricImpl::Introduce(PeerConn* peer) {
  v1::HelloRequest request;
  *request.mutable_hello() = HelloFor(*peer);
  v1::HelloResponse response;
  auto context = Context(absl::Seconds(2));
  KVRAIL_RETURN_IF_ERROR(FromGrpc(peer->stub->Hello(context.get(), request, &response),
                           absl::StrCat("hello to '", peer->node_id, "' at ", peer->address, ": ")));
  return ApplyHello(peer, response.hello());
}

absl::StatusOr<v1::PeerHello> FabricImpl::OnHello(const v1::PeerHello& hello) {
  PeerConn* peer = FindPeer(hello.node_id());
  if (peer == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("node '", hello.node_id(), "' is not in this daemon's peer directory"));
  }
  KVRAIL_RETURN_IF_ERROR(ApplyHello(peer, hello));
  return HelloFor(*peer);
}

void FabricImpl::OnHeartbeat(const std::string& node_id, uint64_t boot_id) {
  PeerConn* peer = FindPeer(node_id);
  if (peer == nullptr) return;
  absl::MutexLock lock(&peer->mu);
  if (peer->introduced && peer->boot_id == boot_id) {
    peer->last_ok = absl::Now();
    directory_->MarkUp(node_id, peer->last_ok, boot_id);
  }
}

void FabricImpl::StartLiveness() {
  liveness_ = std::thread([this] { LivenessLoop(); });
}

void FabricImpl::LivenessLoop() {
  while (!stop_.load()) {
    for (auto& p : peers_) {
      PeerConn* peer = p.get();
      bool introduced;
      uint64_t seq, known_boot;
      {
        absl::MutexLock lock(&peer->mu);
        introduced = peer->introduced;
        seq = ++peer->heartbeat_seq;
        known_boot = peer->boot_id;
      }
      absl::Status status;
      if (!introduced) {
        status = Introduce(peer);
      } else {
        v1::HeartbeatRequest request;
        request.set_node_id(options_.node_id);
        request.set_boot_id(boot_id_);
        request.set_sequence(seq);
        v1::HeartbeatResponse response;
        auto context =
            Context(std::min(options_.liveness_timeout / 2, absl::Seconds(1)), false);
        status = FromGrpc(peer->stub->Heartbeat(context.get(), request, &response), "heartbeat: ");
        if (status.ok() && response.boot_id() != known_boot) status = Introduce(peer);
      }
      const absl::Time now = absl::Now();
      bool newly_down = false;
      absl::Duration silent;
      {
        absl::MutexLock lock(&peer->mu);
        if (status.ok()) {
          peer->up = true;
          peer->last_ok = now;
          directory_->MarkUp(peer->node_id, now, peer->boot_id);
        } else if (peer->last_ok == absl::InfinitePast()) {
          directory_->MarkDown(peer->node_id);
        } else if (peer->up && now - peer->last_ok > options_.liveness_timeout) {
          peer->up = false;
          newly_down = true;
          silent = now - peer->last_ok;
          directory_->MarkDown(peer->node_id);
        }
      }
      if (newly_down) {
        spdlog::warn("fabric: peer '{}' is down ({})", peer->node_id, status.ToString());
        FailPeer(peer, absl::UnavailableError(absl::StrCat(
                           "peer '", peer->node_id, "' at ", peer->address, " is down: no answer for ",
                           absl::FormatDuration(silent), " (", status.message(), ")")));
      }
    }
    for (absl::Duration left = options_.heartbeat_interval;
         left > absl::ZeroDuration() && !stop_.load(); left -= absl::Milliseconds(50)) {
      absl::SleepFor(std::min(left, absl::Milliseconds(50)));
    }
  }
}

// ---- leases ----

absl::StatusOr<v1::RegionLease> FabricImpl::OnExport(uint64_t region_id,
                                                     const std::string& peer_node) {
  if (FindPeer(peer_node) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("peer_node_id: '", peer_node, "' is not in this daemon's peer directory"));
  }
  auto region = regions_->Get(region_id);
  if (!region.ok()) return absl::NotFoundError(absl::StrCat("region_id: ", region.status().message()));
  // Host and GPU regions alike: arriving tiles are scattered by the host twin or, for GPU memory,
  // by the copy engines from the pinned staging slots (tile_copy.h).
  {
    absl::MutexLock lock(&mu_);
    exports_[region_id].insert(peer_node);
  }
  spdlog::info("fabric: region {} exported to '{}'", region_id, peer_node);
  return OnGetLease(region_id, peer_node);
}

absl::StatusOr<v1::RegionLease> FabricImpl::OnGetLease(uint64_t region_id,
                                                       const std::string& requester) {
  auto region = regions_->Get(region_id);
  if (!region.ok()) return absl::NotFoundError(absl::StrCat("region_id: ", region.status().message()));
  {
    absl::MutexLock lock(&mu_);
    auto it = exports_.find(region_id);
    if (it == exports_.end() || !it->second.count(requester)) {
      return absl::PermissionDeniedError(absl::StrCat("region ", region_id, " of node '",
                                                      options_.node_id, "' is not exported to '",
                                                      requester, "'"));
    }
  }
  const v1::RegionSpec& spec = (*region)->spec();
  v1::RegionLease lease;
  lease.set_region_id(region_id);
  lease.set_owner_node_id(options_.node_id);
  lease.set_holder_node_id(requester);
  lease.set_size_bytes(spec.size_bytes());
  lease.set_writable(spec.writable());
  if (spec.has_paged_kv()) *lease.mutable_paged_kv() = spec.paged_kv();
  return lease;
}

// ---- remote transfers: sender side ----

absl::StatusOr<transfers::RemotePath::Prepared> FabricImpl::Prepare(const v1::TransferSpec& spec) {
  PeerConn* peer = FindPeer(spec.dst().node_id());
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
    absl::Status hello = Introduce(peer);
    if (!hello.ok()) {
      return absl::UnavailableError(
          absl::StrCat("spec.dst.node_id: peer '", peer->node_id, "' is unreachable: ", hello.message()));
    }
  }
  v1::GetLeaseRequest request;
  request.set_region_id(spec.dst().region_id());
  request.set_requester_node_id(options_.node_id);
  v1::RegionLease lease;
  auto context = Context(absl::Seconds(5));
  KVRAIL_RETURN_IF_ERROR(FromGrpc(peer->stub->GetLease(context.get(), request, &lease),
                           "spec.dst.region_id: "));
  KVRAIL_ASSIGN_OR_RETURN(planner::RegionView view,
                   ViewOf(lease.size_bytes(), lease.writable(),
                          lease.has_paged_kv() ? &lease.paged_kv() : nullptr, "lease.paged_kv."));
  Prepared prepared;
  prepared.dst = std::make_shared<LeasedRegion>(std::move(lease), std::move(view));
  prepared.engine = this;
  prepared.max_tile_bytes = options_.slot_bytes;
  return prepared;
}

absl::StatusOr<std::vector<std::string>> FabricImpl::Begin(
    uint64_t id, const v1::TransferSpec& spec, const regions::Region& src, uint64_t tile_bytes,
    const std::shared_ptr<engine::Job>& job) {
  PeerConn* peer = FindPeer(spec.dst().node_id());
  if (peer == nullptr) return absl::NotFoundError("spec.dst.node_id: unknown peer");
  v1::BeginRemoteTransferRequest request;
  request.set_sender_node_id(options_.node_id);
  request.set_sender_boot_id(boot_id_);
  request.set_sender_transfer_id(id);
  *request.mutable_spec() = spec;
  request.mutable_source()->set_size_bytes(src.spec().size_bytes());
  if (src.spec().has_paged_kv()) *request.mutable_source()->mutable_paged_kv() = src.spec().paged_kv();
  request.set_tile_bytes(tile_bytes);
  request.set_bytes_total(job->plan().bytes_total());
  request.set_tiles_total(job->plan().num_tiles());
  v1::BeginRemoteTransferResponse response;
  auto context = Context(absl::Seconds(5));
  KVRAIL_RETURN_IF_ERROR(FromGrpc(peer->stub->BeginRemoteTransfer(context.get(), request, &response),
                           absl::StrCat("peer '", peer->node_id, "' refused the transfer: ")));
  auto out = std::make_shared<Outbound>();
  out->id = id;
  out->job = job;
  out->peer = peer;
  out->handle = response.handle();
  {
    absl::MutexLock lock(&peer->mu);
    for (uint32_t l = 0; l < peer->lanes; ++l) {
      out->nics.push_back(absl::StrCat(lanes_[l]->nic->name(), "->", peer->remote[l].nic_name));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    outbound_[job.get()] = out;
  }
  return out->nics;
}

void FabricImpl::StartControl(std::unique_ptr<grpc::Service> service) {
  service_ = std::move(service);
  control_ = std::thread([this] { ControlLoop(); });
}

void FabricImpl::ControlLoop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !control_queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (control_queue_.empty()) return;
      task = std::move(control_queue_.front());
      control_queue_.pop_front();
    }
    task();
  }
}

void FabricImpl::SendEnd(const std::shared_ptr<Outbound>& out, bool end, const absl::Status& why) {
  auto context = Context(absl::Seconds(2));
  v1::EndRemoteTransferResponse response;
  grpc::Status status;
  if (end) {
    v1::EndRemoteTransferRequest request;
    request.set_sender_node_id(options_.node_id);
    request.set_handle(out->handle);
    request.set_sender_transfer_id(out->id);
    status = out->peer->stub->EndRemoteTransfer(context.get(), request, &response);
  } else {
    v1::AbortRemoteTransferRequest request;
    request.set_sender_node_id(options_.node_id);
    request.set_handle(out->handle);
    request.set_sender_transfer_id(out->id);
    request.set_error_code(static_cast<int32_t>(why.code()));
    request.set_error_message(std::string(why.message()));
    status = out->peer->stub->AbortRemoteTransfer(context.get(), request, &response);
  }
  if (!status.ok()) {
    spdlog::info("fabric: {} of transfer {} on '{}' not delivered: {}", end ? "end" : "abort",
                 out->id, out->peer->node_id, status.error_message());
  }
}

// ---- remote transfers: receiver side ----

absl::StatusOr<uint32_t> FabricImpl::OnBegin(const v1::BeginRemoteTransferRequest& request) {
  PeerConn* peer = FindPeer(request.sender_node_id());
  if (peer == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "node '", request.sender_node_id(), "' is not in this daemon's peer directory"));
  }
  const v1::TransferSpec& spec = request.spec();
  const uint64_t region_id = spec.dst().region_id();
  KVRAIL_ASSIGN_OR_RETURN(v1::RegionLease lease, OnGetLease(region_id, request.sender_node_id()));
  auto dst = regions_->Get(region_id);
  if (!dst.ok()) return absl::NotFoundError(absl::StrCat("spec.dst.region_id: ", dst.status().message()));
  const v1::RemoteSource& source = request.source();
  KVRAIL_ASSIGN_OR_RETURN(planner::RegionView src_view,
                   ViewOf(source.size_bytes(), false,
                          source.has_paged_kv() ? &source.paged_kv() : nullptr, "source.paged_kv."));
  planner::PlanOptions plan_options;
  plan_options.tile_bytes = request.tile_bytes();
  KVRAIL_ASSIGN_OR_RETURN(planner::Plan plan,
                   planner::MakePlan(spec, src_view, (*dst)->view(), plan_options));
  if (plan.bytes_total() != request.bytes_total() || plan.num_tiles() != request.tiles_total()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plans differ: the receiver's has ", plan.bytes_total(), " bytes in ", plan.num_tiles(),
        " tiles, the sender's ", request.bytes_total(), " in ", request.tiles_total()));
  }
  if (plan.header().tile_bytes > options_.slot_bytes) {
    return absl::InvalidArgumentError("tile_bytes: larger than this daemon's staging slots");
  }
  {
    absl::MutexLock lock(&peer->mu);
    if (!peer->introduced || peer->boot_id != request.sender_boot_id()) {
      return absl::FailedPreconditionError("say hello first (unknown or changed boot id)");
    }
  }
  auto in = std::make_shared<Inbound>(std::move(plan));
  in->peer = peer->index;
  in->sender_transfer_id = request.sender_transfer_id();
  in->sender_node = peer->node_id;
  in->dst = *std::move(dst);
  {
    absl::MutexLock lock(&in->mu);
    in->applied.assign(in->plan.num_tiles(), false);
  }
  {
    // This node's record of it: listed, waited on and watched here too.
    absl::ReaderMutexLock sink_lock(&sink_mu_);
    if (sink_ != nullptr) {
      v1::RegionLease source_lease;
      source_lease.set_region_id(spec.src().region_id());
      source_lease.set_owner_node_id(request.sender_node_id());
      source_lease.set_holder_node_id(options_.node_id);
      source_lease.set_size_bytes(source.size_bytes());
      if (source.has_paged_kv()) *source_lease.mutable_paged_kv() = source.paged_kv();
      KVRAIL_ASSIGN_OR_RETURN(transfers::InboundSink::Admitted admitted,
                       sink_->BeginInbound(spec, in->plan,
                                           std::make_shared<LeasedRegion>(source_lease, src_view,
                                                                          "source"),
                                           in->dst, in->sender_node, in->sender_transfer_id));
      in->local_id = admitted.id;
      in->job = std::move(admitted.job);
    }
  }
  absl::MutexLock lock(&mu_);
  if (inbound_.size() >= 60000) {
    EndInboundRecord(*in, absl::ResourceExhaustedError("too many inbound transfers"));
    return absl::ResourceExhaustedError("too many inbound transfers");
  }
  while (next_handle_ == 0 || inbound_.count(next_handle_)) next_handle_ = (next_handle_ + 1) & 0xffff;
  in->handle = next_handle_;
  next_handle_ = (next_handle_ + 1) & 0xffff;
  inbound_[in->handle] = in;
  spdlog::info("fabric: inbound transfer {} from '{}' into region {}: {} bytes, {} tiles (handle {})",
               in->sender_transfer_id, in->sender_node, region_id, in->plan.bytes_total(),
               in->plan.num_tiles(), in->handle);
  return in->handle;
}

absl::StatusOr<uint32_t> FabricImpl::OnEnd(const std::string& sender, uint32_t handle, bool abort,
                                           const std::string& why) {
  PeerConn* peer = FindPeer(sender);
  std::shared_ptr<Inbound> in;
  {
    absl::MutexLock lock(&mu_);
    auto it = inbound_.find(handle);
    if (peer == nullptr || it == inbound_.end() || it->second->peer != peer->index) {
      return absl::NotFoundError(absl::StrCat("handle: no inbound transfer ", handle, " from '",
                                              sender, "'"));
    }
    in = it->second;
    inbound_.erase(it);
  }
  uint32_t applied = 0;
  {
    absl::MutexLock lock(&in->mu);
    applied = in->applied_count;
  }
  if (abort) {
    spdlog::info("fabric: inbound transfer {} from '{}' aborted after {} of {} tiles: {}",
                 in->sender_transfer_id, sender, applied, in->plan.num_tiles(), why);
    EndInboundRecord(*in, absl::UnavailableError(absl::StrCat("aborted by the sender '", sender,
                                                              "': ", why)));
  } else if (applied < in->plan.num_tiles()) {
    EndInboundRecord(*in, absl::DataLossError(absl::StrCat(
                              "the sender '", sender, "' ended the transfer after ", applied,
                              " of ", in->plan.num_tiles(), " tiles")));
  }
  return applied;
}

void FabricImpl::EndInboundRecord(Inbound& in, const absl::Status& why) {
  {
    absl::MutexLock lock(&in.mu);
    if (in.ended || in.job == nullptr) return;
    in.ended = true;
  }
  absl::ReaderMutexLock sink_lock(&sink_mu_);
  if (sink_ != nullptr) sink_->EndInbound(in.local_id, why);
}

void FabricImpl::SetInboundSink(transfers::InboundSink* sink) {
  absl::MutexLock lock(&sink_mu_);
  sink_ = sink;
}

absl::StatusOr<std::unique_ptr<Fabric>> Fabric::Create(const FabricOptions& options,
                                                       regions::RegionTable* regions,
                                                       directory::Directory* directory) {
  auto fabric = std::make_unique<FabricImpl>(options, regions, directory);
  KVRAIL_RETURN_IF_ERROR(fabric->Init());
  fabric->StartControl(std::make_unique<PeerServiceImpl>(fabric.get()));
  return std::unique_ptr<Fabric>(std::move(fabric));
}

}  // namespace kvrail::fabric

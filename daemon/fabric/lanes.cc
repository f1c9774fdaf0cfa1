#include "daemon/fabric/lanes.h"

#include <sys/random.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "daemon/fabric/imm_data.h"
#include "daemon/fabric/tile_copy.h"
#include "spdlog/spdlog.h"

namespace kvrail::fabric {

absl::Status Lanes::CheckOptions(const FabricOptions& options) {
  if (options.slots == 0 || options.slots > 256) {
    return absl::InvalidArgumentError("fabric.slots: must be in [1, 256]");
  }
  if (options.slot_bytes < 4096 || options.slot_bytes > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError("fabric.slot_bytes: must be in [4 KiB, 1 GiB]");
  }
  if (options.nic_addresses.empty()) {
    return absl::InvalidArgumentError("fabric.nics: no NIC address configured");
  }
  return absl::OkStatus();
}

namespace {

// 64 random bits from the kernel (a registration key, a nonce start); never 0.
uint64_t RandomKey() {
  uint64_t key = 0;
  while (key == 0) {
    if (getrandom(&key, sizeof(key), 0) != static_cast<ssize_t>(sizeof(key))) key = 0;
  }
  return key;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Lanes>> Lanes::Create(const FabricOptions& options,
                                                     PeerTable* peers) {
  KVRAIL_RETURN_IF_ERROR(CheckOptions(options));
  std::unique_ptr<Lanes> lanes(new Lanes(options, peers));
  for (size_t i = 0; i < options.nic_addresses.size(); ++i) {
    auto lane = std::make_unique<Lane>();
    lane->index = static_cast<uint32_t>(i);
    Nic::Options nic_options;
    nic_options.provider = options.provider;
    nic_options.address = options.nic_addresses[i];
    const bool mapped = i < options.lane_nics.size() && !options.lane_nics[i].empty();
    nic_options.name = absl::StrCat(mapped ? options.lane_nics[i] : absl::StrCat("nic", i), "@",
                                    options.nic_addresses[i]);
    KVRAIL_ASSIGN_OR_RETURN(lane->nic, Nic::Open(nic_options));
    KVRAIL_ASSIGN_OR_RETURN(lane->ring, CommandRing::Create(256));
    lane->staging.resize(PeerTable::kMaxPeers);
    lane->next_nonce = RandomKey() | 1;
    lanes->lanes_.push_back(std::move(lane));
  }
  return lanes;
}

namespace {

// Registers [start, start + size) on `nic` under a random key (unique in the domain: retried on a
// clash). A provider that picks its own keys (FI_MR_PROV_KEY) is warned about: its keys may be
// guessable.
absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterUnderRandomKey(Nic* nic, uint8_t* start,
                                                                     uint64_t size, uint64_t access,
                                                                     const std::string& peer) {
  absl::StatusOr<std::unique_ptr<MemoryRegion>> mr;
  uint64_t requested = 0;
  for (int attempt = 0; attempt < 8; ++attempt) {
    requested = RandomKey();
    mr = nic->RegisterMemory(start, size, requested, access);
    if (mr.status().code() != absl::StatusCode::kAlreadyExists) break;
  }
  if (!mr.ok()) return mr.status();
  if ((access & FI_REMOTE_WRITE) != 0 && (*mr)->key() != requested) {
    spdlog::warn(
        "fabric: {} picked its own registration keys (peer '{}' has key {}): a peer's "
        "receive range is only as private as the provider's keys",
        nic->name(), peer, (*mr)->key());
  }
  return mr;
}

}  // namespace

absl::Status Lanes::AddPeer(PeerConn* peer) {
  const uint64_t bytes = PerPeerBytes();
  const uint64_t send_bytes = uint64_t{options_.slots} * options_.slot_bytes;
  std::vector<std::unique_ptr<PeerStaging>> made;
  for (const auto& lane : lanes_) {
    auto st = std::make_unique<PeerStaging>();
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "fabric: staging of ", bytes, " bytes for peer '", peer->node_id, "' on ",
          lane->nic->name(), " (fabric.slots x fabric.slot_bytes x 2 per peer and NIC)"));
    }
    mlock(mem, bytes);  // pinned bounce buffers where RLIMIT_MEMLOCK allows; best effort
    st->memory = std::unique_ptr<uint8_t, Munmapper>(static_cast<uint8_t*>(mem), Munmapper{bytes});
    st->bytes = bytes;
    // GPU regions are packed and unpacked by the copy engines straight from/into the slots.
    st->pin = PinForGpus(st->memory.get(), bytes);
    // The whole block for local access only; the receive slots + credit words for the peer's
    // remote writes under a random key.
    KVRAIL_ASSIGN_OR_RETURN(st->local_mr,
                            RegisterUnderRandomKey(lane->nic.get(), st->memory.get(), bytes,
                                                   FI_WRITE | FI_READ, peer->node_id));
    KVRAIL_ASSIGN_OR_RETURN(
        st->peer_mr, RegisterUnderRandomKey(
                         lane->nic.get(), st->memory.get() + send_bytes, bytes - send_bytes,
                         FI_REMOTE_WRITE | FI_REMOTE_READ | FI_WRITE | FI_READ, peer->node_id));
    st->contexts.resize(options_.slots);
    for (uint32_t s = 0; s < options_.slots; ++s) {
      OpContext& c = st->contexts[s];
      c.peer = peer->index;
      c.lane = lane->index;
      c.slot = s;
    }
    made.push_back(std::move(st));
  }
  // All lanes made: install (nothing reads entry peer->index before the peer is published; a
  // reused index's former staging was released when its quarantine ended, ReleasePeer).
  for (size_t l = 0; l < lanes_.size(); ++l) lanes_[l]->staging[peer->index] = std::move(made[l]);
  absl::MutexLock lock(&peer->mu);
  for (const auto& lane : lanes_) {
    peer->credits.push_back(
        std::make_unique<SlotCredits>(options_.slots, CreditWords(lane->index, peer->index)));
    peer->owners.emplace_back(options_.slots);
    peer->consumed.emplace_back(options_.slots, 0);
    peer->sealed.emplace_back(options_.slots, 0);
    peer->remote.emplace_back();
  }
  return absl::OkStatus();
}

void Lanes::ReleasePeer(uint32_t index) {
  if (index >= PeerTable::kMaxPeers) return;
  for (auto& lane : lanes_) lane->staging[index].reset();  // deregistered, unpinned, unmapped
}

Lanes::~Lanes() {
  Stop();
  for (auto& lane : lanes_) lane->staging.clear();  // deregistered before the domain closes
}

void Lanes::StartProxies(CreditSink* sender, ArrivalSink* receiver) {
  sender_ = sender;
  receiver_ = receiver;
  for (auto& lane : lanes_) {
    Lane* l = lane.get();
    l->proxy = std::thread([this, l] { ProxyLoop(l); });
  }
}

void Lanes::Stop() {
  stop_.store(true);
  for (auto& lane : lanes_) {
    lane->nic->Signal();
    if (lane->proxy.joinable()) lane->proxy.join();
  }
}

uint64_t Lanes::PerPeerBytes() const {
  const uint64_t credit_bytes = (uint64_t{options_.slots} * 8 + 4095) / 4096 * 4096;
  return 2 * uint64_t{options_.slots} * options_.slot_bytes + credit_bytes;
}
uint8_t* Lanes::SendSlot(uint32_t lane, uint32_t peer, uint32_t slot) const {
  return lanes_[lane]->staging[peer]->memory.get() + uint64_t{slot} * options_.slot_bytes;
}
uint8_t* Lanes::RecvSlot(uint32_t lane, uint32_t peer, uint32_t slot) const {
  return SendSlot(lane, peer, 0) + (uint64_t{options_.slots} + slot) * options_.slot_bytes;
}
uint64_t* Lanes::CreditWords(uint32_t lane, uint32_t peer) const {
  return reinterpret_cast<uint64_t*>(SendSlot(lane, peer, 0) +
                                     2 * uint64_t{options_.slots} * options_.slot_bytes);
}

void Lanes::PostCommand(uint32_t lane, const kernels::NicCommand& cmd) {
  Lane& l = *lanes_[lane];
  while (!l.ring->TryPush(cmd)) std::this_thread::yield();
  l.nic->Signal();
}

void Lanes::QueueCredit(uint32_t lane, const CreditOp& op) {
  Lane& l = *lanes_[lane];
  {
    absl::MutexLock lock(&l.mu);
    l.credits.push_back(op);
  }
  l.nic->Signal();
}

std::string Lanes::Describe() const {
  std::vector<std::string> names;
  for (const auto& lane : lanes_) names.push_back(lane->nic->name());
  return absl::StrCat("fabric: ", lanes_.empty() ? options_.provider : lanes_[0]->nic->provider(),
                      ", ", lanes_.size(), " NICs (", absl::StrJoin(names, ", "), "), ",
                      options_.slots, " x ", options_.slot_bytes >> 10, " KiB slots per peer, ",
                      peers_->size(), " peers");
}

// ---- the proxy: one per NIC ----

bool Lanes::PeerUp(uint32_t peer) const {
  PeerConn* p = peers_->at(peer);
  absl::MutexLock lock(&p->mu);
  return p->up;
}

void Lanes::ProxyLoop(Lane* lane) {
  // Commands and credits the provider answered -FI_EAGAIN (its queue to that peer is full, or
  // the connection to a dead peer is being retried): set aside in order and retried each round,
  // so one unreachable peer never holds up the others' tiles and credits (head-of-line). A
  // peer's later ones queue behind its set-aside ones; once the peer is down they are dropped
  // (a write: failed to the sender).
  std::deque<kernels::NicCommand> deferred;
  std::deque<CreditOp> deferred_credits;
  std::vector<bool> waiting(PeerTable::kMaxPeers), waiting_credit(PeerTable::kMaxPeers);
  uint32_t inflight = 0;
  fi_cq_data_entry entries[32];
  while (!stop_.load()) {
    bool busy = false;
    std::fill(waiting.begin(), waiting.end(), false);
    std::fill(waiting_credit.begin(), waiting_credit.end(), false);
    // Set-aside commands first, each once, in order.
    for (size_t k = deferred.size(); k > 0; --k) {
      const kernels::NicCommand cmd = deferred.front();
      deferred.pop_front();
      if (!PeerUp(cmd.peer)) {
        busy = true;
        sender_->OnWriteFailed(cmd.peer, lane->index, cmd.slot,
                               absl::UnavailableError("the peer is down (write never posted)"));
        continue;
      }
      const ssize_t rc = waiting[cmd.peer] || inflight >= options_.max_inflight
                             ? -FI_EAGAIN
                             : PostWrite(lane, cmd);
      if (rc == -FI_EAGAIN) {
        waiting[cmd.peer] = true;
        deferred.push_back(cmd);
        continue;
      }
      busy = true;
      if (rc == 0) ++inflight;
    }
    // Commands from the ring, in batches, up to the in-flight cap.
    for (int batch = 0; batch < 32 && inflight < options_.max_inflight; ++batch) {
      const std::optional<kernels::NicCommand> cmd = lane->ring->Pop();
      if (!cmd) break;
      busy = true;
      const ssize_t rc = waiting[cmd->peer] ? -FI_EAGAIN : PostWrite(lane, *cmd);
      if (rc == -FI_EAGAIN) {
        waiting[cmd->peer] = true;
        deferred.push_back(*cmd);
        continue;
      }
      if (rc == 0) ++inflight;
    }
    // Credits owed to senders: set-aside ones first, then the queue.
    for (size_t k = deferred_credits.size(); k > 0; --k) {
      const CreditOp op = deferred_credits.front();
      deferred_credits.pop_front();
      if (!PeerUp(op.peer)) continue;  // its transfers are gone with it
      const ssize_t rc = waiting_credit[op.peer] ? -FI_EAGAIN : PostCredit(lane, op);
      if (rc == -FI_EAGAIN) {
        waiting_credit[op.peer] = true;
        deferred_credits.push_back(op);
        continue;
      }
      busy = true;
    }
    for (int batch = 0; batch < 32; ++batch) {
      CreditOp op;
      {
        absl::MutexLock lock(&lane->mu);
        if (lane->credits.empty()) break;
        op = lane->credits.front();
        lane->credits.pop_front();
      }
      busy = true;
      const ssize_t rc = waiting_credit[op.peer] ? -FI_EAGAIN : PostCredit(lane, op);
      if (rc == -FI_EAGAIN) {
        waiting_credit[op.peer] = true;
        deferred_credits.push_back(op);
      }
    }
    // Set-aside work only: a short wait (1 ms) between retries rather than a spin.
    const bool retrying = !deferred.empty() || !deferred_credits.empty();
    // Reserved, unconsumed ring numbers: a pack kernel will publish them without
    // waking anyone, so poll (no sleep) while there are any.
    const bool awaited = busy || inflight > 0 || lane->ring->Pending() > 0;
    ssize_t n = awaited ? lane->nic->ReadCompletions(entries, 32)
                        : lane->nic->WaitCompletions(entries, 32, retrying ? 1 : 50);
    if (n == -FI_EAVAIL) {
      void* context = nullptr;
      absl::Status error = lane->nic->ReadError(&context);
      if (context != nullptr) {
        if (inflight > 0) --inflight;
        auto* op = static_cast<OpContext*>(context);
        spdlog::warn("fabric: write on {} failed: {}", lane->nic->name(), error.ToString());
        sender_->OnWriteFailed(op->peer, op->lane, op->slot, error);
      } else {
        spdlog::warn("fabric: {}: {}", lane->nic->name(), error.ToString());
      }
      continue;
    }
    if (n < 0) {
      spdlog::warn("fabric: fi_cq_read on {}: {}", lane->nic->name(),
                   FiError("fi_cq_read", n).ToString());
      continue;
    }
    for (ssize_t i = 0; i < n; ++i) {
      const fi_cq_data_entry& e = entries[i];
      if (e.flags & FI_REMOTE_CQ_DATA) {
        if (e.data & kCreditBit) {
          sender_->OnCredit(lane->index, ImmIndex(e.data), ImmSlot(e.data), ImmTile(e.data),
                            (e.data & kNotAppliedBit) == 0);
        } else {
          receiver_->OnArrival(Arrival{lane->index, ImmIndex(e.data), ImmHandle(e.data),
                                       ImmSlot(e.data), ImmTile(e.data), e.len});
        }
      } else if (e.op_context != nullptr && inflight > 0) {
        --inflight;  // a local write completed; its slot stays owned until the peer's credit
      }
    }
  }
}

namespace {

// The peer's endpoint on `lane`, the index it knows this daemon by and that index's generation
// there, read together.
struct RemoteView {
  PeerConn::Remote remote;
  uint32_t index_at_peer = 0;
  uint32_t generation_at_peer = 0;
};
RemoteView RemoteOn(PeerConn* peer, uint32_t lane) {
  absl::MutexLock lock(&peer->mu);
  return {peer->remote[lane], peer->index_at_peer, peer->generation_at_peer};
}

}  // namespace

ssize_t Lanes::PostWrite(Lane* lane, const kernels::NicCommand& cmd) {
  PeerConn* peer = peers_->at(cmd.peer);
  if (peer->retired.load(std::memory_order_acquire)) {
    // A command left behind for a peer that was retired (its transfers failed): never posted.
    sender_->OnWriteFailed(peer->index, lane->index, cmd.slot,
                           absl::UnavailableError("the peer left (write never posted)"));
    return -FI_ENOTCONN;
  }
  const auto [remote, index_at_peer, generation_at_peer] = RemoteOn(peer, lane->index);
  PeerStaging* const st = lane->staging[peer->index].get();
  OpContext* ctx = &st->contexts[cmd.slot];
  // The seal after the tile (the sender reserved kTileSealBytes of the slot for it).
  uint8_t* const staging = SendSlot(lane->index, peer->index, cmd.slot);
  TileSeal seal;
  seal.key = remote.key;
  seal.nonce = lane->next_nonce;
  seal.handle = cmd.remote_handle;
  seal.tile = cmd.tile;
  seal.generation = generation_at_peer;
  std::memcpy(staging + cmd.bytes, &seal, sizeof(seal));
  const ssize_t rc = lane->nic->WriteData(
      staging, uint64_t{cmd.bytes} + kTileSealBytes, st->local_mr->desc(),
      TileImm(index_at_peer, cmd.remote_handle, cmd.slot, cmd.tile), remote.addr,
      remote.recv_base + uint64_t{cmd.slot} * options_.slot_bytes, remote.key, ctx);
  if (rc == 0) lane->next_nonce += 2;  // odd, never 0
  if (rc != 0 && rc != -FI_EAGAIN) {
    sender_->OnWriteFailed(peer->index, lane->index, cmd.slot, FiError("fi_writedata", rc));
  }
  return rc;
}

ssize_t Lanes::PostCredit(Lane* lane, const CreditOp& op) {
  PeerConn* peer = peers_->at(op.peer);
  if (peer->retired.load(std::memory_order_acquire)) return 0;  // it left: owed nothing
  const RemoteView view = RemoteOn(peer, lane->index);  // a credit carries no seal: no generation
  const PeerConn::Remote& remote = view.remote;
  const ssize_t rc = lane->nic->InjectWriteData(
      &op.value, sizeof(op.value), CreditImm(view.index_at_peer, op.slot, op.tile, op.applied),
      remote.addr, remote.credit_base + uint64_t{op.slot} * 8, remote.key);
  if (rc != 0 && rc != -FI_EAGAIN) {
    spdlog::warn("fabric: credit to '{}' lost: {}", peer->node_id,
                 FiError("fi_inject_writedata", rc).ToString());
  }
  return rc;
}

}  // namespace kvrail::fabric

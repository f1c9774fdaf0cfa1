#include "daemon/directory/etcd_directory.h"

#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/logging.h"
#include "daemon/directory/backoff.h"
#include "daemon/directory/node_record.h"
#include "spdlog/spdlog.h"

namespace kvrail::directory {
namespace {

// Thread contract: peers, status and session flags are guarded by mu_; the session thread owns
// the client's lease and the backoff; the watch reader thread (one per session) applies events
// under mu_; listener_ is guarded by listener_mu_ and called without mu_ held.
class EtcdDirectory final : public Directory {
 public:
  EtcdDirectory(EtcdDirectoryOptions options, std::unique_ptr<EtcdClient> client)
      : options_(std::move(options)),
        client_(std::move(client)),
        self_key_(options_.prefix + options_.self),
        keepalive_interval_(options_.keepalive_interval > absl::ZeroDuration()
                                ? options_.keepalive_interval
                                : absl::Seconds(options_.ttl_s) / 3),
        backoff_(options_.backoff_initial, options_.backoff_max, 0.2, options_.backoff_uniform01) {
    for (const auto& [node, address] : options_.static_peers) {
      if (node == options_.self) continue;
      Peer peer;
      peer.node_id = node;
      peer.address = address;
      peer.is_static = true;
      peers_[node] = std::move(peer);
    }
    since_ = options_.clock->Now();
    reason_ = "connecting to etcd";
  }

  ~EtcdDirectory() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (watch_ != nullptr) watch_->Cancel();
    }
    if (thread_.joinable()) thread_.join();
    if (options_.revoke_on_close && lease_ != 0) {
      absl::Status revoked = client_->LeaseRevoke(lease_);
      if (!revoked.ok()) spdlog::info("etcd directory: lease not revoked ({})", revoked.ToString());
    }
  }

  void Start() {
    thread_ = std::thread([this] { SessionLoop(); });
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&first_attempt_done_), options_.initial_wait);
  }

  std::vector<Peer> Peers() const override {
    absl::MutexLock lock(&mu_);
    std::vector<Peer> out;
    out.reserve(peers_.size());
    for (const auto& [node, peer] : peers_) out.push_back(peer);
    return out;
  }

  absl::StatusOr<Peer> Lookup(const std::string& node_id) const override {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(node_id);
    if (it == peers_.end()) {
      return absl::NotFoundError(absl::StrCat("node '", node_id,
                                              "' is not in this daemon's peer directory (config "
                                              "peers and etcd prefix ",
                                              options_.prefix, ")"));
    }
    return it->second;
  }

  void MarkUp(const std::string& node_id, absl::Time when, uint64_t boot_id) override {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(node_id);
    if (it == peers_.end()) return;
    Peer& peer = it->second;
    // etcd's word wins: a peer whose record vanished stays down until it registers again.
    if (!peer.is_static && !peer.registered) return;
    peer.state = PeerState::kUp;
    peer.last_seen = when;
    peer.boot_id = boot_id;
  }

  void MarkDown(const std::string& node_id) override {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(node_id);
    if (it != peers_.end()) it->second.state = PeerState::kDown;
  }

  std::vector<v1::PeerInfo> List() const override {
    std::vector<v1::PeerInfo> out;
    for (const Peer& peer : Peers()) out.push_back(ToPeerInfo(peer));
    return out;
  }

  v1::DirectoryStatus Status() const override {
    absl::MutexLock lock(&mu_);
    return StatusLocked();
  }

  void SetStateListener(std::function<void(const v1::DirectoryStatus&)> listener) override {
    absl::MutexLock lock(&listener_mu_);
    listener_ = std::move(listener);
  }

 private:
  v1::DirectoryStatus StatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::DirectoryStatus status;
    status.set_kind(v1::DIRECTORY_KIND_ETCD);
    status.set_state(ok_ ? v1::DIRECTORY_STATE_OK : v1::DIRECTORY_STATE_DEGRADED);
    if (!ok_) status.set_reason(reason_);
    status.set_last_error(last_error_);
    if (last_error_at_ != absl::InfinitePast()) {
      status.set_last_error_unix_us(absl::ToUnixMicros(last_error_at_));
    }
    status.set_since_unix_us(absl::ToUnixMicros(since_));
    for (const std::string& e : options_.endpoints) status.add_endpoints(e);
    status.set_lease_id(ok_ ? current_lease_ : 0);
    status.set_registrations(registrations_);
    uint32_t registered = 0;
    for (const auto& [node, peer] : peers_) registered += peer.registered ? 1 : 0;
    status.set_peers(static_cast<uint32_t>(peers_.size()));
    status.set_registered_peers(registered);
    return status;
  }

  // Sets ok/degraded; tells the listener when the state changed.
  void SetState(bool ok, const std::string& reason, const absl::Status& error) {
    v1::DirectoryStatus snapshot;
    bool changed;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = options_.clock->Now();
      if (!error.ok()) {
        last_error_ = error.ToString();
        last_error_at_ = now;
      }
      changed = ok != ok_;
      if (changed) since_ = now;
      ok_ = ok;
      reason_ = ok ? "" : reason;
      snapshot = StatusLocked();
    }
    if (!changed) return;
    if (ok) {
      spdlog::info("etcd directory: ok ({}, lease {:x}, {} peers)", client_->Describe(),
                   snapshot.lease_id(), snapshot.peers());
    } else {
      spdlog::warn("etcd directory: degraded: {} (known peers keep working; retrying)", reason);
    }
    absl::MutexLock lock(&listener_mu_);
    if (listener_) listener_(snapshot);
  }

  void SessionLoop() {
    while (true) {
      const absl::Status status = RunSession();
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) {
          first_attempt_done_ = true;
          return;
        }
      }
      std::string reason;
      if (status.code() == absl::StatusCode::kNotFound) {
        reason = absl::StrCat("lease lost, registering again: ", status.message());
      } else if (status.code() == absl::StatusCode::kUnauthenticated ||
                 status.code() == absl::StatusCode::kPermissionDenied) {
        // The message names the config keys (etcd.username, etcd.password_file).
        reason = absl::StrCat("etcd refused this daemon: ", status.message());
      } else {
        reason = absl::StrCat("etcd unreachable: ", status.message());
      }
      SetState(false, reason, status);
      {
        absl::MutexLock lock(&mu_);
        first_attempt_done_ = true;
      }
      const absl::Duration delay = backoff_.Next();
      absl::MutexLock lock(&mu_);
      const absl::Time until = absl::Now() + delay;
      while (!stopping_ && absl::Now() < until) cv_.WaitWithTimeout(&mu_, until - absl::Now());
      if (stopping_) return;
    }
  }

  // One session: lease, record, range, watch, then keep-alives until something fails (the
  // error) or the directory stops (OK).
  absl::Status RunSession() {
    absl::StatusOr<int64_t> granted = client_->LeaseGrant(options_.ttl_s);
    if (!granted.ok()) return granted.status();
    const int64_t old_lease = lease_;
    lease_ = *granted;
    v1::DirectoryNodeRecord record = options_.record;
    record.set_registered_unix_us(options_.clock->NowUnixMicros());
    const std::string value = EncodeNodeRecord(record);
    absl::StatusOr<int64_t> put = client_->Put(self_key_, value, lease_);
    if (!put.ok()) return put.status();
    if (old_lease != 0 && old_lease != lease_) {
      // Best effort: it may be gone already (it expired while etcd was away).
      if (absl::Status revoked = client_->LeaseRevoke(old_lease); !revoked.ok()) {
        KVRAIL_DEBUG("etcd directory: old lease {:x} not revoked: {}", old_lease,
                     revoked.ToString());
      }
    }
    {
      absl::MutexLock lock(&mu_);
      self_value_ = value;
      self_lease_ = lease_;
      self_wrong_ = false;
    }
    absl::StatusOr<EtcdRange> range = client_->RangePrefix(options_.prefix);
    if (!range.ok()) return range.status();
    ApplySnapshot(range->kvs);
    absl::StatusOr<std::unique_ptr<EtcdWatch>> watch =
        client_->WatchPrefix(options_.prefix, range->revision + 1);
    if (!watch.ok()) return watch.status();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::OkStatus();
      watch_ = watch->get();
      watch_error_ = absl::OkStatus();
      current_lease_ = lease_;
      ++registrations_;
    }
    std::thread reader([this, w = watch->get()] { WatchLoop(w); });
    SetState(true, "", absl::OkStatus());
    backoff_.Reset();
    {
      absl::MutexLock lock(&mu_);
      first_attempt_done_ = true;
    }

    absl::Status result;
    absl::Time next_keepalive = absl::Now() + keepalive_interval_;
    while (true) {
      bool reput = false;
      {
        absl::MutexLock lock(&mu_);
        while (!stopping_ && watch_error_.ok() && !self_wrong_ && absl::Now() < next_keepalive) {
          cv_.WaitWithTimeout(&mu_, next_keepalive - absl::Now());
        }
        if (stopping_) break;
        if (!watch_error_.ok()) {
          result = watch_error_;
          break;
        }
        reput = self_wrong_;
        self_wrong_ = false;
      }
      if (reput) {
        // Deleted, or overwritten (another value, another lease or none: a lease-less record
        // would never expire, and its address would cut this node off while it says "ok").
        spdlog::warn(
            "etcd directory: this node's record {} was deleted or overwritten; putting "
            "it again",
            self_key_);
        absl::StatusOr<int64_t> again = client_->Put(self_key_, value, lease_);
        if (!again.ok()) {
          result = again.status();
          break;
        }
      }
      if (absl::Now() >= next_keepalive) {
        absl::StatusOr<int64_t> ttl = client_->LeaseKeepAlive(lease_);
        if (!ttl.ok()) {
          result = ttl.status();
          break;
        }
        next_keepalive = absl::Now() + keepalive_interval_;
      }
    }
    watch->get()->Cancel();
    reader.join();
    absl::MutexLock lock(&mu_);
    watch_ = nullptr;
    current_lease_ = 0;
    return result;
  }

  void WatchLoop(EtcdWatch* watch) {
    while (true) {
      absl::StatusOr<std::vector<EtcdEvent>> events = watch->Next();
      absl::MutexLock lock(&mu_);
      if (!events.ok()) {
        if (watch_error_.ok()) watch_error_ = events.status();
        if (watch_error_.ok()) watch_error_ = absl::UnavailableError("watch ended");
        cv_.Signal();
        return;
      }
      for (const EtcdEvent& event : *events) ApplyEventLocked(event);
      cv_.Signal();
    }
  }

  void ApplySnapshot(const std::vector<EtcdKv>& kvs) {
    absl::MutexLock lock(&mu_);
    std::set<std::string> present;
    bool self_found = false;
    for (const EtcdKv& kv : kvs) {
      const std::string node = NodeIdFromKey(options_.prefix, kv.key);
      if (node.empty()) continue;
      if (node == options_.self) {
        self_found = true;
        CheckSelfLocked(kv);
        continue;
      }
      if (UpsertLocked(kv)) present.insert(node);
    }
    if (!self_found) self_wrong_ = true;
    for (auto& [node, peer] : peers_) {
      if (peer.registered && present.count(node) == 0) LeftLocked(&peer);
    }
  }

  void ApplyEventLocked(const EtcdEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string node = NodeIdFromKey(options_.prefix, event.kv.key);
    if (node.empty()) return;
    if (node == options_.self) {
      if (event.type == EtcdEvent::Type::kDelete) {
        self_wrong_ = true;
      } else {
        CheckSelfLocked(event.kv);
      }
      return;
    }
    if (event.type == EtcdEvent::Type::kPut) {
      if (UpsertLocked(event.kv)) return;
      // The peer's record was overwritten with one that does not count (no lease, or it does
      // not decode): its own record is gone.
      auto it = peers_.find(node);
      if (it != peers_.end() && it->second.registered) LeftLocked(&it->second);
      return;
    }
    auto it = peers_.find(node);
    if (it != peers_.end() && it->second.registered) LeftLocked(&it->second);
  }

  // This node's own record as etcd has it: anything but this session's value under this
  // session's lease is repaired (put again) by the session thread.
  void CheckSelfLocked(const EtcdKv& kv) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (kv.lease != self_lease_ || kv.value != self_value_) self_wrong_ = true;
  }

  // A record put under the prefix: the peer is (again) a member. False when it does not count:
  // it has no lease (every daemon puts its record under a lease; one without would outlive its
  // node and cannot be told from a forgery) or does not decode.
  bool UpsertLocked(const EtcdKv& kv) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (kv.lease == 0) {
      spdlog::warn("etcd directory: ignoring the record {}: it has no lease", kv.key);
      return false;
    }
    absl::StatusOr<v1::DirectoryNodeRecord> record =
        DecodeNodeRecord(options_.prefix, kv.key, kv.value);
    if (!record.ok()) {
      spdlog::warn("etcd directory: ignoring a record: {}", record.status().ToString());
      return false;
    }
    auto [it, inserted] = peers_.try_emplace(record->node_id());
    Peer& peer = it->second;
    if (inserted) {
      peer.node_id = record->node_id();
      peer.is_static = false;
    }
    const bool new_boot = !peer.has_record || peer.record.boot_id() != record->boot_id();
    if (!peer.registered || new_boot) {
      peer.state = PeerState::kUnknown;  // kUp-able: the fabric's next hello marks it up
      spdlog::info("etcd directory: peer '{}' registered at {} (boot {:x})", peer.node_id,
                   record->address(), record->boot_id());
    }
    if (!peer.is_static) {
      peer.address = record->address();
    } else if (peer.address != record->address()) {
      spdlog::warn(
          "etcd directory: peer '{}' registers address {} but the config says {}; "
          "using the config's",
          peer.node_id, record->address(), peer.address);
    }
    peer.registered = true;
    peer.has_record = true;
    peer.record = *std::move(record);
    return true;
  }

  void LeftLocked(Peer* peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    peer->registered = false;
    peer->state = PeerState::kDown;
    spdlog::warn(
        "etcd directory: peer '{}' left (its record is gone: lease ended or deleted); "
        "it is down",
        peer->node_id);
  }

  const EtcdDirectoryOptions options_;
  const std::unique_ptr<EtcdClient> client_;
  const std::string self_key_;
  const absl::Duration keepalive_interval_;
  // Session thread only (and the destructor after the join).
  Backoff backoff_;
  int64_t lease_ = 0;
  std::thread thread_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool first_attempt_done_ ABSL_GUARDED_BY(mu_) = false;
  EtcdWatch* watch_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status watch_error_ ABSL_GUARDED_BY(mu_);
  // This session's record of this node and its lease (CheckSelfLocked), and whether etcd holds
  // something else under its key (deleted or overwritten): the session thread puts it again.
  std::string self_value_ ABSL_GUARDED_BY(mu_);
  int64_t self_lease_ ABSL_GUARDED_BY(mu_) = 0;
  bool self_wrong_ ABSL_GUARDED_BY(mu_) = false;
  bool ok_ ABSL_GUARDED_BY(mu_) = false;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  absl::Time last_error_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time since_ ABSL_GUARDED_BY(mu_);
  int64_t current_lease_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Mutex listener_mu_;
  std::function<void(const v1::DirectoryStatus&)> listener_ ABSL_GUARDED_BY(listener_mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Directory>> CreateEtcdDirectory(EtcdDirectoryOptions options,
                                                               std::unique_ptr<EtcdClient> client) {
  if (client == nullptr) return absl::InvalidArgumentError("etcd directory: no client");
  if (options.self.empty()) return absl::InvalidArgumentError("node_id: empty");
  if (options.prefix.empty() || options.prefix.back() != '/') {
    return absl::InvalidArgumentError("etcd.prefix: must end with '/'");
  }
  if (options.ttl_s < 2) return absl::InvalidArgumentError("etcd.ttl_s: at least 2");
  auto directory = std::make_unique<EtcdDirectory>(std::move(options), std::move(client));
  directory->Start();
  return std::unique_ptr<Directory>(std::move(directory));
}

}  // namespace kvrail::directory

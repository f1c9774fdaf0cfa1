// The etcd directory's logic against an in-memory fake of the etcd client interface (keys with
// leases, revisions, watches from a revision, an outage switch), plus its record encoding and
// backoff. The real etcd is exercised by etcd_directory_live_test.
#include "daemon/directory/etcd_directory.h"

#include <catch2/catch.hpp>
#include <deque>
#include <map>
#include <optional>
#include <set>

#include "absl/synchronization/mutex.h"
#include "base/manual_clock.h"
#include "daemon/directory/backoff.h"
#include "daemon/directory/node_record.h"

namespace kvrail::directory {
namespace {

constexpr char kPrefix[] = "/kvrail/test/nodes/";

// ---- an in-memory etcd ---------------------------------------------------------------------

class FakeEtcd;

class FakeWatch final : public EtcdWatch {
 public:
  explicit FakeWatch(FakeEtcd* etcd) : etcd_(etcd) {}
  ~FakeWatch() override;
  absl::StatusOr<std::vector<EtcdEvent>> Next() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](FakeWatch* w)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return !w->queue_.empty() || w->ended_; },
        this));
    if (!queue_.empty()) {
      auto batch = std::move(queue_.front());
      queue_.pop_front();
      return batch;
    }
    return absl::UnavailableError("fake watch ended");
  }
  void Cancel() override { End(); }
  void Push(std::vector<EtcdEvent> batch) {
    absl::MutexLock lock(&mu_);
    if (!ended_) queue_.push_back(std::move(batch));
  }
  void End() {
    absl::MutexLock lock(&mu_);
    ended_ = true;
  }

 private:
  FakeEtcd* const etcd_;
  absl::Mutex mu_;
  std::deque<std::vector<EtcdEvent>> queue_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

// Thread-safe. "Admin" calls (AdminPut, ExpireLease, ...) work while it is down; client calls
// fail UNAVAILABLE then.
class FakeEtcd {
 public:
  void SetDown(bool down) {
    std::vector<FakeWatch*> watches;
    {
      absl::MutexLock lock(&mu_);
      down_ = down;
      if (down) watches.assign(watches_.begin(), watches_.end());
    }
    for (FakeWatch* w : watches) w->End();
  }
  absl::Status CheckUp() {
    absl::MutexLock lock(&mu_);
    ++calls_;
    return down_ ? absl::UnavailableError("fake etcd is down") : absl::OkStatus();
  }
  int64_t Grant() {
    absl::MutexLock lock(&mu_);
    leases_.insert(++next_lease_);
    ++grants_;
    return next_lease_;
  }
  bool LeaseAlive(int64_t lease) {
    absl::MutexLock lock(&mu_);
    ++keepalives_;
    return leases_.count(lease) != 0;
  }
  void Revoke(int64_t lease) {
    std::vector<std::string> keys;
    {
      absl::MutexLock lock(&mu_);
      leases_.erase(lease);
      for (const auto& [k, kv] : kvs_) {
        if (kv.lease == lease) keys.push_back(k);
      }
    }
    for (const std::string& k : keys) Delete(k);
  }
  int64_t Put(const std::string& key, const std::string& value, int64_t lease) {
    EtcdEvent event;
    std::vector<FakeWatch*> watches;
    int64_t revision;
    {
      absl::MutexLock lock(&mu_);
      revision = ++revision_;
      kvs_[key] = EtcdKv{key, value, revision, lease};
      event.kv = kvs_[key];
      history_.push_back(event);
      watches.assign(watches_.begin(), watches_.end());
    }
    for (FakeWatch* w : watches) w->Push({event});
    return revision;
  }
  void Delete(const std::string& key) {
    EtcdEvent event;
    std::vector<FakeWatch*> watches;
    {
      absl::MutexLock lock(&mu_);
      if (kvs_.erase(key) == 0) return;
      event.type = EtcdEvent::Type::kDelete;
      event.kv.key = key;
      event.kv.mod_revision = ++revision_;
      history_.push_back(event);
      watches.assign(watches_.begin(), watches_.end());
    }
    for (FakeWatch* w : watches) w->Push({event});
  }
  EtcdRange Range(const std::string& prefix) {
    absl::MutexLock lock(&mu_);
    EtcdRange range;
    range.revision = revision_;
    for (const auto& [k, kv] : kvs_) {
      if (k.rfind(prefix, 0) == 0) range.kvs.push_back(kv);
    }
    return range;
  }
  std::unique_ptr<EtcdWatch> Watch(int64_t start_revision) {
    auto watch = std::make_unique<FakeWatch>(this);
    absl::MutexLock lock(&mu_);
    for (const EtcdEvent& e : history_) {
      if (e.kv.mod_revision >= start_revision) watch->Push({e});
    }
    watches_.insert(watch.get());
    return watch;
  }
  void Forget(FakeWatch* watch) {
    absl::MutexLock lock(&mu_);
    watches_.erase(watch);
  }
  std::optional<EtcdKv> Get(const std::string& key) {
    absl::MutexLock lock(&mu_);
    auto it = kvs_.find(key);
    if (it == kvs_.end()) return std::nullopt;
    return it->second;
  }
  int grants() {
    absl::MutexLock lock(&mu_);
    return grants_;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  int keepalives() {
    absl::MutexLock lock(&mu_);
    return keepalives_;
  }

 private:
  absl::Mutex mu_;
  bool down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_lease_ ABSL_GUARDED_BY(mu_) = 100;
  std::set<int64_t> leases_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, EtcdKv> kvs_ ABSL_GUARDED_BY(mu_);
  std::vector<EtcdEvent> history_ ABSL_GUARDED_BY(mu_);
  std::set<FakeWatch*> watches_ ABSL_GUARDED_BY(mu_);
  int grants_ ABSL_GUARDED_BY(mu_) = 0;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int keepalives_ ABSL_GUARDED_BY(mu_) = 0;
};

FakeWatch::~FakeWatch() { etcd_->Forget(this); }

class FakeClient final : public EtcdClient {
 public:
  explicit FakeClient(std::shared_ptr<FakeEtcd> etcd) : etcd_(std::move(etcd)) {}
  absl::StatusOr<int64_t> LeaseGrant(int64_t) override {
    if (auto s = etcd_->CheckUp(); !s.ok()) return s;
    return etcd_->Grant();
  }
  absl::StatusOr<int64_t> LeaseKeepAlive(int64_t lease) override {
    if (auto s = etcd_->CheckUp(); !s.ok()) return s;
    if (!etcd_->LeaseAlive(lease)) return absl::NotFoundError("lease gone");
    return 10;
  }
  absl::Status LeaseRevoke(int64_t lease) override {
    if (auto s = etcd_->CheckUp(); !s.ok()) return s;
    etcd_->Revoke(lease);
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              int64_t lease) override {
    if (auto s = etcd_->CheckUp(); !s.ok()) return s;
    return etcd_->Put(key, value, lease);
  }
  absl::Status Delete(const std::string& key) override {
    if (auto s = etcd_->CheckUp(); !s.ok()) return s;
    etcd_->Delete(key);
    return absl::OkStatus();
  }
  absl::StatusOr<EtcdRange> RangePrefix(const std::string& prefix) override {
    if (auto s = etcd_->CheckUp(); !s.ok()) return s;
    return etcd_->Range(prefix);
  }
  absl::StatusOr<std::unique_ptr<EtcdWatch>> WatchPrefix(const std::string&,
                                                         int64_t start_revision) override {
    if (auto s = etcd_->CheckUp(); !s.ok()) return s;
    return etcd_->Watch(start_revision);
  }
  std::string Describe() const override { return "fake etcd"; }

 private:
  std::shared_ptr<FakeEtcd> etcd_;
};

// ---- helpers -------------------------------------------------------------------------------

v1::DirectoryNodeRecord Record(const std::string& node, const std::string& address, uint64_t boot) {
  v1::DirectoryNodeRecord r;
  r.set_node_id(node);
  r.set_address(address);
  r.set_boot_id(boot);
  return r;
}

EtcdDirectoryOptions Options(const std::string& self, ManualClock* clock) {
  EtcdDirectoryOptions o;
  o.self = self;
  o.prefix = kPrefix;
  o.ttl_s = 3;
  o.record = Record(self, "10.0.0.1:7070", 0xabc);
  o.endpoints = {"fake:2379"};
  o.clock = clock;
  o.keepalive_interval = absl::Milliseconds(20);
  o.backoff_initial = absl::Milliseconds(20);
  o.backoff_max = absl::Milliseconds(80);
  o.backoff_uniform01 = [] { return 0.0; };
  o.initial_wait = absl::Seconds(2);
  return o;
}

// Polls `pred` for up to 3 s.
template <typename Pred>
bool Eventually(Pred pred, absl::Duration limit = absl::Seconds(3)) {
  const absl::Time until = absl::Now() + limit;
  while (absl::Now() < until) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return pred();
}

std::optional<Peer> Find(const Directory& d, const std::string& node) {
  absl::StatusOr<Peer> p = d.Lookup(node);
  if (!p.ok()) return std::nullopt;
  return *p;
}

// ---- record encoding -----------------------------------------------------------------------

TEST_CASE(
    "node record: NICs carry the rails that name them, GPUs their UUIDs, boot id from the "
    "instance") {
  NodeRecordInputs in;
  in.node_id = "n1";
  in.address = "10.0.0.1:7070";
  in.instance_id = "00000000000000ff0123456789abcdef";
  in.build_info = "kvraild test";
  in.fabric_addresses = {"10.0.1.1", "10.0.2.1"};
  in.now = absl::FromUnixMicros(42);
  for (int i = 0; i < 2; ++i) {
    v1::Gpu* gpu = in.topology.add_gpus();
    gpu->set_index(i);
    gpu->set_uuid("GPU-" + std::to_string(i));
    v1::Nic* nic = in.topology.add_nics();
    nic->set_name("mlx5_" + std::to_string(i));
    nic->set_numa_node(i);
  }
  in.topology.add_nics()->set_name("eth0");  // serves no GPU
  for (int i = 0; i < 2; ++i) {
    v1::Rail* rail = in.graph.add_rails();
    rail->set_index(i);
    rail->set_gpu(i);
    rail->add_nics("mlx5_" + std::to_string(i));
  }
  const v1::DirectoryNodeRecord r = BuildNodeRecord(in);
  CHECK(r.boot_id() == 0xff);
  CHECK(r.registered_unix_us() == 42);
  REQUIRE(r.nics_size() == 3);
  REQUIRE(r.nics(1).rails_size() == 1);
  CHECK(r.nics(1).rails(0) == 1);
  CHECK(r.nics(1).numa_node() == 1);
  CHECK(r.nics(2).rails_size() == 0);
  REQUIRE(r.gpus_size() == 2);
  CHECK(r.gpus(1).uuid() == "GPU-1");
  CHECK(r.fabric_addresses_size() == 2);

  auto back = DecodeNodeRecord(kPrefix, std::string(kPrefix) + "n1", EncodeNodeRecord(r));
  REQUIRE(back.ok());
  CHECK(back->SerializeAsString() == r.SerializeAsString());
  CHECK(BootIdFromInstance("") == 0);
  CHECK(BootIdFromInstance("0123456789abcdef0000") == 0x0123456789abcdefULL);
}

TEST_CASE("node record: decoding refuses what etcd may hold but a daemon must not trust") {
  const std::string key = std::string(kPrefix) + "n1";
  const std::string good = EncodeNodeRecord(Record("n1", "10.0.0.1:7070", 1));
  CHECK(DecodeNodeRecord(kPrefix, key, good).ok());
  auto refused = [&](const std::string& k, const std::string& v, const std::string& what) {
    auto r = DecodeNodeRecord(kPrefix, k, v);
    INFO(what << ": " << r.status().ToString());
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).find(what) != std::string::npos);
  };
  refused("/other/n1", good, "key:");
  refused(std::string(kPrefix), good, "key:");
  refused(std::string(kPrefix) + "a/n1", good, "key:");
  refused(key, std::string(kMaxRecordBytes + 1, 'x'), "bytes");
  refused(key, "\xff\xff\xff", "not a kvrail.v1.DirectoryNodeRecord");
  refused(key, EncodeNodeRecord(Record("n2", "10.0.0.1:7070", 1)), "names another node");
  refused(key, EncodeNodeRecord(Record("n1", "10.0.0.1", 1)), "address");
  refused(key, EncodeNodeRecord(Record("n1", "10.0.0.1:70x0", 1)), "address");
  v1::DirectoryNodeRecord many = Record("n1", "10.0.0.1:7070", 1);
  for (int i = 0; i <= kMaxRecordEntries; ++i) many.add_gpus()->set_uuid("g");
  refused(key, EncodeNodeRecord(many), "more than");
  CHECK(NodeIdFromKey(kPrefix, std::string(kPrefix) + "n9") == "n9");
}

// ---- backoff -------------------------------------------------------------------------------

TEST_CASE("backoff: doubles from initial, capped, jittered down, reset after a success") {
  double u = 0.0;
  Backoff b(absl::Milliseconds(100), absl::Seconds(1), 0.2, [&u] { return u; });
  CHECK(b.Next() == absl::Milliseconds(100));
  CHECK(b.Next() == absl::Milliseconds(200));
  CHECK(b.Next() == absl::Milliseconds(400));
  CHECK(b.Next() == absl::Milliseconds(800));
  CHECK(b.Next() == absl::Seconds(1));
  CHECK(b.Next() == absl::Seconds(1));
  CHECK(b.failures() == 6);
  u = 1.0;  // the most jitter takes 20% off
  CHECK(b.Next() == absl::Milliseconds(800));
  b.Reset();
  CHECK(b.failures() == 0);
  u = 0.5;
  CHECK(b.Next() == absl::Milliseconds(90));
  // A random source stays within [80%, 100%] of the step.
  Backoff r(absl::Milliseconds(100), absl::Milliseconds(100));
  for (int i = 0; i < 100; ++i) {
    const absl::Duration d = r.Next();
    CHECK(d >= absl::Milliseconds(80));
    CHECK(d <= absl::Milliseconds(100));
  }
}

// ---- the directory -------------------------------------------------------------------------

TEST_CASE(
    "etcd directory: registers under a lease, finds peers by range and watch, keeps static ones") {
  auto etcd = std::make_shared<FakeEtcd>();
  ManualClock clock;
  etcd->Put(std::string(kPrefix) + "early", EncodeNodeRecord(Record("early", "10.0.0.2:7070", 7)),
            etcd->Grant());
  etcd->Put("/elsewhere/x", "not ours", 0);
  EtcdDirectoryOptions o = Options("self", &clock);
  o.static_peers = {{"fixed", "10.0.0.9:7070"}, {"self", "10.0.0.1:7070"}};
  auto created = CreateEtcdDirectory(o, std::make_unique<FakeClient>(etcd));
  REQUIRE(created.ok());
  Directory& d = **created;

  const v1::DirectoryStatus status = d.Status();
  CHECK(status.kind() == v1::DIRECTORY_KIND_ETCD);
  CHECK(status.state() == v1::DIRECTORY_STATE_OK);
  CHECK(status.registrations() == 1);
  CHECK(status.lease_id() != 0);
  auto mine = etcd->Get(std::string(kPrefix) + "self");
  REQUIRE(mine.has_value());
  CHECK(mine->lease == status.lease_id());
  auto decoded = DecodeNodeRecord(kPrefix, mine->key, mine->value);
  REQUIRE(decoded.ok());
  CHECK(decoded->boot_id() == 0xabc);

  // The range found "early"; the static "fixed" is there; self is not.
  std::vector<Peer> peers = d.Peers();
  REQUIRE(peers.size() == 2);
  CHECK(peers[0].node_id == "early");
  CHECK(peers[0].registered);
  CHECK(!peers[0].is_static);
  CHECK(peers[0].address == "10.0.0.2:7070");
  CHECK(peers[0].record.boot_id() == 7);
  CHECK(peers[1].node_id == "fixed");
  CHECK(peers[1].is_static);
  CHECK(!peers[1].registered);

  // A node that joins later is seen through the watch, with its record's fields.
  v1::DirectoryNodeRecord late = Record("late", "10.0.0.3:7070", 9);
  late.add_gpus()->set_uuid("GPU-late");
  etcd->Put(std::string(kPrefix) + "late", EncodeNodeRecord(late), etcd->Grant());
  REQUIRE(Eventually([&] { return Find(d, "late").has_value(); }));
  CHECK(Find(d, "late")->record.gpus(0).uuid() == "GPU-late");
  CHECK(Find(d, "late")->state == PeerState::kUnknown);
  const auto listed = d.List();
  REQUIRE(listed.size() == 3);
  CHECK(listed[0].source() == v1::PEER_SOURCE_ETCD);
  CHECK(listed[1].source() == v1::PEER_SOURCE_STATIC);
  CHECK(listed[2].record().gpus(0).uuid() == "GPU-late");
  CHECK(d.Status().registered_peers() == 2);
  // Keep-alives flow.
  const int before = etcd->keepalives();
  CHECK(Eventually([&] { return etcd->keepalives() >= before + 3; }));
}

TEST_CASE(
    "etcd directory: a vanished record is down and stays listed; MarkUp cannot revive it; a new "
    "registration can") {
  auto etcd = std::make_shared<FakeEtcd>();
  ManualClock clock;
  auto created = CreateEtcdDirectory(Options("self", &clock), std::make_unique<FakeClient>(etcd));
  REQUIRE(created.ok());
  Directory& d = **created;
  const int64_t lease = etcd->Grant();
  const std::string key = std::string(kPrefix) + "p";
  etcd->Put(key, EncodeNodeRecord(Record("p", "10.0.0.5:7070", 1)), lease);
  REQUIRE(Eventually([&] { return Find(d, "p").has_value(); }));
  d.MarkUp("p", absl::FromUnixSeconds(5), 77);
  CHECK(Find(d, "p")->state == PeerState::kUp);

  etcd->Revoke(lease);  // its lease ended
  REQUIRE(Eventually([&] { return Find(d, "p")->state == PeerState::kDown; }));
  CHECK(!Find(d, "p")->registered);
  CHECK(Find(d, "p")->has_record);
  CHECK(d.List()[0].state() == v1::PEER_STATE_DOWN);
  d.MarkUp("p", absl::FromUnixSeconds(6), 77);  // a heartbeat does not override etcd
  CHECK(Find(d, "p")->state == PeerState::kDown);

  // It restarts: a new record (new boot id) makes it kUp-able again.
  etcd->Put(key, EncodeNodeRecord(Record("p", "10.0.0.5:7071", 2)), etcd->Grant());
  REQUIRE(Eventually([&] { return Find(d, "p")->registered; }));
  CHECK(Find(d, "p")->state == PeerState::kUnknown);
  CHECK(Find(d, "p")->address == "10.0.0.5:7071");
  d.MarkUp("p", absl::FromUnixSeconds(7), 78);
  CHECK(Find(d, "p")->state == PeerState::kUp);
  // A new boot id while up resets it to unknown (the fabric must introduce it again); the same
  // boot id re-put (a re-registration) keeps it up.
  etcd->Put(key, EncodeNodeRecord(Record("p", "10.0.0.5:7071", 2)), etcd->Grant());
  absl::SleepFor(absl::Milliseconds(50));
  CHECK(Find(d, "p")->state == PeerState::kUp);
  etcd->Put(key, EncodeNodeRecord(Record("p", "10.0.0.5:7071", 3)), etcd->Grant());
  REQUIRE(Eventually([&] { return Find(d, "p")->state == PeerState::kUnknown; }));
  // Records that do not decode are ignored, not applied.
  etcd->Put(std::string(kPrefix) + "bad", "garbage", 0);
  etcd->Put(std::string(kPrefix) + "liar", EncodeNodeRecord(Record("p", "10.6.6.6:1", 4)),
            etcd->Grant());
  etcd->Put(std::string(kPrefix) + "q", EncodeNodeRecord(Record("q", "10.0.0.7:7070", 1)),
            etcd->Grant());
  REQUIRE(Eventually([&] { return Find(d, "q").has_value(); }));
  CHECK(!Find(d, "bad").has_value());
  CHECK(!Find(d, "liar").has_value());
  CHECK(Find(d, "p")->address == "10.0.0.5:7071");
}

TEST_CASE(
    "etcd directory: etcd down keeps every peer, says degraded, backs off, and re-registers with a "
    "new lease") {
  auto etcd = std::make_shared<FakeEtcd>();
  ManualClock clock;
  std::vector<v1::DirectoryState> states;
  absl::Mutex states_mu;
  auto created = CreateEtcdDirectory(Options("self", &clock), std::make_unique<FakeClient>(etcd));
  REQUIRE(created.ok());
  Directory& d = **created;
  d.SetStateListener([&](const v1::DirectoryStatus& s) {
    absl::MutexLock lock(&states_mu);
    states.push_back(s.state());
  });
  const int64_t first_lease = d.Status().lease_id();
  etcd->Put(std::string(kPrefix) + "p", EncodeNodeRecord(Record("p", "10.0.0.5:7070", 1)),
            etcd->Grant());
  etcd->Put(std::string(kPrefix) + "gone", EncodeNodeRecord(Record("gone", "10.0.0.6:7070", 1)),
            etcd->Grant());
  REQUIRE(Eventually([&] { return d.Peers().size() == 2; }));
  d.MarkUp("p", absl::FromUnixSeconds(5), 1);

  clock.Advance(absl::Seconds(10));
  etcd->SetDown(true);
  REQUIRE(Eventually([&] { return d.Status().state() == v1::DIRECTORY_STATE_DEGRADED; }));
  v1::DirectoryStatus s = d.Status();
  CHECK(s.reason().find("etcd unreachable") != std::string::npos);
  // The first failure may be the watch ending; the retries then find etcd down.
  REQUIRE(Eventually(
      [&] { return d.Status().last_error().find("fake etcd is down") != std::string::npos; }));
  CHECK(s.since_unix_us() == absl::ToUnixMicros(clock.Now()));
  CHECK(s.lease_id() == 0);
  // Nothing dropped, nothing marked down because etcd is gone.
  REQUIRE(d.Peers().size() == 2);
  CHECK(Find(d, "p")->state == PeerState::kUp);
  CHECK(Find(d, "gone")->registered);
  // Backoff, not a hot loop: 20, 40, 80, 80, ... ms between attempts.
  const int calls_before = etcd->calls();
  absl::SleepFor(absl::Milliseconds(500));
  const int attempts = etcd->calls() - calls_before;
  CHECK(attempts >= 3);
  CHECK(attempts <= 12);

  // While etcd was away, "gone"'s record vanished; a newcomer registered.
  etcd->Delete(std::string(kPrefix) + "gone");
  etcd->Put(std::string(kPrefix) + "new", EncodeNodeRecord(Record("new", "10.0.0.8:7070", 1)),
            etcd->Grant());
  CHECK(!Find(d, "new").has_value());
  etcd->SetDown(false);
  REQUIRE(Eventually([&] { return d.Status().state() == v1::DIRECTORY_STATE_OK; }));
  s = d.Status();
  CHECK(s.registrations() == 2);
  CHECK(s.lease_id() != 0);
  CHECK(s.lease_id() != first_lease);
  CHECK(s.last_error().find("fake etcd is down") != std::string::npos);  // kept after recovery
  CHECK(etcd->Get(std::string(kPrefix) + "self")->lease == s.lease_id());
  CHECK(Find(d, "gone")->state == PeerState::kDown);  // the re-read range says it left
  CHECK(Find(d, "new").has_value());
  CHECK(Find(d, "p")->state == PeerState::kUp);
  absl::MutexLock lock(&states_mu);
  CHECK(states ==
        std::vector<v1::DirectoryState>{v1::DIRECTORY_STATE_DEGRADED, v1::DIRECTORY_STATE_OK});
}

TEST_CASE("etcd directory: a lost lease or a deleted record registers again") {
  auto etcd = std::make_shared<FakeEtcd>();
  ManualClock clock;
  auto created = CreateEtcdDirectory(Options("self", &clock), std::make_unique<FakeClient>(etcd));
  REQUIRE(created.ok());
  Directory& d = **created;
  const std::string key = std::string(kPrefix) + "self";
  // Someone deletes this node's key: it is put back (same lease).
  const int64_t lease = d.Status().lease_id();
  etcd->Delete(key);
  REQUIRE(Eventually([&] { return etcd->Get(key).has_value(); }));
  CHECK(etcd->Get(key)->lease == lease);
  // The lease expires (etcd unreachable from here for a TTL, say): the keep-alive finds it gone,
  // and a new session registers with a new lease.
  etcd->Revoke(lease);
  REQUIRE(Eventually([&] {
    return d.Status().registrations() == 2 && d.Status().state() == v1::DIRECTORY_STATE_OK;
  }));
  CHECK(d.Status().last_error().find("lease") != std::string::npos);
  REQUIRE(etcd->Get(key).has_value());
  CHECK(etcd->Get(key)->lease == d.Status().lease_id());
  CHECK(etcd->Get(key)->lease != lease);
}

TEST_CASE(
    "etcd directory: starts degraded when etcd is unreachable, and closing revokes the lease") {
  auto etcd = std::make_shared<FakeEtcd>();
  ManualClock clock;
  etcd->SetDown(true);
  EtcdDirectoryOptions o = Options("self", &clock);
  o.static_peers = {{"fixed", "10.0.0.9:7070"}};
  auto created = CreateEtcdDirectory(o, std::make_unique<FakeClient>(etcd));
  REQUIRE(created.ok());
  CHECK((*created)->Status().state() == v1::DIRECTORY_STATE_DEGRADED);
  CHECK((*created)->Peers().size() == 1);  // the static peers work without etcd
  etcd->SetDown(false);
  REQUIRE(Eventually([&] { return (*created)->Status().state() == v1::DIRECTORY_STATE_OK; }));
  const std::string key = std::string(kPrefix) + "self";
  REQUIRE(etcd->Get(key).has_value());
  created->reset();
  CHECK(!etcd->Get(key).has_value());
}

TEST_CASE("static directory: status is ok, peers listed as static") {
  auto d = CreateStaticDirectory({{"b", "10.0.0.2:2"}}, "a");
  CHECK(d->Status().kind() == v1::DIRECTORY_KIND_STATIC);
  CHECK(d->Status().state() == v1::DIRECTORY_STATE_OK);
  CHECK(d->List()[0].source() == v1::PEER_SOURCE_STATIC);
}

}  // namespace
}  // namespace kvrail::directory

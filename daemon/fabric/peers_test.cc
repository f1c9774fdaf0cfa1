// Membership of the fabric (docs/fabric.md, "Membership"): the append-only peer table (indices in
// order of arrival, entries that never move, the 127-peer cap), per-peer staging registered when
// a peer is added (also after the proxies started), and peer control following a directory whose
// peers change (newcomers added; a peer the directory drops while up is withdrawn: down, its
// transfers failed naming it, not contacted, back once listed again). NICs: the tcp provider on
// loopback (the lanes cases skip without it).
#include "daemon/fabric/peers.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/fabric/lanes.h"
#include "daemon/fabric/peer_control.h"
#include "daemon/fabric/testing/counting_peer.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

namespace {

directory::Peer PeerNamed(const std::string& node, int port = 1) {
  directory::Peer p;
  p.node_id = node;
  p.address = absl::StrCat("127.0.0.1:", port);
  return p;
}

absl::Status Nothing(PeerConn*) { return absl::OkStatus(); }

TEST_CASE("the peer table grows in order of arrival and its entries never move") {
  PeerTable table;
  CHECK(table.size() == 0);
  CHECK(table.Find("a") == nullptr);
  auto a = table.Add(PeerNamed("a"), Nothing);
  REQUIRE(a.ok());
  PeerConn* const first = *a;
  for (int i = 0; i < 40; ++i) REQUIRE(table.Add(PeerNamed(absl::StrCat("n", i)), Nothing).ok());
  CHECK(table.size() == 41);
  CHECK(table.at(0) == first);  // same object after 40 more adds
  CHECK(first->index == 0);
  CHECK(first->node_id == "a");
  CHECK(table.Find("n7")->index == 8);
  CHECK(table.Find("n7") == table.at(8));
  const std::vector<PeerConn*> all = table.Snapshot();
  REQUIRE(all.size() == 41);
  for (uint32_t i = 0; i < all.size(); ++i) CHECK(all[i]->index == i);

  SECTION("a known node is refused, the table unchanged") {
    auto again = table.Add(PeerNamed("a", 2), Nothing);
    CHECK(again.status().code() == absl::StatusCode::kAlreadyExists);
    CHECK(table.size() == 41);
    CHECK(table.Find("a")->address == "127.0.0.1:1");
  }
  SECTION("a failed prepare adds nothing and takes no index") {
    auto failed = table.Add(PeerNamed("x"),
                            [](PeerConn*) { return absl::ResourceExhaustedError("no staging"); });
    CHECK(failed.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(table.Find("x") == nullptr);
    auto next = table.Add(PeerNamed("y"), Nothing);
    REQUIRE(next.ok());
    CHECK((*next)->index == 41);
  }
  SECTION("no node id or no address") {
    directory::Peer bad = PeerNamed("");
    CHECK(table.Add(bad, Nothing).status().code() == absl::StatusCode::kInvalidArgument);
    bad = PeerNamed("z");
    bad.address.clear();
    CHECK(table.Add(bad, Nothing).status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("the 128th peer is refused, naming it and the limit") {
  PeerTable table;
  for (uint32_t i = 0; i < PeerTable::kMaxPeers; ++i) {
    REQUIRE(table.Add(PeerNamed(absl::StrCat("n", i)), Nothing).ok());
  }
  CHECK(table.at(126)->index == 126);
  auto over = table.Add(PeerNamed("one-too-many"), Nothing);
  REQUIRE_FALSE(over.ok());
  CHECK(over.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(over.status().message().find("one-too-many") != std::string::npos);
  CHECK(over.status().message().find("127") != std::string::npos);
  CHECK(table.size() == PeerTable::kMaxPeers);
}

TEST_CASE("readers see only complete entries while peers are added") {
  PeerTable table;
  std::atomic<bool> done{false};
  std::atomic<int> bad{0};
  std::thread reader([&] {
    while (!done.load()) {
      const uint32_t n = table.size();
      for (uint32_t i = 0; i < n; ++i) {
        PeerConn* p = table.at(i);
        absl::MutexLock lock(&p->mu);
        // `prepare` ran before publication: its mark must be visible.
        if (p->index != i || p->lanes != 7) bad.fetch_add(1);
      }
    }
  });
  for (uint32_t i = 0; i < 100; ++i) {
    REQUIRE(table
                .Add(PeerNamed(absl::StrCat("n", i)),
                     [](PeerConn* p) {
                       absl::MutexLock lock(&p->mu);
                       p->lanes = 7;
                       return absl::OkStatus();
                     })
                .ok());
  }
  done.store(true);
  reader.join();
  CHECK(bad.load() == 0);
}

// A directory whose peers the test changes (E's etcd directory behind the same interface).
class FakeDirectory final : public directory::Directory {
 public:
  // Default address: nothing listens, hellos fail (not needed in most cases).
  void Set(const std::string& node, directory::PeerState state,
           const std::string& address = "127.0.0.1:1") {
    absl::MutexLock lock(&mu_);
    directory::Peer& p = peers_[node];
    p.node_id = node;
    p.address = address;
    p.state = state;
  }
  // Its record vanished (etcd: lease ended): listed down with its last record.
  void Vanish(const std::string& node) {
    absl::MutexLock lock(&mu_);
    directory::Peer& p = peers_[node];
    p.state = directory::PeerState::kDown;
    p.has_record = true;
    p.registered = false;
  }
  void Remove(const std::string& node) {
    absl::MutexLock lock(&mu_);
    peers_.erase(node);
  }
  std::vector<directory::Peer> Peers() const override {
    absl::MutexLock lock(&mu_);
    std::vector<directory::Peer> out;
    for (const auto& [node, p] : peers_) out.push_back(p);
    return out;
  }
  absl::StatusOr<directory::Peer> Lookup(const std::string& node) const override {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(node);
    if (it == peers_.end()) return absl::NotFoundError("unknown peer");
    return it->second;
  }
  void MarkUp(const std::string& node, absl::Time, uint64_t) override {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(node);
    if (it != peers_.end() && it->second.state != directory::PeerState::kDown) {
      it->second.state = directory::PeerState::kUp;
    }
  }
  void MarkDown(const std::string& node) override { Set(node, directory::PeerState::kDown); }
  std::vector<v1::PeerInfo> List() const override { return {}; }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, directory::Peer> peers_ ABSL_GUARDED_BY(mu_);
};

FabricOptions LoopbackOptions(int nics) {
  FabricOptions options;
  options.node_id = "self";
  options.slots = 4;
  options.slot_bytes = 64 << 10;
  for (int i = 0; i < nics; ++i) options.nic_addresses.push_back("127.0.0.1");
  return options;
}

class NoSink final : public CreditSink, public ArrivalSink {
 public:
  void OnCredit(uint32_t, uint32_t, uint32_t, uint32_t, bool) override {}
  void OnWriteFailed(uint32_t, uint32_t, uint32_t, const absl::Status&) override {}
  void OnArrival(const Arrival&) override {}
};

// The lanes for `options` over `table`, or nullptr after a SKIP warning (no tcp provider).
std::unique_ptr<Lanes> LanesOrSkip(const FabricOptions& options, PeerTable* table) {
  absl::StatusOr<std::unique_ptr<Lanes>> lanes = Lanes::Create(options, table);
  if (!lanes.ok()) {
    WARN("SKIP: " << lanes.status().ToString());
    return nullptr;
  }
  return std::move(*lanes);
}

TEST_CASE("staging is registered per peer as peers are added, before and after the proxies start") {
  const FabricOptions options = LoopbackOptions(2);
  PeerTable table;
  std::unique_ptr<Lanes> lanes = LanesOrSkip(options, &table);
  if (lanes == nullptr) return;
  auto add = [&](const std::string& node) {
    return table.Add(PeerNamed(node), [&](PeerConn* p) { return lanes->AddPeer(p); });
  };
  REQUIRE(add("a").ok());
  NoSink sink;
  lanes->StartProxies(&sink, &sink);
  REQUIRE(add("b").ok());
  REQUIRE(add("c").ok());
  std::set<uint64_t> keys;
  std::set<const uint8_t*> slots;
  for (PeerConn* p : table.Snapshot()) {
    {
      absl::MutexLock lock(&p->mu);
      CHECK(p->credits.size() == 2);
      CHECK(p->owners.size() == 2);
      CHECK(p->consumed.size() == 2);
      CHECK(p->sealed.size() == 2);
      CHECK(p->remote.size() == 2);
    }
    for (uint32_t l = 0; l < 2; ++l) {
      const MemoryRegion& mr = lanes->PeerRegistration(l, p->index);
      keys.insert(mr.key());
      // The peer's receive slots and credit words lie inside its registration; its send slots
      // (ours to fill) do not.
      const uint8_t* recv = lanes->RecvSlot(l, p->index, 0);
      const uint8_t* credit = reinterpret_cast<const uint8_t*>(lanes->CreditWords(l, p->index));
      CHECK(recv >= mr.base());
      CHECK(credit + 8 * options.slots <= mr.base() + mr.size());
      CHECK(lanes->SendSlot(l, p->index, options.slots - 1) < mr.base());
      for (uint32_t s = 0; s < options.slots; ++s) {
        slots.insert(lanes->SendSlot(l, p->index, s));
        slots.insert(lanes->RecvSlot(l, p->index, s));
        lanes->SendSlot(l, p->index, s)[options.slot_bytes - 1] = 1;  // writable
      }
    }
  }
  CHECK(keys.size() == 6);                           // one key per (peer, lane), none shared
  CHECK(slots.size() == 3 * 2 * 2 * options.slots);  // no two slots overlap
  CHECK(lanes->Describe().find("3 peers") != std::string::npos);
  lanes->Stop();
}

TEST_CASE("peer control follows the directory: newcomers added, a dropped peer withdrawn") {
  const FabricOptions options = LoopbackOptions(1);
  PeerTable table;
  std::unique_ptr<Lanes> lanes = LanesOrSkip(options, &table);
  if (lanes == nullptr) return;
  FakeDirectory dir;
  absl::Mutex lost_mu;
  std::vector<std::string> lost;
  auto control = PeerControl::Create(options, 1, lanes.get(), &table, &dir,
                                     [&](PeerConn*, const absl::Status& why) {
                                       absl::MutexLock lock(&lost_mu);
                                       lost.push_back(std::string(why.message()));
                                     });
  dir.Set("a", directory::PeerState::kUnknown);
  dir.Set("self", directory::PeerState::kUp);    // its own record: never a peer
  dir.Set("gone", directory::PeerState::kDown);  // left before we met it: not added
  control->SyncDirectory();
  REQUIRE(table.size() == 1);
  PeerConn* a = table.Find("a");
  REQUIRE(a != nullptr);
  CHECK(table.Find("self") == nullptr);
  CHECK(table.Find("gone") == nullptr);

  // A node that joins later gets the next index and its staging.
  dir.Set("b", directory::PeerState::kUnknown);
  control->SyncDirectory();
  REQUIRE(table.size() == 2);
  CHECK(table.Find("b")->index == 1);
  CHECK(lanes->PeerRegistration(0, 1).key() != lanes->PeerRegistration(0, 0).key());
  // FindOrAdd: one the directory lists is added at once; one it does not know is not.
  dir.Set("c", directory::PeerState::kUp);
  PeerConn* c = control->FindOrAdd("c");
  REQUIRE(table.size() == 3);
  CHECK(c == table.at(2));
  CHECK(control->FindOrAdd("nobody") == nullptr);
  CHECK(table.size() == 3);

  // "a" is up here; the directory drops it (its record vanished): down, its transfers failed.
  {
    absl::MutexLock lock(&a->mu);
    a->up = true;
    a->introduced = true;
  }
  dir.Set("a", directory::PeerState::kDown);
  control->SyncDirectory();
  {
    absl::MutexLock lock(&a->mu);
    CHECK_FALSE(a->up);
    CHECK(a->withdrawn);
  }
  {
    absl::MutexLock lock(&lost_mu);
    REQUIRE(lost.size() == 1);
    CHECK(lost[0].find("peer 'a'") != std::string::npos);
    CHECK(lost[0].find("directory") != std::string::npos);
  }
  // Withdrawn: not introduced again (the sender's path), no hello accepted from it.
  const absl::Status hello = control->Introduce(a);
  CHECK(hello.code() == absl::StatusCode::kUnavailable);
  CHECK(hello.message().find("'a'") != std::string::npos);
  peer_v1::PeerHello from_a;
  from_a.set_version(1);
  from_a.set_node_id("a");
  from_a.set_provider(lanes->provider());
  from_a.set_slots(options.slots);
  from_a.set_slot_bytes(options.slot_bytes);
  from_a.add_nics()->set_fabric_address(lanes->at(0).nic->address());
  CHECK(control->OnHello(from_a).status().code() == absl::StatusCode::kUnavailable);
  // A second round changes nothing (no second loss).
  control->SyncDirectory();
  {
    absl::MutexLock lock(&lost_mu);
    CHECK(lost.size() == 1);
  }
  // Listed again (it re-registered, e.g. with a new boot id): no longer withdrawn, and its
  // Hello is applied.
  dir.Set("a", directory::PeerState::kUnknown);
  from_a.set_boot_id(99);
  auto answer = control->OnHello(from_a);
  INFO(answer.status().ToString());
  REQUIRE(answer.ok());
  CHECK(answer->your_index() == 0);
  absl::MutexLock lock(&a->mu);
  CHECK_FALSE(a->withdrawn);
  CHECK(a->up);
  CHECK(a->boot_id == 99);
}

}  // namespace
}  // namespace kvrail::fabric

namespace kvrail::fabric {
namespace {

// Indexes of peers that left are reclaimed (after a quarantine) and reused with a new generation
// and new staging, so a daemon serves any number of peers over its life, not only its first 128.
TEST_CASE("300 peers join and leave a daemon: indexes reclaimed after their quarantine") {
  const FabricOptions options = LoopbackOptions(1);
  PeerTable table;
  table.set_quarantine(absl::Seconds(7));
  std::unique_ptr<Lanes> lanes = LanesOrSkip(options, &table);
  if (lanes == nullptr) return;
  FakeDirectory dir;
  std::atomic<int> lost{0};
  auto control = PeerControl::Create(options, 1, lanes.get(), &table, &dir,
                                     [&](PeerConn*, const absl::Status&) { ++lost; });
  absl::Time now = absl::Now();
  std::map<uint32_t, uint64_t> last_key;     // per index: the previous holder's registration key
  std::map<uint32_t, uint32_t> generations;  // per index: the latest generation
  int joined = 0, reused = 0;
  for (int wave = 0; wave < 3; ++wave) {
    std::vector<std::string> nodes;
    for (int i = 0; i < 100; ++i) nodes.push_back(absl::StrCat("w", wave, "-", i));
    for (const auto& n : nodes) dir.Set(n, directory::PeerState::kUnknown);
    control->SyncDirectory();
    for (const auto& n : nodes) {
      PeerConn* p = table.Find(n);
      INFO("wave " << wave << " node " << n);
      REQUIRE(p != nullptr);
      ++joined;
      CHECK(p->index < PeerTable::kMaxPeers);
      const uint64_t key = lanes->PeerRegistration(0, p->index).key();
      if (last_key.count(p->index) > 0) {
        ++reused;
        // A reused index: the next generation and a new registration (the old key is gone).
        CHECK(p->generation == generations[p->index] + 1);
        CHECK(key != last_key[p->index]);
      } else {
        CHECK(p->generation == 0);
      }
      last_key[p->index] = key;
      generations[p->index] = p->generation;
    }
    CHECK(table.Snapshot().size() == 100);
    // Half vanish (etcd lease ended), half are deleted from the directory: all leave.
    for (int i = 0; i < 100; ++i) {
      if (i % 2 == 0) {
        dir.Vanish(nodes[i]);
      } else {
        dir.Remove(nodes[i]);
      }
    }
    control->SyncDirectory();
    control->Reclaim(now);
    CHECK(table.Snapshot().empty());
    CHECK(table.quarantined() == 100);
    for (const auto& n : nodes) CHECK(table.Find(n) == nullptr);
    // In quarantine: not free yet.
    now += absl::Seconds(6);
    control->Reclaim(now);
    CHECK(table.quarantined() == 100);
    now += absl::Seconds(2);
    control->Reclaim(now);
    CHECK(table.quarantined() == 0);
    CHECK(table.free_indexes() == PeerTable::kMaxPeers);
  }
  CHECK(joined == 300);
  CHECK(reused == 173);  // 127 fresh indexes, then reuse
  CHECK(table.size() == PeerTable::kMaxPeers);
  CHECK(lost.load() == 0);  // none was up: nothing to fail
}

TEST_CASE("no index is reused while quarantined; busy and merely silent peers are not retired") {
  const FabricOptions options = LoopbackOptions(1);
  PeerTable table;
  table.set_quarantine(absl::Seconds(7));
  std::unique_ptr<Lanes> lanes = LanesOrSkip(options, &table);
  if (lanes == nullptr) return;
  FakeDirectory dir;
  auto control = PeerControl::Create(options, 1, lanes.get(), &table, &dir,
                                     [](PeerConn*, const absl::Status&) {});
  std::atomic<bool> busy{true};
  control->SetBusyCheck([&](const PeerConn* p) { return p->node_id == "busy" && busy.load(); });
  for (uint32_t i = 0; i < PeerTable::kMaxPeers; ++i) {
    dir.Set(absl::StrCat("p", i), directory::PeerState::kUnknown);
  }
  control->SyncDirectory();
  REQUIRE(table.Snapshot().size() == PeerTable::kMaxPeers);
  // Marked down by our own liveness (still registered): may answer again, kept.
  dir.Set("p0", directory::PeerState::kDown);
  for (uint32_t i = 1; i < PeerTable::kMaxPeers; ++i) dir.Vanish(absl::StrCat("p", i));
  const absl::Time t0 = absl::Now();
  control->Reclaim(t0);
  CHECK(table.Find("p0") != nullptr);
  CHECK(table.quarantined() == PeerTable::kMaxPeers - 1);
  // Every other index in quarantine: a newcomer is refused, naming the quarantine.
  dir.Set("busy", directory::PeerState::kUnknown);
  auto refused = control->AddPeer(dir.Lookup("busy").value());
  REQUIRE(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(refused.status().message().find("quarantine") != std::string::npos);
  // Past it: the newcomer gets a reclaimed index with generation 1.
  control->Reclaim(t0 + absl::Seconds(8));
  auto added = control->AddPeer(dir.Lookup("busy").value());
  REQUIRE(added.ok());
  CHECK((*added)->generation == 1);
  // It leaves while a transfer to it is open: kept until that ends.
  dir.Vanish("busy");
  control->Reclaim(t0 + absl::Seconds(9));
  CHECK(table.Find("busy") == *added);
  busy = false;
  control->Reclaim(t0 + absl::Seconds(10));
  CHECK(table.Find("busy") == nullptr);
  CHECK((*added)->retired.load());
}

// A peer whose directory record names a new Peer address (same node id) gets a new stub and
// lanes: hellos and transfers must not go on to the old address.
TEST_CASE(
    "a peer whose directory address changes is re-dialed: old entry retired, hello at the new "
    "address") {
  const FabricOptions options = LoopbackOptions(1);
  PeerTable table;
  std::unique_ptr<Lanes> lanes = LanesOrSkip(options, &table);
  if (lanes == nullptr) return;
  testing::CountingPeerServer s1, s2;
  testing::CountingPeer& old_peer = s1.service;
  testing::CountingPeer& new_peer = s2.service;
  const std::string old_address = s1.address;
  const std::string new_address = s2.address;

  FakeDirectory dir;
  absl::Mutex lost_mu;
  std::vector<std::string> lost;
  auto control = PeerControl::Create(options, 1, lanes.get(), &table, &dir,
                                     [&](PeerConn*, const absl::Status& why) {
                                       absl::MutexLock lock(&lost_mu);
                                       lost.push_back(std::string(why.message()));
                                     });
  dir.Set("m", directory::PeerState::kUnknown, old_address);
  control->SyncDirectory();
  PeerConn* before = table.Find("m");
  REQUIRE(before != nullptr);
  CHECK_FALSE(control->Introduce(before).ok());
  CHECK(old_peer.hellos.load() == 1);
  {
    absl::MutexLock lock(&before->mu);
    before->up = true;
    before->introduced = true;
  }
  // Same node id, new address (it restarted elsewhere).
  dir.Set("m", directory::PeerState::kUnknown, new_address);
  control->SyncDirectory();
  PeerConn* after = table.Find("m");
  REQUIRE(after != nullptr);
  CHECK(after != before);
  CHECK(after->address == new_address);
  CHECK(before->retired.load());
  CHECK(after->index != before->index);  // the old index is in quarantine
  {
    absl::MutexLock lock(&before->mu);
    CHECK_FALSE(before->up);
    CHECK(before->lanes == 0);
  }
  {
    absl::MutexLock lock(&lost_mu);
    REQUIRE(lost.size() == 1);
    CHECK(lost[0].find("'m' moved from " + old_address + " to " + new_address) !=
          std::string::npos);
  }
  // Hello again, at the new address; the old one hears nothing more.
  CHECK_FALSE(control->Introduce(after).ok());
  CHECK(new_peer.hellos.load() == 1);
  CHECK(old_peer.hellos.load() == 1);
  // A second round changes nothing.
  control->SyncDirectory();
  CHECK(table.Find("m") == after);
  absl::MutexLock lock(&lost_mu);
  CHECK(lost.size() == 1);
  s1.server->Shutdown();
  s2.server->Shutdown();
}

}  // namespace
}  // namespace kvrail::fabric

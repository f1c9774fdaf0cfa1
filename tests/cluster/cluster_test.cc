// Many daemons through a real etcd: 4 kvraild daemons, each in its own network
// namespace on one bridge, find each other through etcd (no static peers) and move paged KV
// caches many-to-many, verified byte for byte; a fifth node joins later and is seen up by all
// (measured and printed); a node killed by pid fails its transfers within their deadline and is
// marked down by everyone within the liveness timeout (measured), then comes back with a new boot
// id and works again; etcd is killed and restarted and no transfer between known peers fails
// meanwhile.
//
// Needs root (CI runs as root; SKIPs with the reason otherwise) and etcd (FAILs without it).
#include "tests/cluster/cluster.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/integration/kv_fixture.h"

namespace kvrail::testing {
namespace {

constexpr absl::Duration kLiveness = absl::Seconds(2);  // NsDaemon's fabric.liveness_timeout_ms
constexpr uint32_t kBlocks = 32, kMoved = 8, kTpb = 16;

v1::PagedKvLayout Layout() {
  return MakeLayout(2, 2, kBlocks, kTpb, 4, 64, v1::DTYPE_BF16,
                    v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

// Each node's source pool (seed = its number) and, per sender, a destination pool exported to
// that sender only (so each one's bytes are checked on their own, poison everywhere else).
struct Data {
  std::map<std::string, uint32_t> seed;
  std::map<std::string, Pool> src;
  std::map<std::pair<std::string, std::string>, Pool> dst;  // (receiver, sender)
  // The receiver's write grant of each destination, for its sender's spec.dst.grant.
  std::map<std::pair<std::string, std::string>, std::string> grant;
};

std::vector<uint32_t> SrcBlocks(uint32_t seed) { return ScatteredBlocks(kBlocks, kMoved, seed); }
std::vector<uint32_t> DstBlocks(uint32_t seed) {
  return ScatteredBlocks(kBlocks, kMoved, seed + 1000);
}

void AddSource(Data& d, ClusterNode& n) {
  const uint32_t seed = static_cast<uint32_t>(d.seed.size() + 1);
  d.seed[n.name] = seed;
  d.src.erase(n.name);
  Pool pool = MakePool(*n.daemon->client, Layout(), false, "src");
  FillPool(pool, seed, SrcBlocks(seed), kMoved * kTpb);
  d.src.emplace(n.name, std::move(pool));
}

// A destination pool on `to` for `from`'s transfers, exported to `from`.
void AddDestination(Data& d, ClusterNode& to, const ClusterNode& from) {
  d.dst.erase({to.name, from.name});
  Pool pool = MakePool(*to.daemon->client, Layout(), true, "from-" + from.name);
  const absl::Status exported = to.daemon->Export(pool.id(), from.name);
  INFO(to.name << " exports to " << from.name << ": " << exported);
  REQUIRE(exported.ok());
  d.grant[{to.name, from.name}] = to.daemon->WriteGrant(pool.id());
  d.dst.emplace(std::make_pair(to.name, from.name), std::move(pool));
}

v1::TransferSpec Spec(const Data& d, const ClusterNode& from, const ClusterNode& to,
                      uint32_t timeout_ms = 20000) {
  const uint32_t seed = d.seed.at(from.name);
  auto spec = client::MakeBlockTransfer(d.src.at(from.name).id(), SrcBlocks(seed),
                                        d.dst.at({to.name, from.name}).id(), DstBlocks(seed));
  spec.mutable_dst()->set_node_id(to.name);
  spec.mutable_dst()->set_grant(d.grant.at({to.name, from.name}));
  spec.set_timeout_ms(timeout_ms);
  return spec;
}

// Every ordered pair of `nodes` at once: submitted together, waited for, each destination
// verified byte for byte. Returns the failures (empty: all moved and verified).
std::vector<std::string> AllToAll(const Data& d, const std::vector<ClusterNode*>& nodes) {
  struct Pending {
    ClusterNode* from;
    ClusterNode* to;
    uint64_t id;
  };
  std::vector<Pending> pending;
  std::vector<std::string> failures;
  for (ClusterNode* from : nodes) {
    for (ClusterNode* to : nodes) {
      if (from == to) continue;
      auto submitted = from->daemon->client->Submit(Spec(d, *from, *to));
      if (!submitted.ok()) {
        failures.push_back(
            absl::StrCat(from->name, "->", to->name, " submit: ", submitted.status().ToString()));
        continue;
      }
      pending.push_back({from, to, submitted->transfer_id()});
    }
  }
  // One deadline for the whole round (the transfers' own, 20 s, and a margin): a pair that
  // stopped moving fails the round once, with its reason, instead of costing 30 s per transfer.
  const absl::Time round_deadline = absl::Now() + absl::Seconds(25);
  for (const Pending& p : pending) {
    const absl::Duration left = std::max(round_deadline - absl::Now(), absl::Milliseconds(1));
    auto status = p.from->daemon->client->Wait(p.id, left);
    if (status.ok() && status->state() != v1::TRANSFER_STATE_SUCCEEDED &&
        status->state() != v1::TRANSFER_STATE_FAILED &&
        status->state() != v1::TRANSFER_STATE_CANCELLED) {
      failures.push_back(absl::StrCat(p.from->name, "->", p.to->name,
                                      ": still not ended when the round's deadline passed (",
                                      v1::TransferState_Name(status->state()), ")"));
      continue;
    }
    if (!status.ok() || status->state() != v1::TRANSFER_STATE_SUCCEEDED) {
      failures.push_back(
          absl::StrCat(p.from->name, "->", p.to->name, ": ",
                       status.ok() ? status->error_message() : status.status().ToString()));
      continue;
    }
    const uint32_t seed = d.seed.at(p.from->name);
    const std::string bad =
        VerifyPool(d.dst.at({p.to->name, p.from->name}),
                   Expectation{seed, DstBlocks(seed), kMoved * kTpb, 0, 0, 2, 0, 0, 4});
    if (!bad.empty()) failures.push_back(absl::StrCat(p.from->name, "->", p.to->name, ": ", bad));
  }
  return failures;
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// "a 312 b 298 ..." and the largest, from per-observer times (InfinitePast: never).
std::pair<std::string, double> Spread(const std::vector<ClusterNode*>& observers,
                                      const std::vector<absl::Time>& when, absl::Time t0) {
  std::string line;
  double worst = 0;
  for (size_t i = 0; i < observers.size(); ++i) {
    const double ms = when[i] == absl::InfinitePast() ? 1e9 : Ms(when[i] - t0);
    worst = std::max(worst, ms);
    absl::StrAppend(
        &line, observers[i]->name, " ",
        when[i] == absl::InfinitePast() ? std::string("never") : absl::StrCat(static_cast<int>(ms)),
        " ms  ");
  }
  return {line, worst};
}

// Every node of `nodes` lists every other one "up".
bool AllUp(Cluster& c, const std::vector<ClusterNode*>& nodes, absl::Duration timeout) {
  const auto when = c.WaitAll(
      nodes,
      [&](const ClusterNode& me, const v1::ListPeersResponse& peers) {
        for (ClusterNode* n : nodes) {
          if (n != &me && Cluster::StateOf(peers, n->name) != v1::PEER_STATE_UP) return false;
        }
        return true;
      },
      timeout);
  return std::none_of(when.begin(), when.end(),
                      [](absl::Time t) { return t == absl::InfinitePast(); });
}

TEST_CASE("4 daemons through etcd: many-to-many, a join, a kill, an etcd restart") {
  const std::string why = CannotRunCluster();
  if (!why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  // Root but no etcd: the set-up is incomplete, which is a failure, not a skip.
  const std::string no_etcd = MissingEtcd();
  INFO(no_etcd);
  REQUIRE(no_etcd.empty());
  const absl::Time test_start = absl::Now();
  Cluster c;
  INFO(c.error());
  REQUIRE(c.error().empty());
  REQUIRE(c.StartEtcd());
  for (const char* name : {"a", "b", "c", "d"}) {
    INFO(c.error());
    REQUIRE(c.AddNode(name) != nullptr);
  }
  std::vector<ClusterNode*> nodes = c.Running();
  {
    INFO(c.Logs());
    REQUIRE(AllUp(c, nodes, absl::Seconds(10)));
  }
  std::printf("cluster: 4 daemons up and peered through etcd %.0f ms after the test started\n",
              Ms(absl::Now() - test_start));

  Data d;
  for (ClusterNode* n : nodes) AddSource(d, *n);
  for (ClusterNode* to : nodes)
    for (ClusterNode* from : nodes)
      if (to != from) AddDestination(d, *to, *from);
  {
    const auto failures = AllToAll(d, nodes);
    INFO(absl::StrJoin(failures, "\n") << "\n" << c.Logs());
    CHECK(failures.empty());
  }

  // ---- a fifth node joins ----
  ClusterNode* e = c.AddNode("e");
  {
    INFO(c.error());
    REQUIRE(e != nullptr);
  }
  const auto listed = c.WaitAll(
      nodes,
      [](const ClusterNode&, const v1::ListPeersResponse& p) {
        return Cluster::StateOf(p, "e") != v1::PEER_STATE_UNSPECIFIED;
      },
      absl::Seconds(5));
  absl::Time registered = absl::InfinitePast();
  const auto up = c.WaitAll(
      nodes,
      [&](const ClusterNode&, const v1::ListPeersResponse& p) {
        if (registered == absl::InfinitePast()) registered = Cluster::RegisteredAt(p, "e");
        return Cluster::StateOf(p, "e") == v1::PEER_STATE_UP;
      },
      absl::Seconds(5));
  {
    const absl::Time t0 = registered != absl::InfinitePast() ? registered : e->started;
    const auto [listed_line, listed_worst] = Spread(nodes, listed, t0);
    const auto [up_line, up_worst] = Spread(nodes, up, t0);
    std::printf(
        "join: e registered in etcd %.0f ms after its process started\n"
        "join: listed by  %s(all: %.0f ms after registering)\n"
        "join: up (hello) %s(all: %.0f ms after registering)\n",
        registered == absl::InfinitePast() ? -1.0 : Ms(registered - e->started),
        listed_line.c_str(), listed_worst, up_line.c_str(), up_worst);
    INFO(up_line << "\n" << c.Logs());
    CHECK(registered != absl::InfinitePast());  // its etcd record is in everyone's ListPeers
    CHECK(up_worst < 1000.0);                   // seen by all within 1 s
  }
  nodes = c.Running();
  REQUIRE(nodes.size() == 5);
  {
    INFO(c.Logs());
    REQUIRE(AllUp(c, nodes, absl::Seconds(5)));  // e sees everyone too
  }
  AddSource(d, *e);
  for (ClusterNode* n : nodes) {
    if (n == e) continue;
    AddDestination(d, *e, *n);
    AddDestination(d, *n, *e);
  }
  {
    const auto failures = AllToAll(d, nodes);
    INFO(absl::StrJoin(failures, "\n") << "\n" << c.Logs());
    CHECK(failures.empty());
  }

  // ---- a node killed by pid mid-transfer ----
  ClusterNode* a = c.Find("a");
  ClusterNode* b = c.Find("b");
  ClusterNode* victim = c.Find("d");
  // a -> d layer-wise (layer 0 released, layer 1 after the kill); d -> b likewise, so b holds an
  // inbound record from d when it dies.
  auto to_victim_spec = Spec(d, *a, *victim, 15000);
  to_victim_spec.set_layerwise(true);
  auto from_victim_spec = Spec(d, *victim, *b, 15000);
  from_victim_spec.set_layerwise(true);
  auto to_victim = a->daemon->client->Submit(to_victim_spec);
  auto from_victim = victim->daemon->client->Submit(from_victim_spec);
  REQUIRE(to_victim.ok());
  REQUIRE(from_victim.ok());
  REQUIRE(a->daemon->client->MarkReady(to_victim->transfer_id(), 0, 1).ok());
  REQUIRE(victim->daemon->client->MarkReady(from_victim->transfer_id(), 0, 1).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const absl::Time killed = absl::Now();
  c.Kill(victim);
  REQUIRE(a->daemon->client->MarkReady(to_victim->transfer_id(), 1, 1).ok());
  const std::vector<ClusterNode*> survivors = c.Running();
  const auto down = c.WaitAll(
      survivors,
      [&](const ClusterNode&, const v1::ListPeersResponse& p) {
        return Cluster::StateOf(p, victim->name) == v1::PEER_STATE_DOWN;
      },
      absl::Seconds(10));
  {
    const auto [line, worst] = Spread(survivors, down, killed);
    std::printf(
        "kill: d marked down by  %s(all: %.0f ms after SIGKILL; liveness timeout %.0f ms)\n",
        line.c_str(), worst, Ms(kLiveness));
    INFO(line << "\n" << c.Logs());
    CHECK(worst < Ms(kLiveness) + 1000.0);
  }
  {
    auto failed = a->daemon->client->Wait(to_victim->transfer_id(), absl::Seconds(15));
    REQUIRE(failed.ok());
    INFO(failed->DebugString());
    CHECK(failed->state() == v1::TRANSFER_STATE_FAILED);
    CHECK(failed->error_code() == static_cast<int>(absl::StatusCode::kUnavailable));
    CHECK(failed->error_message().find("'d'") != std::string::npos);
    CHECK(Ms(absl::Now() - killed) < 15000.0);  // within its deadline
  }
  {
    // b's own record of d's transfer ends too.
    std::optional<v1::TransferStatus> inbound;
    for (int i = 0; i < 100 && !inbound; ++i) {
      auto list = b->daemon->client->ListTransfers();
      if (list.ok()) {
        for (const auto& t : list->transfers()) {
          // d's layer-wise transfer (not one of the earlier, finished ones from d).
          if (t.engine() == "fabric-receiver" &&
              t.path_reason().find(absl::StrCat("its transfer ", from_victim->transfer_id())) !=
                  std::string::npos) {
            inbound = t;
          }
        }
      }
      if (!inbound) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    REQUIRE(inbound.has_value());
    auto ended = b->daemon->client->Wait(inbound->transfer_id(), absl::Seconds(15));
    REQUIRE(ended.ok());
    INFO(ended->DebugString());
    CHECK(ended->state() == v1::TRANSFER_STATE_FAILED);
    CHECK(ended->error_code() == static_cast<int>(absl::StatusCode::kUnavailable));
  }
  {
    // The others keep moving data among themselves.
    const auto failures = AllToAll(d, survivors);
    INFO(absl::StrJoin(failures, "\n") << "\n" << c.Logs());
    CHECK(failures.empty());
  }

  // ---- d comes back (new boot id, same node id and address) and works again ----
  {
    INFO(c.error());
    REQUIRE(c.Restart(victim));
  }
  nodes = c.Running();
  {
    INFO(c.Logs());
    REQUIRE(AllUp(c, nodes, absl::Seconds(10)));
  }
  AddSource(d, *victim);
  for (ClusterNode* n : nodes) {
    if (n == victim) continue;
    AddDestination(d, *victim, *n);
    AddDestination(d, *n, *victim);
  }
  {
    const auto failures = AllToAll(d, nodes);
    INFO(absl::StrJoin(failures, "\n") << "\n" << c.Logs());
    CHECK(failures.empty());
  }

  // ---- etcd killed (longer than the lease TTL) and restarted: nothing between known peers
  // fails ----
  c.KillEtcd();
  const absl::Time outage = absl::Now();
  int rounds = 0;
  std::vector<std::string> failures;
  // A failed round ends the loops: later rounds would only repeat (and prolong) it.
  while (absl::Now() - outage < absl::Seconds(4) && failures.empty()) {  // TTL 2 s + 2 s
    for (std::string& f : AllToAll(d, nodes)) failures.push_back("during the outage: " + f);
    ++rounds;
  }
  {
    INFO(c.Logs());
    CHECK(AllUp(c, nodes, absl::Milliseconds(500)));
  }
  REQUIRE(c.StartEtcd());
  const absl::Time back = absl::Now();
  while (absl::Now() - back < absl::Seconds(3) && failures.empty()) {
    for (std::string& f : AllToAll(d, nodes)) failures.push_back("after the restart: " + f);
    ++rounds;
  }
  std::printf(
      "etcd: %d all-to-all rounds (%zu transfers each) during a %.1f s outage and after "
      "the restart: %zu failed\n",
      rounds, nodes.size() * (nodes.size() - 1), absl::ToDoubleSeconds(back - outage),
      failures.size());
  {
    INFO(absl::StrJoin(failures, "\n") << "\n" << c.Logs());
    CHECK(failures.empty());
    CHECK(AllUp(c, nodes, absl::Seconds(2)));
  }
  std::printf("cluster test: %.1f s\n", absl::ToDoubleSeconds(absl::Now() - test_start));
}

}  // namespace
}  // namespace kvrail::testing

// The cluster membership benchmark (root; run by hand): N kvraild daemons (default 16), each in its
// own network namespace, find each other through etcd; then, `trials` times each, a new node
// joins (time until every one of the N lists it, and until every one has it "up" after a Hello,
// from its etcd registration) and a node is killed by pid (time until every survivor lists it
// "down", from the SIGKILL). Prints a table; exits 1 when a target is missed (join seen by all
// within 1 s; kill seen by all within the liveness timeout, 2 s here).
//
//   bazel build //tests/cluster:cluster_bench && sudo bazel-bin/tests/cluster/cluster_bench \
//       [--nodes 16] [--trials 3]
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/cluster/cluster.h"

namespace kvrail::testing {
namespace {

constexpr double kLivenessMs = 2000;  // NsDaemon's fabric.liveness_timeout_ms

struct Row {
  std::string event;
  std::vector<double> ms;  // per observer (1e9: never)
  double target_ms;
};

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

std::vector<double> Since(const std::vector<absl::Time>& when, absl::Time t0) {
  std::vector<double> out;
  for (absl::Time t : when) out.push_back(t == absl::InfinitePast() ? 1e9 : Ms(t - t0));
  return out;
}

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

int Main(int argc, char** argv) {
  int nodes = 16, trials = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--nodes") == 0) nodes = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--trials") == 0) trials = std::atoi(argv[i + 1]);
  }
  const std::string why = CannotRunCluster() + MissingEtcd();
  if (!why.empty()) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return 0;
  }
  const absl::Time t_start = absl::Now();
  ClusterOptions options;
  options.log_level = "warn";
  Cluster c(options);
  if (!c.error().empty() || !c.StartEtcd()) {
    std::printf("set-up failed: %s\n", c.error().c_str());
    return 1;
  }
  for (int i = 1; i <= nodes; ++i) {
    char name[16];
    std::snprintf(name, sizeof(name), "n%02d", i);
    if (c.AddNode(name) == nullptr) {
      std::printf("set-up failed: %s\n", c.error().c_str());
      return 1;
    }
  }
  if (!AllUp(c, c.Running(), absl::Seconds(60))) {
    std::printf("the %d daemons did not all see each other up:\n%s\n", nodes, c.Logs().c_str());
    return 1;
  }
  std::printf("%d daemons up and peered through etcd after %.1f s\n", nodes,
              absl::ToDoubleSeconds(absl::Now() - t_start));
  std::vector<Row> rows;
  for (int t = 1; t <= trials; ++t) {
    // A new node joins; the N running before it observe.
    const std::vector<ClusterNode*> observers = c.Running();
    const std::string name = absl::StrCat("join", t);
    ClusterNode* joiner = c.AddNode(name);
    if (joiner == nullptr) {
      std::printf("join %d failed: %s\n", t, c.error().c_str());
      return 1;
    }
    const auto listed = c.WaitAll(
        observers,
        [&](const ClusterNode&, const v1::ListPeersResponse& p) {
          return Cluster::StateOf(p, name) != v1::PEER_STATE_UNSPECIFIED;
        },
        absl::Seconds(10));
    absl::Time registered = absl::InfinitePast();
    const auto up = c.WaitAll(
        observers,
        [&](const ClusterNode&, const v1::ListPeersResponse& p) {
          if (registered == absl::InfinitePast()) registered = Cluster::RegisteredAt(p, name);
          return Cluster::StateOf(p, name) == v1::PEER_STATE_UP;
        },
        absl::Seconds(10));
    const absl::Time t0 = registered != absl::InfinitePast() ? registered : joiner->started;
    rows.push_back(
        {absl::StrCat("join ", t, ": listed by all ", observers.size()), Since(listed, t0), 1000});
    rows.push_back(
        {absl::StrCat("join ", t, ": up (hello) in all ", observers.size()), Since(up, t0), 1000});
    std::printf("join %d: registered %.0f ms after its process started\n", t,
                registered == absl::InfinitePast() ? -1.0 : Ms(registered - joiner->started));
    // Let the joiner settle before the next event (everyone up with everyone).
    AllUp(c, c.Running(), absl::Seconds(10));
  }
  for (int t = 1; t <= trials; ++t) {
    ClusterNode* victim = c.Running()[static_cast<size_t>(t)];  // n02, n03, ...
    const absl::Time killed = absl::Now();
    c.Kill(victim);
    const std::vector<ClusterNode*> survivors = c.Running();
    const auto down = c.WaitAll(
        survivors,
        [&](const ClusterNode&, const v1::ListPeersResponse& p) {
          return Cluster::StateOf(p, victim->name) == v1::PEER_STATE_DOWN;
        },
        absl::Seconds(15));
    rows.push_back(
        {absl::StrCat("kill ", t, " (", victim->name, "): down in all ", survivors.size()),
         Since(down, killed), kLivenessMs});
  }
  bool ok = true;
  std::printf(
      "\n| event | observers | min ms | median ms | max ms | target ms | met |\n"
      "|---|---|---|---|---|---|---|\n");
  for (Row& r : rows) {
    std::sort(r.ms.begin(), r.ms.end());
    const bool met = r.ms.back() <= r.target_ms;
    ok = ok && met;
    std::printf("| %s | %zu | %.0f | %.0f | %.0f | %.0f | %s |\n", r.event.c_str(), r.ms.size(),
                r.ms.front(), r.ms[r.ms.size() / 2], r.ms.back(), r.target_ms, met ? "yes" : "NO");
  }
  std::printf("\ntotal %.1f s\n", absl::ToDoubleSeconds(absl::Now() - t_start));
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace kvrail::testing

int main(int argc, char** argv) { return kvrail::testing::Main(argc, argv); }

// The etcd directory against a real etcd (Debian's etcd-server) started here on loopback: two
// directories see each other; one's lease ends and the other marks it down within TTL + 1 s;
// etcd killed: peers stay, state degraded; etcd restarted: ok again, registered again. Fails
// (does not skip) when the etcd binary is missing: CI installs etcd-server.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/directory/etcd_directory.h"
#include "daemon/directory/etcd_test_server.h"
#include "daemon/directory/node_record.h"

namespace kvrail::directory {
namespace {

constexpr char kPrefix[] = "/kvrail/live-test/nodes/";
constexpr int kTtl = 2;

std::unique_ptr<Directory> Open(const std::string& endpoint, const std::string& self,
                                bool revoke_on_close = true, const std::string& username = "",
                                const std::string& password = "") {
  EtcdClientOptions client;
  client.endpoints = {endpoint};
  client.username = username;
  client.password = password;
  client.call_timeout = absl::Seconds(1);
  auto c = CreateGrpcEtcdClient(client);
  REQUIRE(c.ok());
  NodeRecordInputs in;
  in.node_id = self;
  in.address = absl::StrCat("127.0.0.1:", 7000 + self[0]);
  in.instance_id = self == "a" ? "aaaaaaaaaaaaaaaa" : "bbbbbbbbbbbbbbbb";
  in.topology.add_gpus()->set_uuid("GPU-" + self);
  in.now = absl::Now();
  EtcdDirectoryOptions o;
  o.self = self;
  o.prefix = kPrefix;
  o.ttl_s = kTtl;
  o.record = BuildNodeRecord(in);
  o.endpoints = {endpoint};
  o.backoff_initial = absl::Milliseconds(100);
  o.backoff_max = absl::Milliseconds(500);
  o.revoke_on_close = revoke_on_close;
  auto d = CreateEtcdDirectory(o, *std::move(c));
  REQUIRE(d.ok());
  return *std::move(d);
}

using testing::Eventually;

TEST_CASE("etcd directory against a real etcd: membership, lease end, outage, restart") {
  testing::EtcdTestServer etcd;
  const absl::Status started = etcd.Start();  // fails (not skips) without the etcd binary
  INFO(started.ToString());
  REQUIRE(started.ok());

  std::unique_ptr<Directory> a = Open(etcd.endpoint(), "a");
  std::unique_ptr<Directory> b = Open(etcd.endpoint(), "b", /*revoke_on_close=*/false);
  REQUIRE(a->Status().state() == v1::DIRECTORY_STATE_OK);
  REQUIRE(b->Status().state() == v1::DIRECTORY_STATE_OK);
  auto sees = [](Directory& d, const std::string& node) {
    auto p = d.Lookup(node);
    return p.ok() && p->registered;
  };
  REQUIRE(Eventually([&] { return sees(*a, "b") && sees(*b, "a"); }, absl::Seconds(2)));
  CHECK(a->Lookup("b")->record.gpus(0).uuid() == "GPU-b");
  CHECK(a->Lookup("b")->address == absl::StrCat("127.0.0.1:", 7000 + 'b'));
  a->MarkUp("b", absl::Now(), 1);
  CHECK(a->Lookup("b")->state == PeerState::kUp);

  SECTION("a lease that ends marks the peer down for the other within TTL + 1 s") {
    b.reset();  // its keep-alives stop; the lease is left to expire
    const absl::Time stopped = absl::Now();
    REQUIRE(Eventually([&] { return a->Lookup("b")->state == PeerState::kDown; },
                       absl::Seconds(kTtl + 1)));
    const absl::Duration took = absl::Now() - stopped;
    INFO("marked down after " << absl::FormatDuration(took));
    CHECK(took <= absl::Seconds(kTtl + 1));
    CHECK(a->Peers().size() == 1);  // still listed
    CHECK(!a->Lookup("b")->registered);
    // It comes back (a new daemon run): up-able again.
    b = Open(etcd.endpoint(), "b");
    REQUIRE(Eventually([&] { return sees(*a, "b"); }, absl::Seconds(2)));
    CHECK(a->Lookup("b")->state == PeerState::kUnknown);
  }

  SECTION("etcd killed: peers stay, degraded; restarted: ok and registered again") {
    etcd.Kill();
    REQUIRE(Eventually([&] { return a->Status().state() == v1::DIRECTORY_STATE_DEGRADED; },
                       absl::Seconds(5)));
    REQUIRE(Eventually([&] { return b->Status().state() == v1::DIRECTORY_STATE_DEGRADED; },
                       absl::Seconds(5)));
    CHECK(!a->Status().last_error().empty());
    CHECK(a->Status().reason().find("etcd unreachable") != std::string::npos);
    REQUIRE(a->Peers().size() == 1);
    CHECK(a->Lookup("b")->state == PeerState::kUp);  // nothing dropped because etcd is gone
    // Longer than the TTL: the leases may expire meanwhile; the peers still stay.
    absl::SleepFor(absl::Seconds(kTtl + 1));
    CHECK(a->Lookup("b")->state == PeerState::kUp);

    REQUIRE(etcd.Start().ok());
    REQUIRE(Eventually(
        [&] {
          return a->Status().state() == v1::DIRECTORY_STATE_OK &&
                 b->Status().state() == v1::DIRECTORY_STATE_OK;
        },
        absl::Seconds(10)));
    CHECK(a->Status().registrations() >= 2);
    CHECK(b->Status().registrations() >= 2);
    REQUIRE(Eventually([&] { return sees(*a, "b") && sees(*b, "a"); }, absl::Seconds(3)));
  }
  a.reset();
  b.reset();
}

// etcdctl (beside the etcd binary) against `endpoint` with `args`; its exit status.
int Etcdctl(const std::string& endpoint, std::vector<std::string> args) {
  const std::string etcd = testing::EtcdBinaryOrEmpty();
  const std::string etcdctl = (std::filesystem::path(etcd).parent_path() / "etcdctl").string();
  args.insert(args.begin(), {etcdctl, "--endpoints=" + endpoint});
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("ETCDCTL_API", "3", 1);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// etcd user/password authentication (EtcdDirectoryConfig.username / password_file) against a real
// etcd with `auth enable`: the right password registers and sees its peer; a wrong one is
// degraded with a reason naming the config keys (and not the password); after etcd restarts
// (its simple tokens are gone: "invalid auth token") the directory authenticates again.
TEST_CASE("forged lease-less records: a node repairs its own, peers ignore them") {
  // A record without a lease never expires. Put over a node's own key it used to stand (the node
  // re-put only deleted records): peers dialled its forged address while it said "etcd ok".
  testing::EtcdTestServer etcd;
  const absl::Status started = etcd.Start();
  INFO(started.ToString());
  REQUIRE(started.ok());
  std::unique_ptr<Directory> a = Open(etcd.endpoint(), "a");
  std::unique_ptr<Directory> b = Open(etcd.endpoint(), "b");
  const std::string real = absl::StrCat("127.0.0.1:", 7000 + 'a');
  REQUIRE(Eventually([&] { return b->Lookup("a").ok() && b->Lookup("a")->registered; },
                     absl::Seconds(2)));
  REQUIRE(b->Lookup("a")->address == real);

  EtcdClientOptions raw_options;
  raw_options.endpoints = {etcd.endpoint()};
  auto raw = CreateGrpcEtcdClient(raw_options);
  REQUIRE(raw.ok());
  auto forged = [](const std::string& node) {
    NodeRecordInputs in;
    in.node_id = node;
    in.address = "10.66.66.66:1";
    in.instance_id = "ffffffffffffffff";
    in.now = absl::Now();
    return EncodeNodeRecord(BuildNodeRecord(in));
  };
  // a's own key overwritten without a lease, and a node that does not exist.
  const std::string forged_a = forged("a");
  REQUIRE((*raw)->Put(std::string(kPrefix) + "a", forged_a, 0).ok());
  REQUIRE((*raw)->Put(std::string(kPrefix) + "x", forged("x"), 0).ok());

  // a puts its record back under its lease; b never takes the forged address nor the
  // lease-less node; a says ok throughout.
  bool forged_seen = false;
  const absl::Time until = absl::Now() + absl::Seconds(kTtl + 2);
  bool repaired = false;
  while (absl::Now() < until && !repaired) {
    auto range = (*raw)->RangePrefix(std::string(kPrefix) + "a");
    REQUIRE(range.ok());
    for (const EtcdKv& kv : range->kvs) {
      if (kv.key == std::string(kPrefix) + "a" && kv.lease != 0 && kv.value != forged_a) {
        repaired = true;
      }
    }
    auto seen = b->Lookup("a");
    if (seen.ok() && seen->address != real) forged_seen = true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  CHECK(repaired);  // before: the forged record stayed, with no lease, for good
  CHECK_FALSE(forged_seen);
  CHECK(a->Status().state() == v1::DIRECTORY_STATE_OK);
  REQUIRE(Eventually([&] { return b->Lookup("a").ok() && b->Lookup("a")->registered; },
                     absl::Seconds(2)));
  CHECK(b->Lookup("a")->address == real);
  CHECK_FALSE(b->Lookup("x").ok());
  CHECK_FALSE(a->Lookup("x").ok());
  // A directory that starts now, with the lease-less "x" in its first range, ignores it too.
  std::unique_ptr<Directory> c = Open(etcd.endpoint(), "c");
  REQUIRE(Eventually([&] { return c->Lookup("a").ok() && c->Lookup("a")->registered; },
                     absl::Seconds(2)));
  CHECK(c->Lookup("a")->address == real);
  CHECK_FALSE(c->Lookup("x").ok());
}

TEST_CASE("etcd directory with etcd authentication enabled") {
  testing::EtcdTestServer etcd;
  const absl::Status started = etcd.Start();
  INFO(started.ToString());
  REQUIRE(started.ok());
  const std::string password = "pw-Live-4471";
  REQUIRE(Etcdctl(etcd.endpoint(), {"user", "add", "root:" + password}) == 0);
  REQUIRE(Etcdctl(etcd.endpoint(), {"auth", "enable"}) == 0);

  std::unique_ptr<Directory> a = Open(etcd.endpoint(), "a", true, "root", password);
  std::unique_ptr<Directory> b = Open(etcd.endpoint(), "b", true, "root", password);
  INFO(a->Status().ShortDebugString());
  REQUIRE(a->Status().state() == v1::DIRECTORY_STATE_OK);
  REQUIRE(b->Status().state() == v1::DIRECTORY_STATE_OK);
  auto sees = [](Directory& d, const std::string& node) {
    auto p = d.Lookup(node);
    return p.ok() && p->registered;
  };
  REQUIRE(Eventually([&] { return sees(*a, "b") && sees(*b, "a"); }, absl::Seconds(3)));

  // A wrong password: degraded, the reason names the config keys, never the password.
  const std::string wrong = "wrong-Pw-0093";
  std::unique_ptr<Directory> c = Open(etcd.endpoint(), "c", true, "root", wrong);
  const v1::DirectoryStatus refused = c->Status();
  INFO(refused.ShortDebugString());
  CHECK(refused.state() == v1::DIRECTORY_STATE_DEGRADED);
  CHECK(refused.reason().find("etcd refused this daemon") != std::string::npos);
  CHECK(refused.reason().find("etcd.username 'root'") != std::string::npos);
  CHECK(refused.reason().find("etcd.password_file") != std::string::npos);
  CHECK(refused.ShortDebugString().find(wrong) == std::string::npos);
  CHECK(refused.ShortDebugString().find(password) == std::string::npos);
  CHECK(!sees(*a, "c"));
  // Without a user at all: degraded too, saying which keys to set.
  std::unique_ptr<Directory> d = Open(etcd.endpoint(), "d");
  INFO(d->Status().ShortDebugString());
  CHECK(d->Status().state() == v1::DIRECTORY_STATE_DEGRADED);
  CHECK(d->Status().reason().find("set etcd.username and etcd.password_file") != std::string::npos);

  // etcd restarts: the tokens it issued are gone; both directories authenticate again.
  const uint64_t before = a->Status().registrations();
  etcd.Kill();
  REQUIRE(etcd.Start().ok());
  REQUIRE(Eventually(
      [&] {
        return a->Status().state() == v1::DIRECTORY_STATE_OK &&
               a->Status().registrations() > before &&
               b->Status().state() == v1::DIRECTORY_STATE_OK;
      },
      absl::Seconds(15)));
  REQUIRE(Eventually([&] { return sees(*a, "b") && sees(*b, "a"); }, absl::Seconds(3)));
  c.reset();
  d.reset();
  a.reset();
  b.reset();
}

}  // namespace
}  // namespace kvrail::directory

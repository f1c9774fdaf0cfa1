// The etcd directory against a real etcd (Debian's etcd-server) started here on loopback: two
// directories see each other; one's lease ends and the other marks it down within TTL + 1 s;
// etcd killed: peers stay, state degraded; etcd restarted: ok again, registered again. Fails
// (does not skip) when the etcd binary is missing: CI installs etcd-server.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>



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
                                bool revoke_on_close = true) {
  EtcdClientOptions client;
  client.endpoints = {endpoint};
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

template <typename Pred>
bool Eventually(Pred pred, absl::Duration limit) {
  const absl::Time until = absl::Now() + limit;
  while (absl::Now() < until) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return pred();
}

TEST_CASE("etcd directory against a real etcd: membership, lease end, outage, restart") {
  testing::EtcdTestServer etcd;
  const absl::Status started = etcd.Start();  // fails (not skips) without the etcd binary
  INFO(started.ToString());
  REQUIRE(started.ok());

  std::unique_ptr<Directory> a = Open(etcd.endpoint(), "a");
  std::unique_ptr<Directory> b = Open(etcd.endpoint(), "b", /*revoke_on_close=*/false);
  REQUIRE(a->Status().state() == "ok");
  REQUIRE(b->Status().state() == "ok");
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
    REQUIRE(Eventually([&] { return a->Status().state() == "degraded"; }, absl::Seconds(5)));
    REQUIRE(Eventually([&] { return b->Status().state() == "degraded"; }, absl::Seconds(5)));
    CHECK(!a->Status().last_error().empty());
    CHECK(a->Status().reason().find("etcd unreachable") != std::string::npos);
    REQUIRE(a->Peers().size() == 1);
    CHECK(a->Lookup("b")->state == PeerState::kUp);  // nothing dropped because etcd is gone
    // Longer than the TTL: the leases may expire meanwhile; the peers still stay.
    absl::SleepFor(absl::Seconds(kTtl + 1));
    CHECK(a->Lookup("b")->state == PeerState::kUp);

    REQUIRE(etcd.Start().ok());
    REQUIRE(Eventually([&] { return a->Status().state() == "ok" && b->Status().state() == "ok"; },
                       absl::Seconds(10)));
    CHECK(a->Status().registrations() >= 2);
    CHECK(b->Status().registrations() >= 2);
    REQUIRE(Eventually([&] { return sees(*a, "b") && sees(*b, "a"); }, absl::Seconds(3)));
  }
  a.reset();
  b.reset();
}

}  // namespace
}  // namespace kvrail::directory

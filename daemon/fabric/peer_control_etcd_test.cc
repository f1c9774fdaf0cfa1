// A peer whose etcd record changes its Peer address (same node id: the daemon
// moved or restarted elsewhere) is re-dialed by peer control: its old entry (stub, lanes) is
// retired, its transfers fail naming both addresses, and Hello goes to the new address. Against a
// real etcd (Debian's etcd-server, started here on loopback; fails without it, like the
// directory's live test) with the real etcd directory; the "peer" is a Peer service that only
// counts hellos, at two addresses. Before, the entry kept its first stub: hellos went on to the
// old address.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/directory/etcd_directory.h"
#include "daemon/directory/etcd_test_server.h"
#include "daemon/directory/node_record.h"
#include "daemon/fabric/lanes.h"
#include "daemon/fabric/peer_control.h"
#include "daemon/fabric/peers.h"
#include "daemon/fabric/testing/counting_peer.h"

namespace kvrail::fabric {
namespace {

constexpr char kPrefix[] = "/kvrail/redial-test/nodes/";

std::unique_ptr<directory::Directory> Open(const std::string& endpoint, const std::string& self,
                                           const std::string& address,
                                           const std::string& instance) {
  directory::EtcdClientOptions client;
  client.endpoints = {endpoint};
  client.call_timeout = absl::Seconds(1);
  auto c = directory::CreateGrpcEtcdClient(client);
  REQUIRE(c.ok());
  directory::NodeRecordInputs in;
  in.node_id = self;
  in.address = address;
  in.instance_id = instance;
  in.now = absl::Now();
  directory::EtcdDirectoryOptions o;
  o.self = self;
  o.prefix = kPrefix;
  o.ttl_s = 2;
  o.record = directory::BuildNodeRecord(in);
  o.endpoints = {endpoint};
  o.backoff_initial = absl::Milliseconds(100);
  o.backoff_max = absl::Milliseconds(500);
  auto d = directory::CreateEtcdDirectory(o, *std::move(c));
  REQUIRE(d.ok());
  return *std::move(d);
}

using directory::testing::Eventually;

using Server = testing::CountingPeerServer;

TEST_CASE("a peer whose etcd record names a new address is re-dialed at it") {
  directory::testing::EtcdTestServer etcd;
  const absl::Status started = etcd.Start();  // fails (not skips) without the etcd binary
  INFO(started.ToString());
  REQUIRE(started.ok());

  FabricOptions options;
  options.node_id = "self";
  options.slots = 4;
  options.slot_bytes = 64 << 10;
  options.nic_addresses = {"127.0.0.1"};
  PeerTable table;
  auto lanes = Lanes::Create(options, &table);
  if (!lanes.ok()) {
    WARN("SKIP: " << lanes.status().ToString());
    return;
  }
  Server old_place, new_place;
  std::unique_ptr<directory::Directory> self =
      Open(etcd.endpoint(), "self", "127.0.0.1:1", "5e1f5e1f5e1f5e1f");
  std::unique_ptr<directory::Directory> m =
      Open(etcd.endpoint(), "m", old_place.address, "aaaaaaaaaaaaaaaa");
  absl::Mutex lost_mu;
  std::vector<std::string> lost;
  auto control = PeerControl::Create(options, 1, lanes->get(), &table, self.get(),
                                     [&](PeerConn*, const absl::Status& why) {
                                       absl::MutexLock lock(&lost_mu);
                                       lost.push_back(std::string(why.message()));
                                     });
  REQUIRE(Eventually(
      [&] {
        control->SyncDirectory();
        return table.Find("m") != nullptr;
      },
      absl::Seconds(3)));
  PeerConn* before = table.Find("m");
  CHECK(before->address == old_place.address);
  CHECK_FALSE(control->Introduce(before).ok());
  CHECK(old_place.service.hellos.load() == 1);
  {
    absl::MutexLock lock(&before->mu);
    before->introduced = true;
    before->up = true;
  }

  // "m" moves: its daemon stops (lease left to run out: no revoke) and starts again with
  // another Peer address; its new record replaces the old one under the same key.
  m.reset();
  m = Open(etcd.endpoint(), "m", new_place.address, "bbbbbbbbbbbbbbbb");
  REQUIRE(Eventually(
      [&] {
        control->SyncDirectory();
        PeerConn* now = table.Find("m");
        return now != nullptr && now != before;
      },
      absl::Seconds(5)));
  PeerConn* after = table.Find("m");
  CHECK(after->address == new_place.address);
  CHECK(before->retired.load());
  {
    absl::MutexLock lock(&lost_mu);
    REQUIRE(lost.size() == 1);
    CHECK(lost[0].find(absl::StrCat("'m' moved from ", old_place.address, " to ",
                                    new_place.address)) != std::string::npos);
  }
  CHECK_FALSE(control->Introduce(after).ok());
  CHECK(new_place.service.hellos.load() == 1);
  CHECK(old_place.service.hellos.load() == 1);
  control->Stop();
  m.reset();
  self.reset();
}

}  // namespace
}  // namespace kvrail::fabric

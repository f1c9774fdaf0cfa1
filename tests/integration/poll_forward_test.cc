// PollNotifications after a handover (Server::ForwardChanges): the predecessor forwards the call
// to its successor without holding a thread, with the caller's credentials, and the successor's
// answer is the answer - an immediate one and one that waits for a notification queued there.
// Two daemons' tables and gRPC servers in this process (host engine), each on a unix socket in a
// temporary folder; the session moves to the successor as a hot restart moves it
// (SessionTable::ExportState / ImportState).
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/clock.h"
#include "base/unique_fd.h"
#include "daemon/access/access.h"
#include "daemon/engine/host_engine.h"
#include "daemon/regions/regions.h"
#include "daemon/server/server.h"
#include "daemon/sessions/sessions.h"
#include "daemon/transfers/engine_registry.h"
#include "daemon/transfers/notifications.h"
#include "daemon/transfers/transfers.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "wire/session_wire.h"

namespace kvrail::testing {
using server::Server;
using server::ServerOptions;
namespace {

// One daemon's tables, manager and gRPC server on <folder>/kvrail.sock.
struct Node {
  explicit Node(const std::string& folder) {
    sessions = sessions::SessionTable::Create();
    regions = regions::RegionTable::Create(Clock::Real(), sessions.get());
    grants = access::Grants::Create(Clock::Real(), sessions.get(), regions.get());
    hub = transfers::NotificationHub::Create(
        [t = sessions.get()](uint64_t s) { return t->SessionOpen(s); });
    sessions->AddSessionEndHook([h = hub.get()](uint64_t s) { h->EndSession(s); });
    engine = engine::CreateHostEngine(1);
    transfers::Options options;
    options.node_id = "node";
    options.notifications = hub.get();
    transfers::EngineRegistry engines;
    engines.Add(engine.get());
    manager = transfers::TransferManager::Create(regions.get(), grants.get(), engines,
                                                 Clock::Real(), options);
    address = "unix:" + folder + "/kvrail.sock";
    ServerOptions server_options;
    server_options.listen = {address};
    server_options.node_id = "node";
    server_options.notifications = hub.get();
    auto started =
        Server::Start(server_options, sessions.get(), regions.get(), grants.get(), manager.get());
    REQUIRE(started.ok());
    server = *std::move(started);
    stub = v1::Transfer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  ~Node() { server->Shutdown(absl::Seconds(1)); }

  std::unique_ptr<sessions::SessionTable> sessions;
  std::unique_ptr<regions::RegionTable> regions;
  std::unique_ptr<access::Grants> grants;
  std::unique_ptr<transfers::NotificationHub> hub;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<transfers::TransferManager> manager;
  std::string address;
  std::unique_ptr<Server> server;
  std::unique_ptr<v1::Transfer::Stub> stub;
};

std::string Folder() {
  char tmpl[] = "/tmp/kvrail-poll-forward.XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}

v1::Notification Note(const std::string& text) {
  v1::Notification n;
  n.set_notification(text);
  return n;
}

TEST_CASE("after a handover PollNotifications is answered by the successor") {
  const std::string folder_a = Folder(), folder_b = Folder();
  {
    Node predecessor(folder_a);
    Node successor(folder_b);
    const uint64_t session = predecessor.sessions->BeginSession();
    const std::string credential =
        wire::SessionMetadataValue(session, predecessor.sessions->SessionSecret(session));
    handover::RegionTableState state;
    std::vector<UniqueFd> fds;
    REQUIRE(predecessor.sessions->ExportState(&state, &fds).ok());
    REQUIRE(successor.sessions->ImportState(state, &fds).ok());
    REQUIRE(successor.hub->Deliver(session, Note("queued on the successor")));

    auto poll = [&](uint32_t timeout_ms, v1::NotificationPollResponse* response) {
      grpc::ClientContext context;
      context.AddMetadata(wire::kSessionMetadataKey, credential);
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
      v1::NotificationPollRequest request;
      request.set_session_id(session);
      request.set_timeout_ms(timeout_ms);
      return predecessor.stub->PollNotifications(&context, request, response);
    };
    // Before the handover the predecessor answers from its own (empty) queue.
    v1::NotificationPollResponse here;
    REQUIRE(poll(0, &here).ok());
    CHECK(here.notifications_size() == 0);

    predecessor.server->ForwardChanges(successor.address);
    v1::NotificationPollResponse forwarded;
    const grpc::Status answered = poll(0, &forwarded);
    INFO(answered.error_message());
    REQUIRE(answered.ok());
    REQUIRE(forwarded.notifications_size() == 1);
    CHECK(forwarded.notifications(0).notification() == "queued on the successor");

    // A poll that waits: answered by the successor when its notification is queued there.
    absl::Notification delivered;
    std::thread later([&] {
      absl::SleepFor(absl::Milliseconds(200));
      successor.hub->Deliver(session, Note("later"));
      delivered.Notify();
    });
    const absl::Time asked = absl::Now();
    v1::NotificationPollResponse waited;
    const grpc::Status waited_status = poll(10000, &waited);
    const absl::Duration took = absl::Now() - asked;
    later.join();
    REQUIRE(waited_status.ok());
    REQUIRE(waited.notifications_size() == 1);
    CHECK(waited.notifications(0).notification() == "later");
    CHECK(took < absl::Seconds(5));

    // With no successor to call, UNAVAILABLE.
    predecessor.server->ForwardChanges("");
    v1::NotificationPollResponse none;
    const grpc::Status refused = poll(0, &none);
    CHECK(refused.error_code() == grpc::StatusCode::UNAVAILABLE);
  }
  std::filesystem::remove_all(folder_a);
  std::filesystem::remove_all(folder_b);
}

}  // namespace
}  // namespace kvrail::testing

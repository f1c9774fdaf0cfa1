// ChangeGate: held changes wait, Hold waits for running ones, Resume lets them in, Forward
// sends them on (with no successor they are refused UNAVAILABLE).
#include "daemon/server/change_gate.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace kvrail::server {
namespace {

TEST_CASE("Hold waits for the running change; a change entering while held waits for Resume") {
  ChangeGate gate;
  REQUIRE(gate.Enter() == ChangeGate::Mode::kServe);  // a change runs
  std::atomic<bool> held{false};
  std::thread holder([&] {
    gate.Hold();
    held.store(true);
  });
  absl::SleepFor(absl::Milliseconds(50));
  CHECK_FALSE(held.load());  // the running change has not left
  gate.Leave();
  holder.join();
  CHECK(held.load());

  std::atomic<bool> entered{false};
  std::thread change([&] {
    CHECK(gate.Enter() == ChangeGate::Mode::kServe);
    entered.store(true);
    gate.Leave();
  });
  absl::SleepFor(absl::Milliseconds(50));
  CHECK_FALSE(entered.load());  // held
  gate.Resume();
  change.join();
  CHECK(entered.load());
  CHECK_FALSE(gate.forwarding());
}

TEST_CASE("after Forward with no successor, held changes are released and refused UNAVAILABLE") {
  ChangeGate gate;
  gate.Hold();
  absl::Notification done;
  ChangeGate::Mode mode = ChangeGate::Mode::kHold;
  std::thread change([&] {
    mode = gate.Enter();
    done.Notify();
  });
  CHECK_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  gate.Forward("");
  change.join();
  CHECK(mode == ChangeGate::Mode::kForward);
  CHECK(gate.forwarding());
  CHECK(gate.successor() == nullptr);
  gate.Resume();  // a forwarding gate stays forwarding
  gate.Hold();    // and is never held again
  CHECK(gate.Enter() == ChangeGate::Mode::kForward);

  grpc::ServerContext context;
  bool called = false;
  const grpc::Status status =
      ForwardCall(context, gate.successor(), [&](v1::Transfer::Stub*, grpc::ClientContext*) {
        called = true;
        return grpc::Status::OK;
      });
  CHECK_FALSE(called);
  CHECK(status.error_code() == grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace kvrail::server

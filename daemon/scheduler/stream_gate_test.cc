// The GPU-side readiness wait's pure decisions (scheduler::StreamGate): when a gated layer-wise
// job waits on the GPU, the release of a dying producer's pending waits (never moving an epoch
// back, at once only when the producer is gone), what aborted gated tiles report, and the per-GPU
// stream slots.
#include "daemon/scheduler/stream_gate.h"

#include <catch2/catch.hpp>

namespace kvrail::scheduler {
namespace {

GateInputs Eligible() {
  GateInputs in;
  in.enabled = true;
  in.flags_mapped = true;
  in.kernel_mode = true;
  in.digest = false;
  in.waiting_jobs = 0;
  in.max_jobs = 8;
  return in;
}

TEST_CASE("ChooseGate: the stream wait only where an aborted layer can be skipped") {
  CHECK(ChooseGate(Eligible()).stream_wait);
  CHECK(ChooseGate(Eligible()).reason.find("cuStreamWaitValue32") != std::string::npos);
  GateInputs in = Eligible();
  in.enabled = false;
  CHECK(!ChooseGate(in).stream_wait);
  CHECK(ChooseGate(in).reason.find("cuda_stream_wait off") != std::string::npos);
  // On, but the engine could not make what the wait needs: not said to be off.
  in = Eligible();
  in.ready = false;
  CHECK(!ChooseGate(in).stream_wait);
  CHECK(ChooseGate(in).reason.find("cuda_stream_wait off") == std::string::npos);
  CHECK(ChooseGate(in).reason.find("abort page") != std::string::npos);
  in = Eligible();
  in.flags_mapped = false;
  CHECK(!ChooseGate(in).stream_wait);
  in = Eligible();
  in.kernel_mode = false;  // copy engines: a released wait would let them copy
  CHECK(!ChooseGate(in).stream_wait);
  CHECK(ChooseGate(in).reason.find("copy engines") != std::string::npos);
  in = Eligible();
  in.digest = true;
  CHECK(!ChooseGate(in).stream_wait);
  in = Eligible();
  in.waiting_jobs = 8;
  CHECK(!ChooseGate(in).stream_wait);
  CHECK(ChooseGate(in).reason.find("cuda_stream_wait_jobs 8") != std::string::npos);
  in.waiting_jobs = 7;
  CHECK(ChooseGate(in).stream_wait);
}

TEST_CASE("ReleaseStore never moves an epoch back, across the 32-bit wrap") {
  CHECK(ReleaseStore(4, 5) == std::optional<uint32_t>(5));
  CHECK(!ReleaseStore(5, 5).has_value());
  CHECK(!ReleaseStore(6, 5).has_value());
  CHECK(ReleaseStore(0xFFFFFFFFu, 1) == std::optional<uint32_t>(1));  // before the wrap
  CHECK(!ReleaseStore(2, 0xFFFFFFFFu).has_value());                   // after the wrap
  CHECK(ReleaseStore(0, 0x7FFFFFFFu) == std::optional<uint32_t>(0x7FFFFFFFu));
}

TEST_CASE("ReleaseNow: at once for a gone producer, after the grace for a live one") {
  const absl::Duration grace = absl::Seconds(1);
  CHECK(ReleaseNow(GateEnd::kProducerGone, absl::ZeroDuration(), grace));
  CHECK(!ReleaseNow(GateEnd::kOther, absl::ZeroDuration(), grace));
  CHECK(!ReleaseNow(GateEnd::kOther, absl::Milliseconds(999), grace));
  CHECK(ReleaseNow(GateEnd::kOther, absl::Seconds(1), grace));
}

GateWatchInputs Live() {
  GateWatchInputs in;
  in.grace = absl::Seconds(1);
  in.bound = absl::Milliseconds(500);
  in.waits_pending = true;
  in.dispatcher_silent_for = absl::Milliseconds(1);
  return in;
}

TEST_CASE("DecideGateRelease: an ended job follows the grace rule, whatever else holds") {
  GateWatchInputs in = Live();
  in.ended = true;
  in.producer_gone = true;
  CHECK(DecideGateRelease(in).cause == GateReleaseCause::kEnded);
  in.producer_gone = false;
  in.since_end = absl::Milliseconds(10);
  in.sync_blocked_for = absl::Seconds(5);  // the end decides, not the call
  CHECK(!DecideGateRelease(in).release());
  in.since_end = absl::Seconds(1);
  CHECK(DecideGateRelease(in).cause == GateReleaseCause::kEnded);
}

TEST_CASE(
    "DecideGateRelease: a context-synchronizing call blocked for the bound releases a live job") {
  GateWatchInputs in = Live();
  CHECK(!DecideGateRelease(in).release());  // nothing blocked
  in.sync_blocked_for = absl::Milliseconds(499);
  in.sync_what = "cudaIpcOpenMemHandle";
  CHECK(!DecideGateRelease(in).release());
  in.sync_blocked_for = absl::Milliseconds(500);
  const GateReleaseDecision d = DecideGateRelease(in);
  CHECK(d.cause == GateReleaseCause::kContextSync);
  CHECK(d.why.code() == absl::StatusCode::kUnavailable);
  INFO(d.why.message());
  CHECK(std::string(d.why.message()).find("cudaIpcOpenMemHandle") != std::string::npos);
  CHECK(std::string(d.why.message()).find("500 ms") != std::string::npos);
  // Its words all reached: the waits pass by themselves, nothing to release.
  in.waits_pending = false;
  CHECK(!DecideGateRelease(in).release());
  // A zero bound: never for a call.
  in.waits_pending = true;
  in.bound = absl::ZeroDuration();
  CHECK(!DecideGateRelease(in).release());
}

TEST_CASE("DecideGateRelease: a dispatcher silent for the bound releases a live job") {
  GateWatchInputs in = Live();
  in.dispatcher_silent_for = absl::Milliseconds(499);
  CHECK(!DecideGateRelease(in).release());
  in.dispatcher_silent_for = absl::Milliseconds(600);
  const GateReleaseDecision d = DecideGateRelease(in);
  CHECK(d.cause == GateReleaseCause::kDispatcherStuck);
  CHECK(std::string(d.why.message()).find("dispatcher") != std::string::npos);
  in.waits_pending = false;
  CHECK(!DecideGateRelease(in).release());
}

TEST_CASE("GatedTileStatus names the readiness and keeps the end's code") {
  CHECK(GatedTileStatus(false, "spec.ready_flags", 3, 7, absl::AbortedError("x")).ok());
  const absl::Status s = GatedTileStatus(
      true, "spec.ready_flags", 3, 7,
      absl::AbortedError("the session that makes this transfer's layers ready ended"));
  CHECK(s.code() == absl::StatusCode::kAborted);
  INFO(s.message());
  CHECK(std::string(s.message()).rfind("spec.ready_flags[3]: ", 0) == 0);
  CHECK(std::string(s.message()).find("reach 7") != std::string::npos);
  CHECK(std::string(s.message()).find("no byte written") != std::string::npos);
  CHECK(std::string(s.message()).find("session") != std::string::npos);
  // An end without a status still fails.
  CHECK(GatedTileStatus(true, "spec.ready_flags", 0, 1, absl::OkStatus()).code() ==
        absl::StatusCode::kUnavailable);
}

TEST_CASE("GateSlots: one slot per job, none beyond the limit, free again after Release") {
  GateSlots slots(2);
  int a, b, c;
  CHECK(slots.Admit(&a, Eligible()).stream_wait);
  CHECK(slots.Admit(&a, Eligible()).stream_wait);  // same job: still one slot
  CHECK(slots.held() == 1);
  CHECK(slots.Admit(&b, Eligible()).stream_wait);
  CHECK(!slots.Admit(&c, Eligible()).stream_wait);
  CHECK(!slots.Holds(&c));
  slots.Release(&a);
  CHECK(!slots.Holds(&a));
  CHECK(slots.Admit(&c, Eligible()).stream_wait);
  CHECK(slots.held() == 2);
  GateInputs off = Eligible();
  off.enabled = false;
  slots.Release(&b);
  CHECK(!slots.Admit(&b, off).stream_wait);
  CHECK(slots.held() == 1);
}

// The one-process hang under MPS (docs/benchmarks.md): a parked wait
// holds up every stream sharing its hardware queue, so the gated jobs a GPU holds are bounded by
// the queues CUDA_DEVICE_MAX_CONNECTIONS gives, two parked streams each beside the engine's two.
TEST_CASE("HardwareQueuesFromEnv reads CUDA_DEVICE_MAX_CONNECTIONS as the driver does") {
  CHECK(HardwareQueuesFromEnv(nullptr) == 8);
  CHECK(HardwareQueuesFromEnv("") == 8);
  CHECK(HardwareQueuesFromEnv("32") == 32);
  CHECK(HardwareQueuesFromEnv("1") == 1);
  CHECK(HardwareQueuesFromEnv("0") == 8);
  CHECK(HardwareQueuesFromEnv("-4") == 8);
  CHECK(HardwareQueuesFromEnv("12x") == 8);
  CHECK(HardwareQueuesFromEnv("64") == 32);
  CHECK(HardwareQueuesFromEnv("99999999999999") == 32);
}

TEST_CASE("PlanGateQueues: every parked wait gets a queue apart from the engine's streams") {
  // kvraild's own setting with the stream wait on (32) holds the default 8 jobs: 2 + 2 x 8 = 18.
  GateQueuePlan p = PlanGateQueues(8, 32);
  CHECK(p.max_jobs == 8);
  CHECK(p.reason.empty());
  // The driver's default 8 queues: 3 jobs (2 + 2 x 3 = 8), and the reason says why.
  p = PlanGateQueues(8, 8);
  CHECK(p.max_jobs == 3);
  CHECK(p.reason.find("8 hardware queues (CUDA_DEVICE_MAX_CONNECTIONS) leave room for 3") == 0);
  CHECK(p.reason.find("cuda_stream_wait_jobs 8") != std::string::npos);
  // One queue (or three): none; the readiness poller serves, saying so.
  CHECK(PlanGateQueues(8, 1).max_jobs == 0);
  CHECK(PlanGateQueues(8, 3).max_jobs == 0);
  CHECK(PlanGateQueues(8, 4).max_jobs == 1);
  CHECK(PlanGateQueues(20, 32).max_jobs == 15);
  CHECK(PlanGateQueues(0, 32).max_jobs == 0);
  CHECK(PlanGateQueues(0, 32).reason.empty());
  p = PlanGateQueues(8, 1);
  GateSlots none(p.max_jobs, p.reason);
  int job;
  const GateChoice c = none.Admit(&job, Eligible());
  CHECK(!c.stream_wait);
  CHECK(c.reason.find("readiness poller (0 jobs already wait on this GPU: 1 hardware queues") == 0);
  // Without a queue limit the old reason stays.
  GateSlots one(1);
  int a, b;
  CHECK(one.Admit(&a, Eligible()).stream_wait);
  CHECK(one.Admit(&b, Eligible()).reason.find("cuda_stream_wait_jobs 1") != std::string::npos);
}

}  // namespace
}  // namespace kvrail::scheduler

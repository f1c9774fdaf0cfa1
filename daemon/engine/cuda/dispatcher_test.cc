// The CUDA engine's dispatcher and gate on a fake GPU (fake_gpu_ops.h), driven turn by turn from
// the test's thread with a manual clock: batches copy byte for byte, a finished job's state goes
// outside the queue lock, gated layers wait for their words, the watchdog releases a job whose
// producer is gone or whose wait blocks a context-synchronizing call, a launch that fails after
// its kernel was enqueued reports its tiles only once nothing writes them, and neither the
// watchdog nor a release in progress holds what the dispatcher needs.
#include "daemon/engine/cuda/dispatcher.h"

#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "daemon/engine/cuda/dispatcher_test_rig.h"

namespace kvrail::engine::cuda_detail {
namespace {

using testing::AllOk;
using testing::DropSeen;
using testing::LayeredCase;
using testing::ManyBatchCase;
using testing::Rig;
using testing::TestJob;
using testing::TestOptions;

TEST_CASE("sweep: batches land byte for byte; an ended job's state goes outside the queue lock") {
  std::mt19937_64 rng(11);
  Rig rig;
  for (int n = 0; n < 8; ++n) {
    auto seen = std::make_shared<DropSeen>();
    const planner::testing::RandomCase c = planner::testing::RandomPagedCase(rng);
    INFO(c.ToString());
    // The job's last reference is the dispatcher's: its deleter sees where it is dropped.
    Rig* r = &rig;
    std::shared_ptr<TestJob> job(new TestJob(c, rng), [seen, r](TestJob* j) {
      seen->under_queue_lock = r->queues.HeldForTest();
      seen->thread = std::this_thread::get_id();
      seen->dropped = true;
      delete j;
    });
    TestJob* raw = job.get();
    const size_t tiles = raw->plan().num_tiles();
    rig.queues.Enqueue(job, raw->AllTiles());
    job.reset();
    REQUIRE(rig.TurnUntil([&] { return seen->dropped.load(); }));
    CHECK_FALSE(seen->under_queue_lock.load());
    CHECK(seen->thread == std::this_thread::get_id());
    CHECK(rig.dispatcher.states() == 0);
    (void)tiles;
  }
  CHECK(rig.fake.kernels_run() > 0);
}

TEST_CASE("first job: the description names each step of its first batch's enqueue") {
  std::mt19937_64 rng(13);
  Rig rig;
  auto seen = std::make_shared<DropSeen>();
  const planner::testing::RandomCase c = planner::testing::RandomPagedCase(rng);
  INFO(c.ToString());
  std::shared_ptr<TestJob> job(new TestJob(c, rng), [seen](TestJob* j) {
    seen->dropped = true;
    delete j;
  });
  TestJob* raw = job.get();
  rig.queues.Enqueue(job, raw->AllTiles());
  job.reset();
  REQUIRE(rig.TurnUntil([&] { return seen->dropped.load(); }));
  const std::string text = rig.stats.Describe(0, 8, 0);
  INFO(text);
  CHECK(text.find("first batch's enqueue steps") != std::string::npos);
  for (const char* step : {"launch began", "anchor recorded", "ids checked", "events taken",
                           "start recorded", "copies enqueued", "done word"}) {
    CHECK(text.find(step) != std::string::npos);
  }
}

TEST_CASE("sweep: every tile reported OK and copied; no write pending at any report") {
  std::mt19937_64 rng(12);
  Rig rig;
  for (int n = 0; n < 12; ++n) {
    const planner::testing::RandomCase c = planner::testing::RandomPagedCase(rng);
    INFO(c.ToString());
    auto job = std::make_shared<TestJob>(c, rng);
    job->WatchWrites(&rig.fake);
    rig.queues.Enqueue(job, job->AllTiles());
    REQUIRE(rig.TurnUntil([&] { return job->reported() == job->plan().num_tiles(); }));
    for (const auto& [tile, status] : job->statuses()) {
      INFO("tile " << tile << ": " << status.ToString());
      CHECK(status.ok());
    }
    CHECK(job->copied());
    CHECK(job->writes_pending_at_report() == 0);
    REQUIRE(rig.TurnUntil([&] { return rig.dispatcher.states() == 0; }));
  }
}

TEST_CASE("retire: gated layers wait for their words; the lease and the words go back") {
  std::mt19937_64 rng(13);
  Rig rig;
  auto seen = std::make_shared<DropSeen>();
  auto job = std::make_shared<TestJob>(LayeredCase(rng), rng);
  Rig* r = &rig;
  job->set_keep(std::shared_ptr<const void>(new int(0), [seen, r](const void* p) {
    seen->under_queue_lock = r->queues.HeldForTest();
    seen->thread = std::this_thread::get_id();
    seen->dropped = true;
    delete static_cast<const int*>(p);
  }));
  REQUIRE(rig.Admit(job));
  job->set_keep(nullptr);  // the gate's copy holds the words now
  rig.queues.Enqueue(job, job->AllTiles());
  // Nothing moves before its word: every layer's batch is launched and waits on the GPU.
  rig.TurnUntil([] { return false; }, 50);
  CHECK(job->reported() == 0);
  CHECK(rig.dispatcher.gated_pending() > 0);
  CHECK(job->untouched());
  job->Write(0);
  REQUIRE(rig.TurnUntil([&] { return job->LayerReported(0); }));
  CHECK_FALSE(job->LayerReported(1));
  for (uint32_t l = 1; l < job->plan().num_layers(); ++l) job->Write(l);
  REQUIRE(rig.TurnUntil([&] { return job->reported() == job->plan().num_tiles(); }));
  for (const auto& [tile, status] : job->statuses()) CHECK(status.ok());
  CHECK(job->copied());
  // The ended job's state goes: its gate retired, its slot back, the words' last reference
  // dropped on this thread with no lock held.
  REQUIRE(rig.TurnUntil([&] { return rig.dispatcher.states() == 0; }));
  CHECK(rig.gate.Text().find("0 of 4 jobs") != std::string::npos);
  CHECK(seen->dropped.load());
  CHECK_FALSE(seen->under_queue_lock.load());
  CHECK(seen->thread == std::this_thread::get_id());
}

TEST_CASE("release: a job whose producer is gone is disarmed, its words raised; nothing lands") {
  std::mt19937_64 rng(14);
  Rig rig;
  auto job = std::make_shared<TestJob>(LayeredCase(rng), rng);
  REQUIRE(rig.Admit(job));
  rig.queues.Enqueue(job, job->AllTiles());
  rig.TurnUntil([] { return false; }, 50);
  REQUIRE(rig.dispatcher.gated_pending() > 0);
  job->End(absl::CancelledError("the session ended"), /*producer_gone=*/true);
  // The first look fires the abort word; the abort stream then zeroes the plan's tile count and
  // writes the done word (the fake GPU runs as the dispatcher polls); a later look raises the
  // words, the waits pass, the disarmed kernels copy nothing.
  for (int i = 0; i < 20 && rig.gate.releases() == 0; ++i) {
    rig.gate.WatchOnce();
    rig.dispatcher.Turn(false);
  }
  REQUIRE(rig.gate.releases() == 1);
  CHECK(job->word(0) == 1);
  REQUIRE(rig.TurnUntil([&] { return job->reported() == job->plan().num_tiles(); }));
  for (const auto& [tile, status] : job->statuses()) {
    INFO(status.ToString());
    CHECK_FALSE(status.ok());
    CHECK(status.message().find("spec.ready_flags") != std::string::npos);
  }
  CHECK(job->untouched());
  REQUIRE(rig.TurnUntil([&] { return rig.dispatcher.states() == 0; }));
  CHECK(rig.gate.Text().find("1 released by the daemon (0 for a call blocked") !=
        std::string::npos);
}

TEST_CASE("watchdog: a call blocked behind a live job's wait gets the wait released") {
  std::mt19937_64 rng(15);
  CudaEngineOptions o = TestOptions();
  Rig rig(o);
  GateOptions g = Rig::Gate(o);
  // A context-synchronizing call blocked 2 s (bound 1 s): the live job's waits are released.
  g.blocked_sync = [](absl::Time) {
    return std::optional<std::pair<absl::Duration, std::string>>(
        std::make_pair(absl::Seconds(2), std::string("cudaHostRegister(region)")));
  };
  GpuGate gate(&rig.fake, &rig.clock, g);
  REQUIRE(gate.Make().ok());
  auto job = std::make_shared<TestJob>(LayeredCase(rng), rng);
  auto plan =
      rig.fake.UploadPlan(job->plan(), nullptr, nullptr, rig.fake.main_stream(), nullptr, 0);
  REQUIRE(plan.ok());
  GateLease lease;
  REQUIRE(gate.Arm(lease, job, *job->ready_gate(0), **plan).ok());
  REQUIRE(rig.fake.WaitWord(*lease.stream, job->ready_gate(0)->device_words, 1).ok());
  lease.control->launched_end.store(1);
  for (int i = 0; i < 10 && gate.releases() == 0; ++i) {
    gate.WatchOnce();
    rig.fake.Run();
  }
  CHECK(gate.releases() == 1);
  CHECK(job->word(0) == 1);
  CHECK(gate.Text().find("1 released by the daemon (1 for a call blocked") != std::string::npos);
  absl::Status why;
  CHECK(lease.control->Aborted(&why));
  CHECK(why.message().find("cudaHostRegister") != std::string::npos);
  gate.Retire(lease);
  gate.Reap();
}

TEST_CASE("watchdog: never drops a job's or its flag words' last reference") {
  std::mt19937_64 rng(16);
  Rig rig;
  auto seen = std::make_shared<DropSeen>();
  auto job = std::make_shared<TestJob>(LayeredCase(rng), rng);
  job->set_keep(std::shared_ptr<const void>(new int(0), [seen](const void* p) {
    seen->thread = std::this_thread::get_id();
    seen->dropped = true;
    delete static_cast<const int*>(p);
  }));
  std::optional<Job::ReadyGate> words = job->ready_gate(0);
  job->set_keep(nullptr);
  auto plan =
      rig.fake.UploadPlan(job->plan(), nullptr, nullptr, rig.fake.main_stream(), nullptr, 0);
  REQUIRE(plan.ok());
  auto lease = std::make_shared<GateLease>();
  REQUIRE(rig.gate.Arm(*lease, job, *words, **plan).ok());
  words.reset();  // the gate's control holds the words now
  // The dispatcher retires the job while the watchdog is looking at it (here: from inside the
  // look, as the job's end is read), and drops its own references.
  job->set_on_ended([&rig, lease] {
    if (lease->control != nullptr) rig.gate.Retire(*lease);
  });
  TestJob* raw = job.get();
  job.reset();
  std::thread::id watchdog;
  std::thread w([&] {
    watchdog = std::this_thread::get_id();
    rig.gate.WatchOnce();
  });
  w.join();
  CHECK(lease->control == nullptr);
  CHECK_FALSE(seen->dropped.load());  // not on the watchdog: the reaper has it
  (void)raw;
  rig.gate.Reap();
  CHECK(seen->dropped.load());
  CHECK(seen->thread == std::this_thread::get_id());
  CHECK(seen->thread != watchdog);
}

TEST_CASE("release: waiting for the done word holds no lock the dispatcher needs") {
  std::mt19937_64 rng(17);
  Rig rig;
  rig.fake.set_auto_run(false);  // the abort stream does not run: the done word never shows
  auto job = std::make_shared<TestJob>(LayeredCase(rng), rng);
  auto plan =
      rig.fake.UploadPlan(job->plan(), nullptr, nullptr, rig.fake.main_stream(), nullptr, 0);
  REQUIRE(plan.ok());
  GateLease lease;
  REQUIRE(rig.gate.Arm(lease, job, *job->ready_gate(0), **plan).ok());
  job->End(absl::CancelledError("the session ended"), /*producer_gone=*/true);
  const uint32_t* abort_word = lease.control->abort_word;
  const uint32_t epoch = lease.control->epoch;
  std::thread w([&] { rig.gate.WatchOnce(); });
  // Once the abort word is stored, the dispatcher retires the job (as its sweep would, with the
  // queues' lock held in the old order): that must not wait for the release's done word.
  while (__atomic_load_n(abort_word, __ATOMIC_ACQUIRE) != epoch)
    absl::SleepFor(absl::Microseconds(10));
  const absl::Time t0 = absl::Now();
  rig.gate.Retire(lease);
  const absl::Duration took = absl::Now() - t0;
  w.join();
  CHECK(took < absl::Milliseconds(10));
  rig.fake.Run();
  rig.gate.Reap();
}

TEST_CASE("partial launch failure: tiles report only once nothing writes them") {
  std::mt19937_64 rng(18);
  SECTION("the digest's copy-back fails after the fused kernel was enqueued") {
    Rig rig;
    auto job = std::make_shared<TestJob>(planner::testing::RandomPagedCase(rng), rng);
    job->set_digest(true);
    job->WatchWrites(&rig.fake);
    rig.fake.FailNext("CopyBackDigests", absl::InternalError("copy-back refused"));
    rig.queues.Enqueue(job, job->AllTiles());
    REQUIRE(rig.TurnUntil([&] { return job->reported() == job->plan().num_tiles(); }));
    int failed = 0;
    for (const auto& [tile, status] : job->statuses()) failed += status.ok() ? 0 : 1;
    CHECK(failed > 0);
    CHECK(job->writes_pending_at_report() == 0);
  }
  SECTION("the copy-engine part of a split batch fails after the kernel part was enqueued") {
    CudaEngineOptions o = TestOptions();
    o.copy_split_max_percent = 50;
    o.copy_split_fixed_percent = 50;
    o.batch_bytes = 64 << 20;  // one batch of many tiles
    Rig rig(o);
    auto job = std::make_shared<TestJob>(planner::testing::RandomPagedCase(rng), rng);
    job->WatchWrites(&rig.fake);
    rig.fake.FailNext("CopyRuns", absl::InternalError("copy engines refused"));
    rig.queues.Enqueue(job, job->AllTiles());
    REQUIRE(rig.TurnUntil([&] { return job->reported() == job->plan().num_tiles(); }));
    int failed = 0;
    for (const auto& [tile, status] : job->statuses()) failed += status.ok() ? 0 : 1;
    CHECK(failed > 0);
    CHECK(rig.fake.kernels_run() > 0);
    CHECK(job->writes_pending_at_report() == 0);
  }
}

TEST_CASE("sticky fault: the batch fails, and so does every later one, naming the GPU") {
  std::mt19937_64 rng(19);
  Rig rig;
  auto job = std::make_shared<TestJob>(planner::testing::RandomPagedCase(rng), rng);
  rig.fake.FailNext("Wait", absl::InternalError("cudaErrorIllegalAddress"), /*sticky=*/true);
  rig.queues.Enqueue(job, job->AllTiles());
  REQUIRE(rig.TurnUntil([&] { return job->reported() == job->plan().num_tiles(); }));
  CHECK_FALSE(rig.stats.broken().ok());
  auto later = std::make_shared<TestJob>(planner::testing::RandomPagedCase(rng), rng);
  rig.queues.Enqueue(later, later->AllTiles());
  REQUIRE(rig.TurnUntil([&] { return later->reported() == later->plan().num_tiles(); }));
  for (const auto& [tile, status] : later->statuses()) {
    CHECK(status.message().find("GPU0 is unusable") != std::string::npos);
  }
  CHECK(rig.stats.Describe(0, 8, 0).find("BROKEN") != std::string::npos);
}

TEST_CASE("done word: stored once, after every kernel and copy, before the last tile reports") {
  std::mt19937_64 rng(21);
  CudaEngineOptions split = TestOptions();
  split.copy_split_max_percent = 50;
  split.copy_split_fixed_percent = 50;
  for (const CudaEngineOptions& o : {TestOptions(), split}) {
    Rig rig(o);
    for (int n = 0; n < 6; ++n) {
      const planner::testing::RandomCase c = ManyBatchCase(rng);
      INFO(c.ToString());
      auto job = std::make_shared<TestJob>(c, rng);
      const uint64_t value = (uint64_t{0xd0} << 56) | static_cast<uint64_t>(n + 1);
      job->set_done_value(value);
      const size_t before = rig.fake.done_words().size();
      rig.queues.Enqueue(job, job->AllTiles());
      REQUIRE(rig.TurnUntil([&] { return job->reported() == job->plan().num_tiles(); }));
      CHECK(AllOk(*job));
      CHECK(job->copied());
      CHECK(job->done() == value);
      // The daemon's end (the last tile's report) comes after the word: the completion entry
      // the client recycles its slot on never precedes it.
      CHECK(job->reports_after_done() >= 1);
      const std::vector<FakeGpuOps::DoneWordStored> stored = rig.fake.done_words();
      REQUIRE(stored.size() == before + 1);
      CHECK(stored.back().value == value);
      CHECK(stored.back().writes_pending == 0);  // every copy and kernel of the job ran before
      CHECK(rig.fake.kernels_run() == stored.back().kernels_run);
      REQUIRE(rig.TurnUntil([&] { return rig.dispatcher.states() == 0; }));
    }
    CHECK(rig.stats.done_words() == 6);
  }
}

TEST_CASE("done word: never stored when the transfer did not land whole") {
  std::mt19937_64 rng(22);
  Rig rig;
  auto job = std::make_shared<TestJob>(ManyBatchCase(rng), rng);
  job->set_done_value(7);
  SECTION("a middle batch fails to launch") {
    rig.queues.Enqueue(job, job->AllTiles());
    // The first batch is enqueued (not run yet): the failure hits a later one.
    REQUIRE(rig.TurnUntil([&] { return rig.fake.pending_ops() > 0; }));
    REQUIRE(job->reported() == 0);
    rig.fake.FailNext("LaunchCopy", absl::InternalError("launch refused"));
    rig.fake.FailNext("CopyRuns", absl::InternalError("copy engines refused"));
  }
  SECTION("a kernel faults on the GPU (sticky: nothing after it runs)") {
    rig.fake.FaultNextKernel();
    rig.queues.Enqueue(job, job->AllTiles());
  }
  SECTION("the job ended (cancelled) before its last batch") {
    job->End(absl::CancelledError("cancelled"), false);
    rig.queues.Enqueue(job, job->AllTiles());
  }
  SECTION("the word cannot be enqueued: the transfer still succeeds, from the daemon") {
    rig.fake.FailNext("WriteDoneWord", absl::InternalError("stream memory operation refused"));
    rig.queues.Enqueue(job, job->AllTiles());
    REQUIRE(rig.TurnUntil([&] { return job->reported() == job->plan().num_tiles(); }));
    CHECK(AllOk(*job));
    CHECK(job->copied());
    CHECK(rig.stats.Describe(0, 8, 0).find("stream memory operation refused") != std::string::npos);
  }
  SECTION("a digest job (its digests are compared on the CPU)") {
    job->set_digest(true);
    rig.queues.Enqueue(job, job->AllTiles());
  }
  SECTION("the daemon turned the GPU-written completion off") {
    CudaEngineOptions o = TestOptions();
    o.done_words = false;
    Rig off(o);
    off.queues.Enqueue(job, job->AllTiles());
    REQUIRE(off.TurnUntil([&] { return job->reported() == job->plan().num_tiles(); }));
    CHECK(AllOk(*job));
    CHECK(off.fake.done_words().empty());
  }
  REQUIRE(rig.TurnUntil([&] { return job->reported() == job->plan().num_tiles(); }));
  rig.fake.Run();
  CHECK(job->done() == 0);
  CHECK(rig.fake.done_words().empty());
}

TEST_CASE("done word: not for a gated job, whose released layers' kernels run empty") {
  std::mt19937_64 rng(23);
  Rig rig;
  auto job = std::make_shared<TestJob>(LayeredCase(rng), rng);
  job->set_done_value(9);
  REQUIRE(rig.Admit(job));
  rig.queues.Enqueue(job, job->AllTiles());
  for (uint32_t l = 0; l < job->plan().num_layers(); ++l) job->Write(l);
  REQUIRE(rig.TurnUntil([&] { return job->reported() == job->plan().num_tiles(); }));
  CHECK(AllOk(*job));
  rig.fake.Run();
  CHECK(job->done() == 0);
  CHECK(rig.fake.done_words().empty());
  REQUIRE(rig.TurnUntil([&] { return rig.dispatcher.states() == 0; }));
  rig.gate.Reap();
}

TEST_CASE("done word: whatever the word held before is overwritten, never read") {
  std::mt19937_64 rng(24);
  Rig rig;
  auto job = std::make_shared<TestJob>(ManyBatchCase(rng), rng);
  job->set_done_value(42);
  job->set_done(~uint64_t{0});  // the client's garbage (or a stale value) in its own slot
  rig.queues.Enqueue(job, job->AllTiles());
  REQUIRE(rig.TurnUntil([&] { return job->reported() == job->plan().num_tiles(); }));
  CHECK(AllOk(*job));
  CHECK(job->done() == 42);
}

}  // namespace
}  // namespace kvrail::engine::cuda_detail

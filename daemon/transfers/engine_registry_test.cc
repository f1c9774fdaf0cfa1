// The engine registry: a transfer goes to the first registered engine that moves its memory, by
// the engines' declared capabilities; an engine known to the manager only through the registry
// (a toy one, below) runs a real transfer, shows in the stats and is held to what it declares.
#include "daemon/transfers/engine_registry.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/manual_clock.h"
#include "daemon/transfers/fake_engine.h"
#include "daemon/transfers/test_support.h"
#include "daemon/transfers/transfers.h"

namespace kvrail::transfers {
namespace {

constexpr uint64_t kTile = 1024;

// A toy engine: each tile moved with the planner's host twin on the thread that enqueues it, so
// nothing ever waits in a queue. Declares what the test gives it. Thread-safe.
class ToyEngine final : public engine::Engine {
 public:
  explicit ToyEngine(engine::Capabilities caps) : caps_(caps) {}
  std::string name() const override { return "toy"; }
  engine::Capabilities capabilities() const override { return caps_; }
  void Enqueue(const std::shared_ptr<engine::Job>& job,
               const std::vector<uint32_t>& tiles) override {
    {
      absl::MutexLock lock(&mu_);
      tiles_ += tiles.size();
    }
    for (uint32_t t : tiles) {
      job->OnTileStart(t);
      planner::ExecuteTileHost(job->plan(), t, job->src_base(), job->dst_base());
      job->OnTileDone(t, absl::OkStatus());
    }
  }
  size_t Remove(const engine::Job*) override { return 0; }
  std::vector<uint64_t> QueuedTiles() const override {
    return std::vector<uint64_t>(engine::kNumPriorityClasses, 0);
  }
  std::string Describe() const override { return "toy: the host twin on the enqueuing thread"; }
  uint64_t tiles() const {
    absl::MutexLock lock(&mu_);
    return tiles_;
  }

 private:
  const engine::Capabilities caps_;
  mutable absl::Mutex mu_;
  uint64_t tiles_ ABSL_GUARDED_BY(mu_) = 0;
};

engine::Capabilities HostToHost() {
  engine::Capabilities caps;
  caps.host_to_host = true;
  return caps;
}

// A manager whose only engine is the toy, registered through the registry.
struct ToyFixture {
  ManualClock clock;
  testing::TestRegions regions{&clock};
  ToyEngine toy{HostToHost()};
  std::unique_ptr<TransferManager> manager;
  ToyFixture() {
    EngineRegistry engines;
    engines.Add(&toy);
    Options options;
    options.node_id = "here";
    options.tile_bytes = kTile;
    manager = TransferManager::Create(regions.table(), regions.grants(), engines, &clock, options);
  }
  ~ToyFixture() { manager->Drain(absl::ZeroDuration()); }
};

TEST_CASE("registry: an engine registered through it runs a real transfer") {
  ToyFixture f;
  constexpr uint64_t kBytes = 16 * kTile;
  auto src = f.regions.Bytes(kBytes, true);  // writable: the test fills it through the mapping
  auto dst = f.regions.Bytes(kBytes, true);
  for (uint64_t i = 0; i < kBytes; ++i) src->data()[i] = static_cast<uint8_t>(i * 7 + 1);
  std::memset(dst->data(), 0, kBytes);
  // Submitted, then waited for, by the session owning both regions.
  v1::TransferSpec spec = testing::BytesSpec(src->id(), dst->id(), kBytes);
  spec.set_session_id(f.regions.session());
  auto response = f.manager->Submit(spec);
  INFO(response.status().ToString());
  REQUIRE(response.ok());
  auto status = f.manager->Wait(f.regions.sessions()->CallerOf(f.regions.session()),
                                response->transfer_id(), absl::Seconds(5));
  REQUIRE(status.ok());
  CHECK(status->state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(status->engine() == "toy");
  CHECK(status->path() == v1::PATH_HOST_LOCAL);
  CHECK(f.toy.tiles() == kBytes / kTile);
  CHECK(std::memcmp(src->data(), dst->data(), kBytes) == 0);
  v1::Stats stats;
  f.manager->FillStats(&stats);
  REQUIRE(stats.engine_states_size() == 1);
  CHECK(stats.engine_states(0).name() == "toy");
  REQUIRE(stats.engines_size() == 1);
  CHECK(stats.engines(0) == f.toy.Describe());
}

TEST_CASE("registry: a transfer needing what no engine declares is refused, nothing moves") {
  ToyFixture f;
  auto src = f.regions.Bytes(4 * kTile, false);
  auto dst = f.regions.Bytes(4 * kTile, true);
  v1::TransferSpec spec = testing::BytesSpec(src->id(), dst->id(), 4 * kTile);
  spec.set_session_id(f.regions.session());
  spec.set_digest(true);  // the toy does not declare digest
  auto response = f.manager->Submit(spec);
  REQUIRE(!response.ok());
  CHECK(response.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(response.status().message()).find("spec.digest") != std::string::npos);
  CHECK(f.toy.tiles() == 0);
}

TEST_CASE("registry: the first registered engine that moves the memory wins") {
  testing::CountingTables tables;
  engine::Capabilities gpu_caps;
  gpu_caps.gpu_memory = true;
  gpu_caps.table_pool = &tables;
  ToyEngine host(HostToHost()), gpu(gpu_caps), later_host(HostToHost());
  EngineRegistry engines;
  engines.Add(nullptr);  // an engine the daemon could not make is not there
  engines.Add(&host);
  engines.Add(&gpu);
  engines.Add(&later_host);
  CHECK(engines.engines().size() == 3);
  CHECK(engines.For(scheduler::EngineKind::kHost) == &host);
  CHECK(engines.For(scheduler::EngineKind::kCuda) == &gpu);
  CHECK(engines.MovesGpuMemory());
  CHECK(engines.TablePool() == &tables);  // any local plan may run on the GPU engine

  const EngineRegistry host_only({&host});
  CHECK(host_only.For(scheduler::EngineKind::kCuda) == nullptr);
  CHECK(!host_only.MovesGpuMemory());
  CHECK(host_only.TablePool() == nullptr);  // the toy declares no pool: any memory
  CHECK(EngineRegistry().For(scheduler::EngineKind::kHost) == nullptr);
}

}  // namespace
}  // namespace kvrail::transfers

// Layer-wise transfers whose producer flags (spec.ready_flags) the engine waits for
// on the GPU (Engine::AdmitGated). Admitted: every tile goes to the engine at submit (no poller
// watch), the transfer waits on its producer until each word has come (EndSession ends it then,
// and Job::ended says the producer is gone, so the engine releases its GPU waits at once).
// Declined: the readiness poller hands layers over as their words come, as before.
// Record's device sides' ready_gate (what an engine that admits gets: the words as the daemon and
// as the GPU see them, their count and value) on a flag region mapped as a GPU would map it, and
// refused.
#include <catch2/catch.hpp>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/transfers/manager_fixture.h"
#include "daemon/transfers/record.h"

namespace kvrail::transfers {
namespace {

using testing::ManagerFixture;

constexpr uint32_t kLayers = 4, kBlocks = 8;
constexpr uint32_t kValue = 3;

// The producer owns the ready flags and submits; the pools belong to another session (a session's
// end also ends every transfer on its own regions, which these tests are not about).
struct Streaming {
  ManagerFixture f;
  uint64_t producer = f.regions.NewSession();
  uint64_t owner = f.regions.NewSession();
  std::shared_ptr<regions::Region> src = f.regions.PagedLayers(kBlocks, kLayers, false, owner);
  std::shared_ptr<regions::Region> dst = f.regions.PagedLayers(kBlocks, kLayers, true, owner);
  std::shared_ptr<regions::Region> flags = f.regions.Bytes(4096, true, producer);
  uint32_t* words = reinterpret_cast<uint32_t*>(flags->data());

  uint64_t Submit() {
    v1::TransferSpec spec;
    spec.set_session_id(producer);
    spec.mutable_src()->set_region_id(src->id());
    spec.mutable_dst()->set_region_id(dst->id());
    for (uint32_t b = 0; b < kBlocks; ++b) {
      spec.mutable_src()->add_block_ids(b);
      spec.mutable_dst()->add_block_ids(kBlocks - 1 - b);
    }
    // The pools' owner lets the producer's transfer read and write them.
    spec.mutable_src()->set_grant(f.Grant(*src, v1::GRANT_ACCESS_READ));
    spec.mutable_dst()->set_grant(f.Grant(*dst, v1::GRANT_ACCESS_WRITE));
    spec.mutable_ready_flags()->set_region_id(flags->id());
    spec.mutable_ready_flags()->set_value(kValue);
    auto response = f.manager->Submit(f.Bound(spec));
    INFO(response.status().ToString());
    REQUIRE(response.ok());
    return response->transfer_id();
  }
};

TEST_CASE("gated: an admitted layer-wise transfer hands every tile over at submit") {
  Streaming t;
  t.f.engine.set_admit_gated(true);
  const uint64_t id = t.Submit();
  CHECK(t.f.engine.admitted_gated() == 1);
  const v1::TransferStatus status = t.f.Get(id);
  CHECK(status.tiles_total() > 0);
  CHECK(t.f.engine.enqueued() == status.tiles_total());  // no layer waited for the poller
  for (uint32_t l = 0; l < kLayers; ++l) __atomic_store_n(&t.words[l], kValue, __ATOMIC_RELEASE);
  t.f.engine.RunAll();
  CHECK(t.f.Get(id).state() == v1::TRANSFER_STATE_SUCCEEDED);
}

TEST_CASE(
    "gated: the producer's session ends with words unwritten - the transfer ends, the engine "
    "hears the producer is gone") {
  Streaming t;
  t.f.engine.set_admit_gated(true);
  const uint64_t id = t.Submit();
  __atomic_store_n(&t.words[0], kValue, __ATOMIC_RELEASE);  // layer 0 only
  std::shared_ptr<engine::Job> job;
  REQUIRE(t.f.engine.StartNext(&job));  // a tile "waiting on the GPU"
  bool gone = true;
  CHECK(job->ended(&gone).ok());
  CHECK(!gone);
  t.f.manager->EndSession(t.producer);
  const absl::Status ended = job->ended(&gone);
  CHECK(ended.code() == absl::StatusCode::kAborted);
  CHECK(gone);
  CHECK(t.f.engine.queued() == 0);  // the rest taken off the engine's queue
  REQUIRE(t.f.engine.FinishNext(ended));
  CHECK(t.f.Get(id).state() == v1::TRANSFER_STATE_FAILED);
}

TEST_CASE("gated: every word written - the producer's end no longer ends the transfer") {
  Streaming t;
  t.f.engine.set_admit_gated(true);
  const uint64_t id = t.Submit();
  for (uint32_t l = 0; l < kLayers; ++l) __atomic_store_n(&t.words[l], kValue, __ATOMIC_RELEASE);
  t.f.manager->EndSession(t.producer);
  t.f.engine.RunAll();
  CHECK(t.f.Get(id).state() == v1::TRANSFER_STATE_SUCCEEDED);
}

TEST_CASE("gated: every word written - the end of the pools' owner still ends the transfer") {
  Streaming t;
  t.f.engine.set_admit_gated(true);
  const uint64_t id = t.Submit();
  for (uint32_t l = 0; l < kLayers; ++l) __atomic_store_n(&t.words[l], kValue, __ATOMIC_RELEASE);
  t.f.manager->EndSession(t.owner);
  t.f.engine.RunAll();
  const v1::TransferStatus status = t.f.Get(id);
  CHECK(status.state() == v1::TRANSFER_STATE_FAILED);
  CHECK(status.error_message().find("ended") != std::string::npos);
}

TEST_CASE("gated: declined, the readiness poller hands layers over as their words come") {
  Streaming t;
  const uint64_t id = t.Submit();
  CHECK(t.f.engine.admitted_gated() == 0);
  CHECK(t.f.engine.enqueued() == 0);
  __atomic_store_n(&t.words[0], kValue, __ATOMIC_RELEASE);
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (t.f.engine.enqueued() == 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  const uint32_t per_layer = t.f.Get(id).tiles_total() / kLayers;
  CHECK(t.f.engine.enqueued() == per_layer);
  for (uint32_t l = 1; l < kLayers; ++l) __atomic_store_n(&t.words[l], kValue, __ATOMIC_RELEASE);
  while (t.f.engine.enqueued() < t.f.Get(id).tiles_total() && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  t.f.engine.RunAll();
  CHECK(t.f.Get(id).state() == v1::TRANSFER_STATE_SUCCEEDED);
}

// A flag region as a GPU would map it (no GPU here: the host regions' DeviceAddress pins the
// memory with CUDA): GPU `accessor` sees byte i of the region at kDeviceBase + accessor * 1 MiB
// + i; `refuse`: the mapping fails, as a pin can.
class MappedFlags final : public regions::Region {
 public:
  static constexpr uint64_t kDeviceBase = uint64_t{0x7f0000} << 24;
  MappedFlags(const std::shared_ptr<regions::Region>& like, bool refuse)
      : like_(like), refuse_(refuse) {}
  uint64_t id() const override { return like_->id(); }
  uint64_t session_id() const override { return like_->session_id(); }
  uint8_t* data() const override { return like_->data(); }
  absl::StatusOr<uint8_t*> DeviceAddress(int accessor) const override {
    if (refuse_) return absl::FailedPreconditionError("region: pinning host memory refused");
    return reinterpret_cast<uint8_t*>(kDeviceBase + (uint64_t{1} << 20) * accessor);
  }
  const v1::RegionSpec& spec() const override { return like_->spec(); }
  const planner::RegionView& view() const override { return like_->view(); }
  v1::RegionInfo Info() const override { return like_->Info(); }
  void AcquireUse() override {}
  void ReleaseUse() override {}

 private:
  const std::shared_ptr<regions::Region> like_;
  const bool refuse_;
};

// A layer-wise record whose producer words start `offset` bytes into the flag region.
std::shared_ptr<Record> GatedRecord(Streaming& t, std::shared_ptr<regions::Region> flags,
                                    uint32_t offset) {
  v1::TransferSpec spec;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    spec.mutable_src()->add_block_ids(b);
    spec.mutable_dst()->add_block_ids(kBlocks - 1 - b);
  }
  spec.mutable_ready_flags()->set_region_id(flags->id());
  spec.mutable_ready_flags()->set_value(kValue);
  absl::StatusOr<planner::Plan> plan =
      planner::MakePlan(spec, t.src->view(), t.dst->view(), planner::PlanOptions());
  REQUIRE(plan.ok());
  REQUIRE(plan->num_layers() == kLayers);
  RecordParams params;
  params.id = 9;
  params.spec = spec;
  params.src = t.src;
  params.dst = t.dst;
  params.engine = &t.f.engine;
  params.counters = std::make_shared<Counters>();
  params.clock = &t.f.clock;
  params.ready.region = std::move(flags);
  params.ready.words = reinterpret_cast<uint32_t*>(t.flags->data() + offset);
  params.ready.value = kValue;
  return std::make_shared<Record>(*std::move(plan), std::move(params));
}

TEST_CASE("gated: ready_gate gives the engine the producer's words as the GPU sees them") {
  Streaming t;
  constexpr uint32_t kOffset = 64;
  auto flags = std::make_shared<MappedFlags>(t.flags, false);
  std::shared_ptr<Record> record = GatedRecord(t, flags, kOffset);
  for (int accessor : {0, 3}) {
    const std::optional<job::ReadyGate> gate = record->device_sides()->ready_gate(accessor);
    REQUIRE(gate.has_value());
    CHECK(gate->host_words == reinterpret_cast<uint32_t*>(t.flags->data() + kOffset));
    // The same words through GPU `accessor`'s mapping of the region: its base plus the offset.
    CHECK(gate->device_words ==
          MappedFlags::kDeviceBase + (uint64_t{1} << 20) * accessor + kOffset);
    CHECK(gate->count == kLayers);  // one word per transfer layer
    CHECK(gate->value == kValue);
    CHECK(gate->field == "spec.ready_flags");
    CHECK(gate->keep == flags);  // the words stay mapped while the engine holds the gate
  }
  // A flag region the GPU cannot map: no gate (the engine declines; the poller waits instead).
  std::shared_ptr<Record> refused = GatedRecord(t, std::make_shared<MappedFlags>(t.flags, true), 0);
  CHECK(!refused->device_sides()->ready_gate(0).has_value());
}

}  // namespace
}  // namespace kvrail::transfers

// Resolving a spec: each block-id encoding read once and named as the caller wrote it, locally
// and for remote transfers (whose travelling spec carries block_ids_le32); remote idempotency
// keys are held from before Begin.
#include <catch2/catch.hpp>
#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "daemon/transfers/manager_fixture.h"

namespace kvrail::transfers {
namespace {

using testing::ManagerFixture;

// A RemotePath whose destination is a stand-in for a local paged region and whose Begin blocks
// while `blocking` until Release(). Thread-safe.
class FakeRemote final : public RemotePath {
 public:
  FakeRemote(std::shared_ptr<regions::Region> like, engine::Engine* engine)
      : like_(std::move(like)), engine_(engine) {}
  absl::StatusOr<Prepared> Prepare(const v1::TransferSpec&) override {
    return Prepared{std::make_shared<testing::StandInRegion>(like_), engine_, 1 << 20};
  }
  absl::StatusOr<std::vector<std::string>> Begin(uint64_t, const v1::TransferSpec& spec,
                                                 const regions::Region&, uint64_t,
                                                 const std::shared_ptr<engine::Job>&) override {
    absl::MutexLock lock(&mu_);
    ++begins_;
    travelled_ = spec;
    mu_.Await(absl::Condition(this, &FakeRemote::MayReturn));
    return std::vector<std::string>{"nic0->nic1"};
  }
  void Block() {
    absl::MutexLock lock(&mu_);
    blocking_ = true;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    blocking_ = false;
  }
  // Waits up to `timeout` for `n` Begin calls; returns how many came.
  int AwaitBegins(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return begins_ >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return begins_;
  }
  v1::TransferSpec travelled() {
    absl::MutexLock lock(&mu_);
    return travelled_;
  }

 private:
  bool MayReturn() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !blocking_; }
  const std::shared_ptr<regions::Region> like_;
  engine::Engine* const engine_;
  absl::Mutex mu_;
  int begins_ ABSL_GUARDED_BY(mu_) = 0;
  bool blocking_ ABSL_GUARDED_BY(mu_) = false;
  v1::TransferSpec travelled_ ABSL_GUARDED_BY(mu_);
};

constexpr uint32_t kBlocks = 8;

struct PagedFixture {
  ManagerFixture* f;
  std::shared_ptr<regions::Region> src, dst, table;

  explicit PagedFixture(ManagerFixture* fixture)
      : f(fixture),
        src(fixture->regions.Paged(kBlocks, false)),
        dst(fixture->regions.Paged(kBlocks, true)),
        table(fixture->regions.Bytes(4096, true)) {}

  // Writes `ids` into the table region at byte 64 and points `ep` at them.
  void PutTable(v1::TransferEndpoint* ep, const std::vector<uint32_t>& ids,
                const std::string& named_as = "") {
    std::memcpy(table->data() + 64, ids.data(), 4 * ids.size());
    ep->clear_block_ids();
    auto* ref = ep->mutable_block_table();
    ref->set_region_id(table->id());
    ref->set_offset_bytes(64);
    ref->set_count(static_cast<uint32_t>(ids.size()));
    ref->set_named_as(named_as);
  }
  v1::TransferSpec Spec(const std::vector<uint32_t>& dst_ids) const {
    return testing::BlockSpec(src->id(), {0, 1, 2, 3}, dst->id(), dst_ids);
  }
};

void RequireNamed(const absl::StatusOr<v1::SubmitTransferResponse>& r, const std::string& field) {
  INFO(r.status().ToString());
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()).rfind(field, 0) == 0);
}

const std::vector<uint32_t> kBadDst = {4, 5, 6, kBlocks};  // [3] is out of range

TEST_CASE("local errors name the block-id field the caller used") {
  ManagerFixture f;
  PagedFixture p(&f);
  RequireNamed(f.manager->Submit(f.Bound(p.Spec(kBadDst))), "spec.dst.block_ids[3]: block 8");
  v1::TransferSpec le32 = p.Spec({});
  le32.mutable_dst()->set_block_ids_le32(
      std::string(reinterpret_cast<const char*>(kBadDst.data()), 4 * kBadDst.size()));
  RequireNamed(f.manager->Submit(f.Bound(le32)), "spec.dst.block_ids_le32[3]: block 8");
  le32.mutable_dst()->set_block_ids_le32("abcde");
  RequireNamed(f.manager->Submit(f.Bound(le32)), "spec.dst.block_ids_le32: 5 bytes");
  v1::TransferSpec table = p.Spec({});
  p.PutTable(table.mutable_dst(), kBadDst);
  RequireNamed(f.manager->Submit(f.Bound(table)), "spec.dst.block_table[3]: block 8");
  p.PutTable(table.mutable_dst(), kBadDst, "block_ids");
  RequireNamed(f.manager->Submit(f.Bound(table)), "spec.dst.block_ids[3]: block 8");
  p.PutTable(table.mutable_dst(), kBadDst, "ids");
  RequireNamed(f.manager->Submit(f.Bound(table)), "spec.dst.block_table.named_as");
  table.mutable_dst()->mutable_block_table()->set_region_id(987654);
  RequireNamed(f.manager->Submit(f.Bound(table)), "spec.dst.block_table.region_id");
  // Good ids in a table move.
  p.PutTable(table.mutable_dst(), {4, 5, 6, 7});
  auto ok = f.manager->Submit(f.Bound(table));
  REQUIRE(ok.ok());
  f.engine.RunAll();
  CHECK(f.Get(ok->transfer_id()).state() == v1::TRANSFER_STATE_SUCCEEDED);
}

TEST_CASE("remote transfers: the ids travel as block_ids_le32; errors name the caller's field") {
  testing::FakeEngine fabric_engine;
  // The remote path's destination has the shape of a paged region of its own table.
  testing::TestRegions lease_shape;
  FakeRemote remote(lease_shape.Paged(kBlocks, true), &fabric_engine);
  Options options;
  options.remote = &remote;
  ManagerFixture f(options);
  PagedFixture p(&f);
  v1::TransferSpec spec = p.Spec({});
  spec.mutable_dst()->set_node_id("peer");
  p.PutTable(spec.mutable_dst(), kBadDst);
  RequireNamed(f.manager->Submit(f.Bound(spec)), "spec.dst.block_table[3]: block 8");
  p.PutTable(spec.mutable_dst(), kBadDst, "block_ids");
  RequireNamed(f.manager->Submit(f.Bound(spec)), "spec.dst.block_ids[3]: block 8");
  CHECK(remote.AwaitBegins(1, absl::ZeroDuration()) == 0);
  const std::vector<uint32_t> good = {4, 5, 6, 7};
  p.PutTable(spec.mutable_dst(), good);
  auto accepted = f.manager->Submit(f.Bound(spec));
  REQUIRE(accepted.ok());
  const v1::TransferSpec travelled = remote.travelled();
  CHECK_FALSE(travelled.dst().has_block_table());
  CHECK(travelled.dst().block_ids_le32() ==
        std::string(reinterpret_cast<const char*>(good.data()), 4 * good.size()));
  CHECK(travelled.src().block_ids_size() == 0);
  CHECK(travelled.src().block_ids_le32().size() == 16);
  const v1::TransferStatus status = f.Get(accepted->transfer_id());
  CHECK(status.path() == v1::PATH_FABRIC);
  CHECK(status.nics_size() == 1);
  // The receiving daemon names this link the same way (inbound_test).
  CHECK(status.link() == "fabric:here->peer");
  fabric_engine.RunAll();
  CHECK(f.Get(accepted->transfer_id()).state() == v1::TRANSFER_STATE_SUCCEEDED);
  v1::Stats stats;
  f.manager->FillStats(&stats);
  CHECK(stats.bytes_by_link().count("fabric:here->peer") == 1);
  CHECK(stats.bytes_by_link().at("fabric:here->peer") > 0);
}

// A source on another node (a cross-node pull) is refused for what it is, with or without a
// fabric: the submitting daemon reads only its own node's regions; the fix is a push.
TEST_CASE("a source on another node is refused naming spec.src.node_id and the push to use") {
  testing::FakeEngine fabric_engine;
  testing::TestRegions lease_shape;
  FakeRemote remote(lease_shape.Paged(kBlocks, true), &fabric_engine);
  Options with_fabric;
  with_fabric.remote = &remote;
  ManagerFixture fabric(with_fabric);
  ManagerFixture plain;
  for (ManagerFixture* f : {&fabric, &plain}) {
    PagedFixture p(f);
    v1::TransferSpec spec = p.Spec({4, 5, 6, 7});
    spec.mutable_src()->set_node_id("prefill-node");
    auto refused = f->manager->Submit(f->Bound(spec));
    RequireNamed(refused, "spec.src.node_id: 'prefill-node' is another node");
    const std::string message(refused.status().message());
    CHECK(refused.status().code() == absl::StatusCode::kUnimplemented);
    CHECK(message.find("no fabric path configured") == std::string::npos);
    CHECK(message.find("spec.dst.node_id") != std::string::npos);  // says how: a push
    CHECK(message.find("Transfer.ExportRegion") != std::string::npos);
  }
  CHECK(remote.AwaitBegins(1, absl::ZeroDuration()) == 0);
}

TEST_CASE("two remote submits with one idempotency key start one transfer") {
  testing::FakeEngine fabric_engine;
  testing::TestRegions lease_shape;
  FakeRemote remote(lease_shape.Paged(kBlocks, true), &fabric_engine);
  Options options;
  options.remote = &remote;
  ManagerFixture f(options);
  PagedFixture p(&f);
  v1::TransferSpec spec = p.Spec({4, 5, 6, 7});
  spec.mutable_dst()->set_node_id("peer");
  spec.set_idempotency_key("once");
  remote.Block();
  absl::StatusOr<v1::SubmitTransferResponse> first, second;
  std::thread a([&] { first = f.manager->Submit(f.Bound(spec)); });
  REQUIRE(remote.AwaitBegins(1, absl::Seconds(10)) == 1);  // the first is inside Begin
  std::thread b([&] { second = f.manager->Submit(f.Bound(spec)); });
  // Before the fix the second submit also reached Begin (a second transfer); now it waits for
  // the first. Give it time to get there if it were going to.
  CHECK(remote.AwaitBegins(2, absl::Milliseconds(300)) == 1);
  remote.Release();
  a.join();
  b.join();
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  CHECK(second->transfer_id() == first->transfer_id());
  CHECK(second->deduplicated());
  CHECK_FALSE(first->deduplicated());
  CHECK(remote.AwaitBegins(2, absl::ZeroDuration()) == 1);
  CHECK(f.Stats().transfers_submitted() == 1);
  fabric_engine.RunAll();
}

TEST_CASE("without a CUDA engine, plans take their block tables from the host engine's pool") {
  ManagerFixture f;
  PagedFixture p(&f);
  auto accepted = f.manager->Submit(f.Bound(p.Spec({4, 5, 6, 7})));
  REQUIRE(accepted.ok());
  CHECK(f.engine.tables_taken() == 2);  // the source's table and the destination's
}

}  // namespace
}  // namespace kvrail::transfers

namespace kvrail::transfers {
namespace {

TEST_CASE("done word: in a host region the submitter owns, aligned, inside it, not 0") {
  ManagerFixture f;
  PagedFixture p(&f);
  auto words = f.regions.Bytes(64, true);  // the fixture's session owns it
  auto spec_with = [&](uint64_t region, uint64_t offset, uint64_t value) {
    v1::TransferSpec spec = p.Spec({4, 5, 6, 7});
    spec.mutable_done_word()->set_region_id(region);
    spec.mutable_done_word()->set_byte_offset(offset);
    spec.mutable_done_word()->set_value(value);
    return spec;
  };
  RequireNamed(f.manager->Submit(f.Bound(spec_with(987654, 0, 1))), "spec.done_word.region_id");
  RequireNamed(f.manager->Submit(f.Bound(spec_with(words->id(), 4, 1))),
               "spec.done_word.byte_offset: must be a multiple of 8");
  RequireNamed(f.manager->Submit(f.Bound(spec_with(words->id(), 64, 1))),
               "spec.done_word.byte_offset: 64 leaves no 8-byte word");
  RequireNamed(f.manager->Submit(f.Bound(spec_with(words->id(), 56, 0))),
               "spec.done_word.value: must not be 0");
  auto read_only = f.regions.Bytes(64, false);
  RequireNamed(f.manager->Submit(f.Bound(spec_with(read_only->id(), 0, 1))),
               "spec.done_word.region_id: the GPU writes the done word");
  // Another session's memory, even one it may write by a grant: the word is the submitter's own.
  auto others = f.regions.Bytes(64, true, f.regions.NewSession());
  auto denied = f.manager->Submit(f.Bound(spec_with(others->id(), 0, 1)));
  REQUIRE_FALSE(denied.ok());
  CHECK(denied.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(denied.status().message()).find("spec.done_word.region_id") !=
        std::string::npos);
  // Accepted; the host engine never stores it (only the CUDA engine's stream does), and the
  // daemon never reads it: the client's garbage there changes nothing.
  std::memset(words->data(), 0xab, 64);
  auto ok = f.manager->Submit(f.Bound(spec_with(words->id(), 56, 77)));
  REQUIRE(ok.ok());
  f.engine.RunAll();
  CHECK(f.Get(ok->transfer_id()).state() == v1::TRANSFER_STATE_SUCCEEDED);
  uint64_t word = 0;
  std::memcpy(&word, words->data() + 56, 8);
  CHECK(word == 0xabababababababab);
}

TEST_CASE("done word: a retry with its own word is the same spec for the idempotency key") {
  ManagerFixture f;
  PagedFixture p(&f);
  auto words = f.regions.Bytes(64, true);
  v1::TransferSpec spec = p.Spec({4, 5, 6, 7});
  spec.set_idempotency_key("once");
  spec.mutable_done_word()->set_region_id(words->id());
  spec.mutable_done_word()->set_value(1);
  auto first = f.manager->Submit(f.Bound(spec));
  REQUIRE(first.ok());
  spec.mutable_done_word()->set_byte_offset(8);
  spec.mutable_done_word()->set_value(2);
  auto retry = f.manager->Submit(f.Bound(spec));
  REQUIRE(retry.ok());
  CHECK(retry->deduplicated());
  CHECK(retry->transfer_id() == first->transfer_id());
  f.engine.RunAll();
}

TEST_CASE("done word: a remote transfer's travelling spec does not carry it") {
  testing::FakeEngine fabric_engine;
  testing::TestRegions lease_shape;
  FakeRemote remote(lease_shape.Paged(kBlocks, true), &fabric_engine);
  Options options;
  options.remote = &remote;
  ManagerFixture f(options);
  PagedFixture p(&f);
  auto words = f.regions.Bytes(64, true);
  v1::TransferSpec spec = p.Spec({4, 5, 6, 7});
  spec.mutable_dst()->set_node_id("peer");
  spec.mutable_done_word()->set_region_id(words->id());
  spec.mutable_done_word()->set_value(3);
  auto accepted = f.manager->Submit(f.Bound(spec));
  REQUIRE(accepted.ok());
  CHECK_FALSE(remote.travelled().has_done_word());
  fabric_engine.RunAll();
}

}  // namespace
}  // namespace kvrail::transfers

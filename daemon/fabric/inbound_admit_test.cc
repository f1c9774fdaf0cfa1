// The receiver's admission steps that decide something (inbound_admit.h): the destination layers
// a transfer writes, the receiver's plan against the sender's, the source's lease, the handles.
#include "daemon/fabric/inbound_admit.h"

#include <catch2/catch.hpp>
#include <set>

#include "daemon/planner/planner.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

namespace {

v1::PagedKvLayout Layout() {
  v1::PagedKvLayout p;
  p.set_num_layers(4);
  p.set_num_parts(2);
  p.set_num_blocks(16);
  p.set_tokens_per_block(4);
  p.set_num_heads(2);
  p.set_head_dim(16);
  p.set_dtype(v1::DTYPE_BF16);
  p.set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  return p;
}

planner::RegionView PagedView(bool writable) {
  auto layout = planner::ResolveLayout(Layout(), UINT64_MAX, "");
  REQUIRE(layout.ok());
  planner::RegionView view;
  view.paged = true;
  view.writable = writable;
  view.layout = *layout;
  view.size_bytes = layout->offset + layout->layer_stride * layout->num_layers;
  return view;
}

// A request for blocks {1, 2} -> {5, 6} of every layer, as the sender would plan it.
peer_v1::BeginRemoteTransferRequest Request(uint64_t tile_bytes) {
  peer_v1::BeginRemoteTransferRequest request;
  request.set_sender_node_id("node-a");
  v1::TransferSpec& spec = *request.mutable_spec();
  spec.mutable_src()->set_region_id(11);
  spec.mutable_dst()->set_region_id(22);
  for (uint32_t id : {1, 2}) spec.mutable_src()->add_block_ids(id);
  for (uint32_t id : {5, 6}) spec.mutable_dst()->add_block_ids(id);
  const planner::RegionView view = PagedView(false);
  request.mutable_source()->set_size_bytes(view.size_bytes);
  *request.mutable_source()->mutable_paged_kv() = Layout();
  request.set_tile_bytes(tile_bytes);
  planner::PlanOptions options;
  options.tile_bytes = tile_bytes;
  auto plan = planner::MakePlan(spec, view, PagedView(true), options);
  REQUIRE(plan.ok());
  request.set_bytes_total(plan->bytes_total());
  request.set_tiles_total(plan->num_tiles());
  return request;
}

TEST_CASE("destination layers: the spec's range, the rest of the region, flat regions none") {
  const planner::RegionView paged = PagedView(true);
  v1::TransferSpec spec;
  LayerRange r = DestinationLayers(paged, spec);
  CHECK((r.begin == 0 && r.end == 4));
  spec.mutable_dst()->set_layer_begin(1);
  r = DestinationLayers(paged, spec);
  CHECK((r.begin == 1 && r.end == 4));
  spec.set_num_layers(2);
  r = DestinationLayers(paged, spec);
  CHECK((r.begin == 1 && r.end == 3));
  // A count that would wrap in 32 bits is clamped, never a small range.
  spec.mutable_dst()->set_layer_begin(UINT32_MAX - 1);
  spec.set_num_layers(UINT32_MAX);
  r = DestinationLayers(paged, spec);
  CHECK((r.begin == UINT32_MAX - 1 && r.end == UINT32_MAX));
  // Beyond the region: one layer, left for the grant check to refuse.
  spec.set_num_layers(0);
  spec.mutable_dst()->set_layer_begin(9);
  r = DestinationLayers(paged, spec);
  CHECK((r.begin == 9 && r.end == 10));
  planner::RegionView flat;
  flat.size_bytes = 4096;
  r = DestinationLayers(flat, spec);
  CHECK((r.begin == 0 && r.end == 0));
}

TEST_CASE("the receiver's plan must agree with the sender's and fit the slots") {
  const uint64_t tile = 4096;
  const peer_v1::BeginRemoteTransferRequest request = Request(tile);
  auto planned = PlanInbound(request, PagedView(true), 64 << 10);
  REQUIRE(planned.ok());
  CHECK(planned->plan.bytes_total() == request.bytes_total());
  CHECK(planned->plan.num_tiles() == request.tiles_total());
  CHECK(planned->src_view.paged);

  peer_v1::BeginRemoteTransferRequest differs = request;
  differs.set_tiles_total(request.tiles_total() + 1);
  auto refused = PlanInbound(differs, PagedView(true), 64 << 10);
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(refused.status().message()).rfind("plans differ: ", 0) == 0);

  // A tile plus its seal larger than the slots; with spec.digest the trailer counts too.
  refused = PlanInbound(request, PagedView(true), tile);
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(refused.status().message()).rfind("tile_bytes: ", 0) == 0);
  const uint64_t with_seal = planned->plan.header().tile_bytes + 32;
  CHECK(PlanInbound(request, PagedView(true), with_seal).ok());
  peer_v1::BeginRemoteTransferRequest digest = request;
  digest.mutable_spec()->set_digest(true);
  CHECK(!PlanInbound(digest, PagedView(true), with_seal).ok());
  CHECK(PlanInbound(digest, PagedView(true), with_seal + 8).ok());

  // A source description that is not a layout is refused naming the field.
  peer_v1::BeginRemoteTransferRequest bad = request;
  bad.mutable_source()->mutable_paged_kv()->set_num_layers(0);
  refused = PlanInbound(bad, PagedView(true), 64 << 10);
  REQUIRE(!refused.ok());
  CHECK(std::string(refused.status().message()).find("source.paged_kv.") != std::string::npos);
}

TEST_CASE("the source's lease: the sender's region, held by this node") {
  const peer_v1::BeginRemoteTransferRequest request = Request(4096);
  const v1::RegionLease lease = SourceLease(request, "node-b");
  CHECK(lease.region_id() == 11);
  CHECK(lease.owner_node_id() == "node-a");
  CHECK(lease.holder_node_id() == "node-b");
  CHECK(lease.size_bytes() == request.source().size_bytes());
  CHECK(lease.paged_kv().num_layers() == 4);
}

TEST_CASE("handles: 16 bits, never 0, the next free one from `next`, none when all are taken") {
  std::set<uint32_t> taken;
  auto is_taken = [&](uint32_t h) { return taken.count(h) > 0; };
  CHECK(NextFreeHandle(1, is_taken) == 1u);
  CHECK(NextFreeHandle(0, is_taken) == 1u);
  taken = {5, 6};
  CHECK(NextFreeHandle(5, is_taken) == 7u);
  CHECK(NextFreeHandle(0x10000, is_taken) == 1u);  // wraps to 16 bits, skips 0
  taken = {0xffff};
  CHECK(NextFreeHandle(0xffff, is_taken) == 1u);
  for (uint32_t h = 1; h <= 0xffff; ++h) taken.insert(h);
  CHECK_FALSE(NextFreeHandle(1, is_taken).has_value());
}

}  // namespace
}  // namespace kvrail::fabric

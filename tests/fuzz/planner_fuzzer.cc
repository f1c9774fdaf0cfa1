// libFuzzer target: the planner's admission (daemon/planner): random layouts (ResolveLayout),
// random transfer specs and block tables (MakePlan), then every accepted plan is executed by the
// host twin (ExecuteTileHost) between buffers of exactly the regions' sizes (per-layer sides: one
// allocation of exactly one layer's span per layer), so ASan reports any byte a plan touches
// outside a region, and the result is compared with the independent reference copy
// (planner/testing: ReferenceCopy): an accepted plan moves exactly the bytes the spec names.
//
// The first byte picks how the case starts: a valid random paged, serving-engine or bytes case
// (seeded by the next 8 bytes) that the rest of the input mutates field by field, or a case built
// from the input alone. Sizes are bounded (regions up to 1 MiB, 4096 tiles) to keep runs fast.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "daemon/planner/planner.h"
#include "daemon/planner/testing/random_case.h"
#include "kernels/device_abi.h"

namespace {

namespace v1 = kvrail::v1;
namespace planner = kvrail::planner;
using planner::testing::RandomCase;

constexpr uint64_t kMaxRegionBytes = 1 << 20;
constexpr uint32_t kMaxTiles = 4096;

void CheckAt(bool ok, int line) {
  if (!ok) {
    fprintf(stderr, "check failed at %s:%d\n", __FILE__, line);
    __builtin_trap();  // a finding: libFuzzer saves the input
  }
}
#define Check(ok) CheckAt((ok), __LINE__)

// One side's memory: a single buffer, or one buffer per layer (per-layer regions).
struct Side {
  std::vector<std::unique_ptr<uint8_t[]>> layers;  // per-layer: one exact allocation per layer
  std::unique_ptr<uint8_t[]> whole;
  uint64_t size = 0;
  uint8_t* base() { return whole.get(); }
  void Fill(uint8_t seed) {
    static const std::vector<uint8_t>* pattern = [] {
      auto* p = new std::vector<uint8_t>(kMaxRegionBytes + 256);
      for (size_t i = 0; i < p->size(); ++i) (*p)[i] = static_cast<uint8_t>(i * 131 + i / 251);
      return p;
    }();
    auto fill = [&](uint8_t* p) { std::memcpy(p, pattern->data() + seed, size); };
    if (whole) fill(whole.get());
    for (auto& l : layers) fill(l.get());
  }
  bool Equal(const Side& o) const {
    if (whole && std::memcmp(whole.get(), o.whole.get(), size) != 0) return false;
    for (size_t l = 0; l < layers.size(); ++l) {
      if (std::memcmp(layers[l].get(), o.layers[l].get(), size) != 0) return false;
    }
    return true;
  }
};

uint64_t PickU64(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      return in.ConsumeIntegralInRange<uint64_t>(0, 8);
    case 1:
      return in.ConsumeIntegralInRange<uint64_t>(0, 4096);
    case 2:
      return uint64_t{1} << in.ConsumeIntegralInRange<int>(0, 63);
    default:
      return in.ConsumeIntegral<uint64_t>();
  }
}
uint32_t PickU32(FuzzedDataProvider& in) { return static_cast<uint32_t>(PickU64(in)); }

void MutateLayout(FuzzedDataProvider& in, v1::PagedKvLayout* p) {
  switch (in.ConsumeIntegralInRange<int>(0, 13)) {
    case 0:
      p->set_num_layers(PickU32(in));
      break;
    case 1:
      p->set_num_parts(PickU32(in));
      break;
    case 2:
      p->set_num_blocks(PickU32(in));
      break;
    case 3:
      p->set_tokens_per_block(PickU32(in));
      break;
    case 4:
      p->set_num_heads(PickU32(in));
      break;
    case 5:
      p->set_head_dim(PickU32(in));
      break;
    case 6:
      p->set_dtype(static_cast<v1::DType>(in.ConsumeIntegralInRange<int>(0, 8)));
      break;
    case 7:
      p->set_layer_stride(PickU64(in));
      break;
    case 8:
      p->set_part_stride(PickU64(in));
      break;
    case 9:
      p->set_block_stride(PickU64(in));
      break;
    case 10:
      p->set_token_stride(PickU64(in));
      break;
    case 11:
      p->set_head_stride(PickU64(in));
      break;
    case 12:
      p->set_offset_bytes(PickU64(in));
      break;
    default:
      p->set_order(static_cast<v1::LayoutOrder>(in.ConsumeIntegralInRange<int>(0, 4)));
      break;
  }
}

void MutateEndpoint(FuzzedDataProvider& in, v1::TransferEndpoint* e) {
  switch (in.ConsumeIntegralInRange<int>(0, 6)) {
    case 0:
      e->set_layer_begin(PickU32(in));
      break;
    case 1:
      e->set_head_begin(PickU32(in));
      break;
    case 2:
      e->set_byte_offset(PickU64(in));
      break;
    case 3:
      if (e->block_ids_size() > 0) {
        e->set_block_ids(in.ConsumeIntegralInRange<int>(0, e->block_ids_size() - 1), PickU32(in));
      }
      break;
    case 4:
      e->add_block_ids(PickU32(in));
      break;
    case 5:
      if (e->block_ids_size() > 0) e->mutable_block_ids()->RemoveLast();
      break;
    default:
      e->clear_block_ids();
      break;
  }
}

void Mutate(FuzzedDataProvider& in, RandomCase& c, uint64_t& src_size, uint64_t& dst_size) {
  switch (in.ConsumeIntegralInRange<int>(0, 12)) {
    case 0:
      c.spec.set_num_layers(PickU32(in));
      break;
    case 1:
      c.spec.set_num_heads(PickU32(in));
      break;
    case 2:
      c.spec.set_num_tokens(PickU64(in));
      break;
    case 3:
      c.spec.set_num_bytes(PickU64(in));
      break;
    case 4:
      MutateEndpoint(in, c.spec.mutable_src());
      break;
    case 5:
      MutateEndpoint(in, c.spec.mutable_dst());
      break;
    case 6:
      MutateLayout(in, &c.src_layout);
      break;
    case 7:
      MutateLayout(in, &c.dst_layout);
      break;
    case 8:
      src_size = PickU64(in);
      break;
    case 9:
      dst_size = PickU64(in);
      break;
    case 10:
      c.options.tile_bytes = PickU64(in);
      break;
    case 11:
      c.options.defer_checks_from = in.ConsumeIntegralInRange<uint64_t>(0, 64);
      break;
    default:
      c.dst.writable = !c.dst.writable;
      break;
  }
}

// Builds the view of one side and its memory; false when the layout is refused (an error that
// must name a field) or the region would be too large for a fast run.
bool BuildSide(const v1::PagedKvLayout& layout, bool paged, bool per_layer, uint64_t size,
               bool writable, planner::RegionView* view, Side* side) {
  if (size > kMaxRegionBytes) return false;
  *view = planner::RegionView{};
  view->size_bytes = size;
  view->writable = writable;
  view->paged = paged;
  side->size = size;
  if (paged) {
    absl::StatusOr<planner::KvLayout> k =
        planner::ResolveLayout(layout, size, "spec.paged_kv.", per_layer);
    if (!k.ok()) {
      Check(k.status().code() == absl::StatusCode::kInvalidArgument);
      Check(k.status().message().rfind("spec.paged_kv.", 0) == 0);
      return false;
    }
    view->layout = *k;
    if (per_layer) {
      if (k->num_layers > 64) return false;
      auto bases = std::make_shared<planner::LayerBases>();
      for (uint32_t l = 0; l < k->num_layers; ++l) {
        side->layers.emplace_back(new uint8_t[size == 0 ? 1 : size]);
        bases->push_back(reinterpret_cast<uint64_t>(side->layers.back().get()));
      }
      view->layer_bases = std::move(bases);
      return true;
    }
  }
  side->whole.reset(new uint8_t[size == 0 ? 1 : size]);
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  RandomCase c;
  const int start = in.ConsumeIntegralInRange<int>(0, 3);
  std::mt19937_64 rng(in.ConsumeIntegral<uint64_t>());
  bool src_per_layer = false, dst_per_layer = false;
  switch (start) {
    case 0:
      c = planner::testing::RandomPagedCase(rng);
      break;
    case 1:
      c = planner::testing::RandomServingCase(rng);
      break;
    case 2:
      c = planner::testing::RandomBytesCase(rng);
      break;
    default: {  // from the input alone
      c.src.paged = c.dst.paged = in.ConsumeBool();
      c.src.writable = true;
      c.dst.writable = true;
      if (c.src.paged) {
        for (v1::PagedKvLayout* p : {&c.src_layout, &c.dst_layout}) {
          p->set_num_layers(in.ConsumeIntegralInRange<uint32_t>(0, 8));
          p->set_num_parts(in.ConsumeIntegralInRange<uint32_t>(0, 3));
          p->set_num_blocks(in.ConsumeIntegralInRange<uint32_t>(0, 64));
          p->set_tokens_per_block(in.ConsumeIntegralInRange<uint32_t>(0, 32));
          p->set_num_heads(in.ConsumeIntegralInRange<uint32_t>(0, 8));
          p->set_head_dim(in.ConsumeIntegralInRange<uint32_t>(0, 256));
          p->set_dtype(static_cast<v1::DType>(in.ConsumeIntegralInRange<int>(0, 8)));
          p->set_order(static_cast<v1::LayoutOrder>(in.ConsumeIntegralInRange<int>(0, 3)));
        }
        for (v1::TransferEndpoint* e : {c.spec.mutable_src(), c.spec.mutable_dst()}) {
          const int n = in.ConsumeIntegralInRange<int>(0, 64);
          for (int i = 0; i < n; ++i) e->add_block_ids(in.ConsumeIntegralInRange<uint32_t>(0, 70));
        }
      }
      c.src.size_bytes = in.ConsumeIntegralInRange<uint64_t>(0, 1 << 20);
      c.dst.size_bytes = in.ConsumeIntegralInRange<uint64_t>(0, 1 << 20);
      c.options.tile_bytes = in.ConsumeIntegralInRange<uint64_t>(0, 1 << 16);
      break;
    }
  }
  if (c.src.paged) {
    src_per_layer = in.ConsumeBool();
    dst_per_layer = in.ConsumeBool();
    if (src_per_layer) c.src_layout.set_layer_stride(0);
    if (dst_per_layer) c.dst_layout.set_layer_stride(0);
    // A per-layer side's size is one layer's span: take it from the resolved single-base
    // layout's span when the generator made one.
    for (auto [per_layer, layout, view] : {std::tuple{src_per_layer, &c.src_layout, &c.src},
                                           std::tuple{dst_per_layer, &c.dst_layout, &c.dst}}) {
      if (!per_layer) continue;
      absl::StatusOr<planner::KvLayout> k = planner::ResolveLayout(*layout, UINT64_MAX, "", true);
      if (!k.ok()) continue;
      const uint64_t span =
          k->offset + k->part_stride * (k->num_parts - 1) + k->block_stride * (k->num_blocks - 1) +
          k->token_stride * (k->tokens_per_block - 1) + k->head_stride * (k->num_heads - 1) +
          uint64_t{k->head_dim} * k->dtype_bytes;
      view->size_bytes = span;
    }
  }
  uint64_t src_size = c.src.size_bytes, dst_size = c.dst.size_bytes;
  const int mutations = in.ConsumeIntegralInRange<int>(0, 6);
  for (int i = 0; i < mutations && in.remaining_bytes() > 0; ++i) Mutate(in, c, src_size, dst_size);
  // Block tables read in place (TransferEndpoint.block_table), sometimes.
  std::vector<uint32_t> table_ids;
  planner::TableRefs refs;
  v1::TransferSpec spec = c.spec;  // what MakePlan sees; c.spec keeps the ids for the reference
  if (in.ConsumeBool() && c.spec.dst().block_ids_size() > 0) {
    table_ids.assign(c.spec.dst().block_ids().begin(), c.spec.dst().block_ids().end());
    refs.dst = planner::TableRef{table_ids.data(), table_ids.size(), "dst.block_table"};
    spec.mutable_dst()->clear_block_ids();
  }
  c.options.max_tiles = kMaxTiles;
  c.options.tile_bytes = std::max<uint64_t>(c.options.tile_bytes, 1);

  Side src, dst;
  if (!BuildSide(c.src_layout, c.src.paged, src_per_layer, src_size, c.src.writable, &c.src,
                 &src) ||
      !BuildSide(c.dst_layout, c.dst.paged, dst_per_layer, dst_size, c.dst.writable, &c.dst,
                 &dst)) {
    return 0;
  }
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(spec, c.src, c.dst, c.options, refs);
  if (!plan.ok()) {
    // Refused with a message that names what is wrong, and never OK-looking.
    Check(!plan.status().message().empty());
    return 0;
  }
  if (plan->bytes_total() > 4 << 20) return 0;  // accepted, but too slow to copy here
  Check(plan->num_tiles() <= kMaxTiles);
  if (refs.dst) {
    // A table read in place is copied once: rewriting it afterwards changes nothing.
    for (uint32_t& id : table_ids) id = 0xffffffffu;
  }

  src.Fill(1);
  dst.Fill(2);
  uint64_t bytes = 0;
  bool all_ran = true;
  for (uint32_t t = 0; t < plan->num_tiles(); ++t) {
    if (!plan->CheckTiles(t, t + 1).ok()) {  // deferred id checks: refused tiles never run
      all_ran = false;
      break;
    }
    bytes += plan->tile(t).bytes;
    planner::ExecuteTileHost(*plan, t, src.base(), dst.base());
  }
  if (!all_ran) return 0;
  Check(bytes == plan->bytes_total());
  // The reference copy, from the spec and the layouts directly, into a second destination.
  Side expected;
  planner::RegionView expected_view = c.dst;
  if (dst_per_layer) {
    auto bases = std::make_shared<planner::LayerBases>();
    for (size_t l = 0; l < dst.layers.size(); ++l) {
      expected.layers.emplace_back(new uint8_t[dst.size == 0 ? 1 : dst.size]);
      bases->push_back(reinterpret_cast<uint64_t>(expected.layers.back().get()));
    }
    expected_view.layer_bases = std::move(bases);
  } else {
    expected.whole.reset(new uint8_t[dst.size == 0 ? 1 : dst.size]);
  }
  expected.size = dst.size;
  expected.Fill(2);
  RandomCase reference = c;
  reference.dst = expected_view;
  planner::testing::ReferenceCopy(reference, src.base(), expected.base());
  Check(dst.Equal(expected));
  return 0;
}

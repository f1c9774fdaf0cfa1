#include "tests/bench/host_pools.h"

#include "base/status.h"
#include "tests/harness/daemon_process.h"

namespace kvrail::bench {

absl::StatusOr<HostPools> RegisterHostPools(client::Client& client,
                                            const v1::PagedKvLayout& layout) {
  const uint64_t bytes = testing::LayoutBytes(layout);
  HostPools pools;
  KVRAIL_ASSIGN_OR_RETURN(pools.src, client.CreateHostBuffer(bytes));
  KVRAIL_ASSIGN_OR_RETURN(pools.dst, client.CreateHostBuffer(bytes));
  v1::RegionSpec spec;
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  *spec.mutable_paged_kv() = layout;
  KVRAIL_ASSIGN_OR_RETURN(const v1::RegionInfo a, client.RegisterHostBuffer(*pools.src, spec));
  spec.set_writable(true);
  KVRAIL_ASSIGN_OR_RETURN(const v1::RegionInfo b, client.RegisterHostBuffer(*pools.dst, spec));
  pools.src_region = a.region_id();
  pools.dst_region = b.region_id();
  return pools;
}

}  // namespace kvrail::bench

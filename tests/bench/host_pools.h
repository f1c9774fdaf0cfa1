// Two host pools of one paged layout registered with the daemon, for the session benchmarks.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "client/kvrail_client.h"

namespace kvrail::bench {

// The source (read-only) and destination (writable) host buffers, alive as long as this is.
struct HostPools {
  std::unique_ptr<client::HostBuffer> src, dst;
  uint64_t src_region = 0, dst_region = 0;
};

// Creates two host buffers holding `layout` and registers them: the source read-only, the
// destination writable.
absl::StatusOr<HostPools> RegisterHostPools(client::Client& client,
                                            const v1::PagedKvLayout& layout);

}  // namespace kvrail::bench

// Internal to the transfers module: a TransferSpec resolved against the region table once, at
// the start of a submit. Everything the rest of admission needs from regions/ is looked up here
// (source and destination regions, shared block tables, flag words), and each side's block ids
// are read from whichever encoding the caller used (block_ids, block_ids_le32, block_table) and
// carry the caller's field name, so planner errors name that field directly
// ("spec.dst.block_table[3]: ...", or BlockTableRef.named_as when the client library set it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/access/access.h"
#include "daemon/engine/engine.h"
#include "daemon/planner/planner.h"
#include "daemon/regions/regions.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::transfers {

// One side's block ids. `ids` points into the caller's spec (block_ids, block_ids_le32), into a
// client's table region (kept mapped by `table_region`), or into `owned` (a copy).
struct ResolvedIds {
  const uint32_t* ids = nullptr;  // little-endian uint32s, not necessarily 4-byte aligned
  size_t count = 0;
  // The field errors about these ids name, without "spec.": "dst.block_ids",
  // "dst.block_ids_le32", "dst.block_table" or "dst." + BlockTableRef.named_as.
  std::string field;
  bool given = false;  // the caller set ids on this side (in any encoding)
  std::shared_ptr<regions::Region> table_region;
  std::vector<uint32_t> owned;
};

// A flag array (spec.ready_flags / spec.arrival_flags) in a host region. Null region: none.
struct ResolvedFlags {
  std::shared_ptr<regions::Region> region;
  uint32_t* words = nullptr;  // at byte_offset (set when byte_offset lies within the region)
  uint32_t value = 0;
  uint64_t byte_offset = 0;
  std::string field;  // "spec.ready_flags", "spec.arrival_flags"
  bool set() const { return region != nullptr; }
  // INVALID_ARGUMENT naming `field`.byte_offset when fewer than `layers` words fit (none set: OK).
  absl::Status CheckFits(uint32_t layers) const;
};

// spec.done_word in the submitter's host region. Null region: none.
struct ResolvedDoneWord {
  std::shared_ptr<regions::Region> region;
  uint64_t* word = nullptr;
  uint64_t value = 0;
  bool set() const { return region != nullptr; }
};

// Thread-compatible; lives for one submit. `spec` is the caller's and must outlive it (ids may
// point into it).
struct ResolvedRequest {
  const v1::TransferSpec* spec = nullptr;
  v1::TransferSpec light;  // *spec without block tables (what the record keeps)
  // spec.dst.node_id names another node and a fabric path is configured (PATH_FABRIC).
  bool remote = false;
  engine::PriorityClass priority = engine::PriorityClass::kNormal;
  std::shared_ptr<regions::Region> src;
  std::shared_ptr<regions::Region> dst;  // null when remote: the fabric's lease stands in
  ResolvedIds src_ids;
  ResolvedIds dst_ids;
  ResolvedFlags ready;    // local transfers only
  ResolvedFlags arrival;  // local transfers only
  ResolvedDoneWord done;  // local transfers only

  // The ids for planner::MakePlan (given with `light`, which has no ids of its own).
  planner::TableRefs Tables() const;
  // The spec that travels to the peer for a remote transfer: `light` with each side's resolved
  // ids as block_ids_le32.
  v1::TransferSpec Traveling() const;
};

// The most block ids one side's table may hold in any encoding (64 MiB of ids): the work one
// request may ask of the daemon before anything is planned. A shared table (block_table) is also
// refused, before it is read, when it holds more ids than its transfer uses.
inline constexpr uint64_t kMaxTableIds = uint64_t{1} << 24;

struct ResolveOptions {
  std::string node_id;           // this daemon's node
  bool has_remote_path = false;  // transfers to other nodes can go over the fabric
};

// Checks the fields that need no plan (priority, node ids, flag words' region, alignment and
// value), that the submitter (spec.session_id, set by the server from the caller's
// credentials) owns every region it names or holds a grant for it (PERMISSION_DENIED naming the
// side), and looks everything up. Errors name the field: "spec.src.region_id: ...",
// "spec.dst.block_table.count: ...", "spec.dst.node_id: ..." (UNIMPLEMENTED when no fabric path
// is configured for another node), "spec.src.node_id: ..." (UNIMPLEMENTED for any other node:
// a daemon reads only its own node's regions; cross-node transfers are pushes).
absl::StatusOr<ResolvedRequest> Resolve(const v1::TransferSpec& spec,
                                        const regions::RegionTable& regions,
                                        const access::Grants& grants,
                                        const ResolveOptions& options);

// spec.done_word: a word in a host region session `session` itself owns (the daemon's GPU writes
// it; nobody else's memory), aligned, inside the region, with a value that is not 0. Errors name
// spec.done_word.
absl::StatusOr<ResolvedDoneWord> ResolveDoneWord(const regions::RegionTable& regions,
                                                 const v1::DoneWord& done, uint64_t session);

engine::PriorityClass ToClass(v1::Priority priority);

// The layers [begin, end) of `region` a transfer touches on `side` (both 0 for bytes regions),
// for checking grants limited to layers.
struct LayerRange {
  uint32_t begin = 0;
  uint32_t end = 0;
};
LayerRange TransferLayers(const regions::Region& region, const v1::TransferSpec& spec,
                          const v1::TransferEndpoint& side);

}  // namespace kvrail::transfers

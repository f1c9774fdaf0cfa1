#include "daemon/transfers/resolve.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "proto/kvrail/v1/spec_copy.h"

namespace kvrail::transfers {
namespace {

// A source on another node: the daemon that takes a submit reads only its own node's regions
// (the fabric carries pushes: tiles leave the sender's staging for the receiver's), whether or
// not a fabric path is configured.
absl::Status CheckSourceNode(const v1::TransferEndpoint& src, const std::string& node_id) {
  if (src.node_id().empty() || src.node_id() == node_id) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "spec.src.node_id: '", src.node_id(), "' is another node; a transfer reads only regions of ",
      "the node whose daemon takes the submit (this is node '", node_id,
      "'), so a cross-node pull is not possible: submit it on node '", src.node_id(),
      "' as a push, with spec.dst.node_id = '", node_id,
      "', after the destination's owner exported it to that node (Transfer.ExportRegion)"));
}

absl::Status CheckNode(const v1::TransferEndpoint& ep, const std::string& node_id,
                       const char* field) {
  if (!ep.node_id().empty() && ep.node_id() != node_id) {
    return absl::UnimplementedError(absl::StrCat(field, ".node_id: '", ep.node_id(),
                                                 "' is another node; this daemon (node '", node_id,
                                                 "') has no fabric path configured"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<regions::Region>> GetRegion(const regions::RegionTable& regions,
                                                           uint64_t id, const std::string& field) {
  auto region = regions.Get(id);
  if (!region.ok()) {
    // NOT_FOUND, or FAILED_PRECONDITION for a poisoned region (docs/security.md, "Memory").
    return absl::Status(region.status().code(),
                        absl::StrCat(field, ".region_id: ", region.status().message()));
  }
  return region;
}

// The most block ids side `side_view` of `spec` can use, for refusing a longer shared table
// before it is read (the planner would copy every id, then use only these): with num_tokens set,
// the blocks those tokens fill; otherwise the source's table is the transfer, whose tokens must
// fit the destination's blocks (its ids are distinct), and the destination's ids are at most its
// blocks. kMaxTableIds where a side is not known here (a remote destination) or not paged.
uint64_t MaxTableIds(const v1::TransferSpec& spec, const planner::RegionView* side_view,
                     const planner::RegionView* other_view, bool is_src) {
  uint64_t most = kMaxTableIds;
  if (side_view == nullptr || !side_view->paged || side_view->layout.tokens_per_block == 0) {
    return most;
  }
  const uint64_t tpb = side_view->layout.tokens_per_block;
  if (spec.num_tokens() != 0) return std::min(most, (spec.num_tokens() + tpb - 1) / tpb);
  if (!is_src) return std::min<uint64_t>(most, side_view->layout.num_blocks);
  if (other_view != nullptr && other_view->paged) {
    const uint64_t tokens =
        uint64_t{other_view->layout.num_blocks} * other_view->layout.tokens_per_block;
    most = std::min(most, (tokens + tpb - 1) / tpb);
  }
  return most;
}

// A block table in a client's host region (TransferEndpoint.block_table), checked against the
// region's bounds and against `max_ids` (MaxTableIds) before a byte of it is read. Errors about
// the reference name `side`.block_table.
absl::Status ResolveTable(const regions::RegionTable& regions, const v1::TransferEndpoint& ep,
                          const std::string& side, bool copy, uint64_t session, uint64_t max_ids,
                          ResolvedIds* out) {
  const std::string field = absl::StrCat("spec.", side, ".block_table");
  if (ep.block_ids_size() > 0 || !ep.block_ids_le32().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": set one of block_ids, block_ids_le32 and block_table"));
  }
  const v1::BlockTableRef& table = ep.block_table();
  if (table.count() > max_ids) {
    // Named as the caller wrote it (the client library moves long block_ids here).
    const bool named = table.named_as() == "block_ids" || table.named_as() == "block_ids_le32";
    return absl::InvalidArgumentError(
        absl::StrCat(named ? absl::StrCat("spec.", side, ".", table.named_as(), ": ")
                           : absl::StrCat(field, ".count: "),
                     table.count(), " ids; this transfer uses at most ", max_ids,
                     max_ids == kMaxTableIds ? " (the most one table may hold)"
                                             : " (the blocks its tokens fill on this side)"));
  }
  KVRAIL_ASSIGN_OR_RETURN(out->table_region, GetRegion(regions, table.region_id(), field));
  // Ids are read from the submitter's own memory only: another session's bytes never reach an
  // answer (an out-of-range id would be echoed in the error).
  if (session == 0 || out->table_region->session_id() != session) {
    return absl::PermissionDeniedError(absl::StrCat(
        field, ".region_id: region ", table.region_id(),
        " belongs to another session; block tables are read from the submitter's own regions"));
  }
  const v1::RegionSpec& region = out->table_region->spec();
  if (region.memory_kind() != v1::MEMORY_KIND_HOST) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ".region_id: region ", table.region_id(),
                     " is GPU memory; block tables are read from host memory"));
  }
  const uint64_t size = region.size_bytes();
  const uint64_t bytes = uint64_t{4} * table.count();
  if (table.offset_bytes() > size || size - table.offset_bytes() < bytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".count: ", table.count(),
                                                   " ids at byte ", table.offset_bytes(),
                                                   " do not fit the region's ", size, " bytes"));
  }
  const std::string& named_as = table.named_as();
  if (!named_as.empty() && named_as != "block_table" && named_as != "block_ids" &&
      named_as != "block_ids_le32") {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".named_as: '", named_as, "' is not block_table, block_ids or block_ids_le32"));
  }
  out->field = absl::StrCat(side, ".", named_as.empty() ? "block_table" : named_as);
  out->given = true;
  out->count = table.count();
  const uint8_t* at = out->table_region->data() + table.offset_bytes();
  if (copy) {
    // Read the client's memory once: what is planned here is what travels on.
    out->owned.resize(out->count);
    if (out->count > 0) std::memcpy(out->owned.data(), at, 4 * out->count);
    out->ids = out->owned.data();
    out->table_region.reset();
  } else {
    // The planner copies the ids once, into the plan, and checks the copy.
    out->ids = reinterpret_cast<const uint32_t*>(at);
  }
  return absl::OkStatus();
}

// One side's ids from whichever encoding the caller used.
absl::StatusOr<ResolvedIds> ResolveIds(const regions::RegionTable& regions,
                                       const v1::TransferEndpoint& ep, const std::string& side,
                                       bool copy_tables, uint64_t session, uint64_t max_ids) {
  ResolvedIds out;
  if (ep.has_block_table()) {
    KVRAIL_RETURN_IF_ERROR(ResolveTable(regions, ep, side, copy_tables, session, max_ids, &out));
    return out;
  }
  const uint64_t given = std::max<uint64_t>(ep.block_ids_size(), ep.block_ids_le32().size() / 4);
  if (given > kMaxTableIds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.", side, ep.block_ids_le32().empty() ? ".block_ids: " : ".block_ids_le32: ", given,
        " ids; one table holds at most ", kMaxTableIds));
  }
  const std::string& le32 = ep.block_ids_le32();
  if (!le32.empty()) {
    out.field = absl::StrCat(side, ".block_ids_le32");
    if (ep.block_ids_size() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.", out.field, ": set block_ids or block_ids_le32, not both"));
    }
    if (le32.size() % 4 != 0) {
      return absl::InvalidArgumentError(absl::StrCat("spec.", out.field, ": ", le32.size(),
                                                     " bytes is not a whole number of uint32 ids"));
    }
    // x86-64 and aarch64 are little-endian; the planner copies with memcpy (any alignment).
    out.ids = reinterpret_cast<const uint32_t*>(le32.data());
    out.count = le32.size() / 4;
    out.given = true;
    return out;
  }
  out.field = absl::StrCat(side, ".block_ids");
  out.ids = ep.block_ids().data();
  out.count = static_cast<size_t>(ep.block_ids_size());
  out.given = out.count > 0;
  return out;
}

// A FlagArray's region and static checks; whether its words fit is checked once the plan says
// how many layers there are (ResolvedFlags::CheckFits).
absl::StatusOr<ResolvedFlags> ResolveFlags(const regions::RegionTable& regions,
                                           const access::Grants& grants, const v1::FlagArray& flags,
                                           bool writable, const std::string& field,
                                           uint64_t session) {
  ResolvedFlags out;
  out.field = field;
  KVRAIL_ASSIGN_OR_RETURN(out.region, GetRegion(regions, flags.region_id(), field));
  // Ready flags are read (the producer's words), arrival flags written (the consumer's).
  KVRAIL_RETURN_IF_ERROR(
      grants.CheckAccess(*out.region, session, flags.grant(),
                         writable ? v1::GRANT_ACCESS_WRITE : v1::GRANT_ACCESS_READ, 0, 0, field));
  const v1::RegionSpec& region = out.region->spec();
  if (region.memory_kind() != v1::MEMORY_KIND_HOST) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ".region_id: flag words must be in host memory"));
  }
  if (writable && !region.writable()) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ".region_id: the daemon writes arrival flags; the region is not writable"));
  }
  if (flags.byte_offset() % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".byte_offset: must be a multiple of 4"));
  }
  if (flags.value() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".value: must not be 0"));
  }
  out.value = flags.value();
  out.byte_offset = flags.byte_offset();
  if (out.byte_offset <= region.size_bytes()) {
    out.words = reinterpret_cast<uint32_t*>(out.region->data() + out.byte_offset);
  }
  return out;
}

}  // namespace

absl::StatusOr<ResolvedDoneWord> ResolveDoneWord(const regions::RegionTable& regions,
                                                 const v1::DoneWord& done, uint64_t session) {
  const std::string field = "spec.done_word";
  ResolvedDoneWord out;
  KVRAIL_ASSIGN_OR_RETURN(out.region, GetRegion(regions, done.region_id(), field));
  if (session == 0 || out.region->session_id() != session) {
    return absl::PermissionDeniedError(
        absl::StrCat(field,
                     ".region_id: the done word must be in a region the submitting "
                     "session owns (it is the submitter's own view of its transfer)"));
  }
  const v1::RegionSpec& region = out.region->spec();
  if (region.memory_kind() != v1::MEMORY_KIND_HOST) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ".region_id: the done word must be in host memory"));
  }
  if (!region.writable()) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ".region_id: the GPU writes the done word; the region is not writable"));
  }
  if (done.byte_offset() % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".byte_offset: must be a multiple of 8"));
  }
  if (done.byte_offset() > region.size_bytes() || region.size_bytes() - done.byte_offset() < 8) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".byte_offset: ", done.byte_offset(),
                                                   " leaves no 8-byte word in the region's ",
                                                   region.size_bytes(), " bytes"));
  }
  if (done.value() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".value: must not be 0"));
  }
  out.word = reinterpret_cast<uint64_t*>(out.region->data() + done.byte_offset());
  out.value = done.value();
  return out;
}

LayerRange TransferLayers(const regions::Region& region, const v1::TransferSpec& spec,
                          const v1::TransferEndpoint& side) {
  if (!region.view().paged) return LayerRange{};
  const uint32_t total = region.view().layout.num_layers;
  const uint32_t begin = side.layer_begin();
  if (begin >= total) return LayerRange{begin, begin + 1};  // the planner names the field
  const uint32_t count = spec.num_layers() != 0 ? spec.num_layers() : total - begin;
  // In 64 bits: a count that wraps uint32 must not look like a small range to a grant's check
  // (the planner refuses it; the range stays past the region's layers).
  const uint64_t end = uint64_t{begin} + count;
  return LayerRange{begin, static_cast<uint32_t>(std::min<uint64_t>(end, UINT32_MAX))};
}

engine::PriorityClass ToClass(v1::Priority priority) {
  switch (priority) {
    case v1::PRIORITY_CRITICAL:
      return engine::PriorityClass::kCritical;
    case v1::PRIORITY_BACKGROUND:
      return engine::PriorityClass::kBackground;
    default:
      return engine::PriorityClass::kNormal;
  }
}

absl::Status ResolvedFlags::CheckFits(uint32_t layers) const {
  if (!set()) return absl::OkStatus();
  const uint64_t size = region->spec().size_bytes();
  if (byte_offset > size || (size - byte_offset) / 4 < layers) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".byte_offset: ", layers,
                                                   " flag words at byte ", byte_offset,
                                                   " do not fit the region's ", size, " bytes"));
  }
  return absl::OkStatus();
}

planner::TableRefs ResolvedRequest::Tables() const {
  planner::TableRefs refs;
  if (src_ids.given) refs.src = planner::TableRef{src_ids.ids, src_ids.count, src_ids.field};
  if (dst_ids.given) refs.dst = planner::TableRef{dst_ids.ids, dst_ids.count, dst_ids.field};
  return refs;
}

v1::TransferSpec ResolvedRequest::Traveling() const {
  v1::TransferSpec out = light;
  out.clear_done_word();  // a region of this node: the peer's GPU never writes it
  for (const auto& [ids, ep] :
       {std::pair{&src_ids, out.mutable_src()}, std::pair{&dst_ids, out.mutable_dst()}}) {
    if (!ids->given) continue;
    ep->set_block_ids_le32(std::string(reinterpret_cast<const char*>(ids->ids), 4 * ids->count));
  }
  return out;
}

absl::StatusOr<ResolvedRequest> Resolve(const v1::TransferSpec& spec,
                                        const regions::RegionTable& regions,
                                        const access::Grants& grants,
                                        const ResolveOptions& options) {
  ResolvedRequest out;
  out.spec = &spec;
  if (!v1::Priority_IsValid(spec.priority())) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.priority: unknown value ", spec.priority()));
  }
  out.priority = ToClass(spec.priority());
  KVRAIL_RETURN_IF_ERROR(CheckSourceNode(spec.src(), options.node_id));
  out.remote = options.has_remote_path && !spec.dst().node_id().empty() &&
               spec.dst().node_id() != options.node_id;
  if (!out.remote) KVRAIL_RETURN_IF_ERROR(CheckNode(spec.dst(), options.node_id, "spec.dst"));
  // A remote spec travels on with its ids: tables in shared memory are copied once, here.
  const uint64_t session = spec.session_id();  // the authenticated submitter (server.cc)
  // The sides' geometry, where known here, bounds their shared tables before they are read (an
  // unknown region is named below, by GetRegion).
  std::shared_ptr<regions::Region> src_region, dst_region;
  if (auto found = regions.Get(spec.src().region_id()); found.ok()) src_region = *found;
  if (!out.remote) {
    if (auto found = regions.Get(spec.dst().region_id()); found.ok()) dst_region = *found;
  }
  const planner::RegionView* src_view = src_region ? &src_region->view() : nullptr;
  const planner::RegionView* dst_view = dst_region ? &dst_region->view() : nullptr;
  KVRAIL_ASSIGN_OR_RETURN(out.src_ids, ResolveIds(regions, spec.src(), "src", out.remote, session,
                                                  MaxTableIds(spec, src_view, dst_view, true)));
  KVRAIL_ASSIGN_OR_RETURN(out.dst_ids, ResolveIds(regions, spec.dst(), "dst", out.remote, session,
                                                  MaxTableIds(spec, dst_view, src_view, false)));
  out.light = v1::WithoutBlockTables(spec);
  KVRAIL_ASSIGN_OR_RETURN(out.src, GetRegion(regions, spec.src().region_id(), "spec.src"));
  const LayerRange src_layers = TransferLayers(*out.src, spec, spec.src());
  KVRAIL_RETURN_IF_ERROR(grants.CheckAccess(*out.src, session, spec.src().grant(),
                                            v1::GRANT_ACCESS_READ, src_layers.begin, src_layers.end,
                                            "spec.src"));
  if (out.remote) return out;  // the destination, and any flag words, are the peer's
  KVRAIL_ASSIGN_OR_RETURN(out.dst, GetRegion(regions, spec.dst().region_id(), "spec.dst"));
  const LayerRange dst_layers = TransferLayers(*out.dst, spec, spec.dst());
  KVRAIL_RETURN_IF_ERROR(grants.CheckAccess(*out.dst, session, spec.dst().grant(),
                                            v1::GRANT_ACCESS_WRITE, dst_layers.begin,
                                            dst_layers.end, "spec.dst"));
  if (spec.has_ready_flags()) {
    KVRAIL_ASSIGN_OR_RETURN(out.ready, ResolveFlags(regions, grants, spec.ready_flags(), false,
                                                    "spec.ready_flags", session));
  }
  if (spec.has_arrival_flags()) {
    KVRAIL_ASSIGN_OR_RETURN(out.arrival, ResolveFlags(regions, grants, spec.arrival_flags(), true,
                                                      "spec.arrival_flags", session));
  }
  if (spec.has_done_word()) {
    KVRAIL_ASSIGN_OR_RETURN(out.done, ResolveDoneWord(regions, spec.done_word(), session));
  }
  return out;
}

}  // namespace kvrail::transfers

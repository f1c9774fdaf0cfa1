// Pure helpers declared in kvrail_client.h: block lists, layout arithmetic, spec builders.
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/kvrail_client.h"
#include "proto/kvrail/v1/layout.h"

namespace kvrail::client {
namespace {

absl::StatusOr<uint32_t> ParseBlockId(absl::string_view text, absl::string_view item) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block list item \"", item, "\": missing number"));
  }
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat("block list item \"", item, "\": \"", text,
                                                     "\" is not a non-negative integer"));
    }
  }
  uint64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block list item \"", item, "\": ", text, " is larger than 4294967295"));
  }
  return static_cast<uint32_t>(value);
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> ParseBlockList(absl::string_view text, size_t max_ids) {
  std::vector<uint32_t> ids;
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError("empty block list (want e.g. \"0-99,200,300-310\")");
  }
  size_t index = 0;
  for (absl::string_view raw : absl::StrSplit(text, ',')) {
    const absl::string_view item = absl::StripAsciiWhitespace(raw);
    if (item.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("block list item ", index, " is empty (stray comma?) in \"", text, "\""));
    }
    const size_t dash = item.find('-');
    uint32_t first, last;
    if (dash == absl::string_view::npos) {
      absl::StatusOr<uint32_t> id = ParseBlockId(item, item);
      if (!id.ok()) return id.status();
      first = last = *id;
    } else {
      absl::StatusOr<uint32_t> lo = ParseBlockId(item.substr(0, dash), item);
      if (!lo.ok()) return lo.status();
      absl::StatusOr<uint32_t> hi = ParseBlockId(item.substr(dash + 1), item);
      if (!hi.ok()) return hi.status();
      if (*hi < *lo) {
        return absl::InvalidArgumentError(absl::StrCat("block list item \"", item, "\": range end ",
                                                       *hi, " is below its start ", *lo));
      }
      first = *lo;
      last = *hi;
    }
    const uint64_t count = uint64_t{last} - first + 1;
    if (ids.size() + count > max_ids) {
      return absl::InvalidArgumentError(
          absl::StrCat("block list has more than ", max_ids, " ids (at item \"", item, "\")"));
    }
    for (uint64_t id = first; id <= last; ++id) ids.push_back(static_cast<uint32_t>(id));
    ++index;
  }
  return ids;
}

std::string FormatBlockList(const std::vector<uint32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j] != std::numeric_limits<uint32_t>::max() &&
           ids[j + 1] == ids[j] + 1) {
      ++j;
    }
    if (!out.empty()) out += ',';
    if (j == i) {
      absl::StrAppend(&out, ids[i]);
    } else {
      absl::StrAppend(&out, ids[i], "-", ids[j]);
    }
    i = j + 1;
  }
  return out;
}

uint32_t DTypeSize(v1::DType dtype) { return v1::DTypeBytes(dtype); }

absl::StatusOr<PagedStrides> ResolveStrides(const v1::PagedKvLayout& layout) {
  PagedStrides s;
  s.dtype_size = DTypeSize(layout.dtype());
  if (s.dtype_size == 0)
    return absl::InvalidArgumentError("paged_kv.dtype: unspecified or unknown");
  if (layout.num_layers() == 0 || layout.num_parts() == 0 || layout.num_blocks() == 0 ||
      layout.tokens_per_block() == 0 || layout.num_heads() == 0 || layout.head_dim() == 0) {
    return absl::InvalidArgumentError(
        "paged_kv: num_layers, num_parts, num_blocks, tokens_per_block, num_heads and head_dim "
        "must all be > 0");
  }
  if (layout.layer_stride() != 0 || layout.part_stride() != 0 || layout.block_stride() != 0 ||
      layout.token_stride() != 0 || layout.head_stride() != 0) {
    s.layer = layout.layer_stride();
    s.part = layout.part_stride();
    s.block = layout.block_stride();
    s.token = layout.token_stride();
    s.head = layout.head_stride();
    return s;
  }
  v1::LayoutStrides dense;
  if (v1::DeriveDenseStrides(layout, s.dtype_size, &dense) != v1::DeriveResult::kOk) {
    return absl::InvalidArgumentError(
        "paged_kv: strides are all zero and order is unspecified, or the layout is too large");
  }
  s.layer = dense.layer;
  s.part = dense.part;
  s.block = dense.block;
  s.token = dense.token;
  s.head = dense.head;
  return s;
}

absl::StatusOr<uint64_t> PagedLayoutBytes(const v1::PagedKvLayout& layout) {
  absl::StatusOr<PagedStrides> s = ResolveStrides(layout);
  if (!s.ok()) return s.status();
  return layout.offset_bytes() + (layout.num_layers() - 1) * s->layer +
         (layout.num_parts() - 1) * s->part + (layout.num_blocks() - 1) * s->block +
         (layout.tokens_per_block() - 1) * s->token + (layout.num_heads() - 1) * s->head +
         uint64_t{layout.head_dim()} * s->dtype_size;
}

uint64_t PagedOffset(const v1::PagedKvLayout& layout, const PagedStrides& strides, uint32_t layer,
                     uint32_t part, uint32_t block, uint32_t token, uint32_t head) {
  return layout.offset_bytes() + layer * strides.layer + part * strides.part +
         block * strides.block + token * strides.token + head * strides.head;
}

v1::TransferSpec MakeBlockTransfer(uint64_t src_region, std::vector<uint32_t> src_blocks,
                                   uint64_t dst_region, std::vector<uint32_t> dst_blocks) {
  v1::TransferSpec spec;
  spec.mutable_src()->set_region_id(src_region);
  spec.mutable_src()->mutable_block_ids()->Add(src_blocks.begin(), src_blocks.end());
  spec.mutable_dst()->set_region_id(dst_region);
  spec.mutable_dst()->mutable_block_ids()->Add(dst_blocks.begin(), dst_blocks.end());
  return spec;
}

bool IsFinal(v1::TransferState state) {
  return state == v1::TRANSFER_STATE_SUCCEEDED || state == v1::TRANSFER_STATE_FAILED ||
         state == v1::TRANSFER_STATE_CANCELLED;
}

}  // namespace kvrail::client

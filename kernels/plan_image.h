// The device image of a plan, as DevicePlanBuffer::Upload (kv_copy.h) lays it out: the header
// with the engine's fields filled in, the source then the destination uint32 block tables, and,
// 8-byte aligned after them, the per-layer sides' uint64 layer tables (source first). Pure host
// code (no CUDA): the upload writes the whole image into pinned staging memory with it (one copy
// to the GPU instead of up to five, none from pageable memory), and plan_image_test checks it.
// The block ids are one contiguous section (IdsSection): a buffer kept on the GPU for a plan's
// shape (PlanShapeKey) takes a later plan of that shape by rewriting that section alone
// (DevicePlanBuffer::UploadBlockIds). Thread-safe (no state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/device_abi.h"

namespace kvrail::kernels {

// Byte offsets of the image's parts from its start, and its size.
struct PlanImageLayout {
  size_t src_n = 0, dst_n = 0;  // block table entries (uint32)
  size_t src_l = 0, dst_l = 0;  // layer table entries (uint64; 0 for a single-base side)
  size_t src_blocks_at = 0, dst_blocks_at = 0;
  size_t tables_end = 0;  // end of the block tables
  size_t layers_at = 0;   // tables_end rounded up to 8
  size_t src_layers_at = 0, dst_layers_at = 0;
  size_t bytes = 0;
};

inline PlanImageLayout LayoutPlanImage(const PlanHeader& header) {
  PlanImageLayout l;
  l.src_n = header.src.num_table_blocks;
  l.dst_n = header.dst.num_table_blocks;
  // A per-layer side's table is indexed by layer_begin + l (device_abi.h).
  l.src_l = header.src.layer_bases != 0 ? size_t{header.src.layer_begin} + header.num_layers : 0;
  l.dst_l = header.dst.layer_bases != 0 ? size_t{header.dst.layer_begin} + header.num_layers : 0;
  l.src_blocks_at = sizeof(PlanHeader);
  l.dst_blocks_at = l.src_blocks_at + 4 * l.src_n;
  l.tables_end = l.dst_blocks_at + 4 * l.dst_n;
  l.layers_at = (l.tables_end + 7) / 8 * 8;
  l.src_layers_at = l.layers_at;
  l.dst_layers_at = l.layers_at + 8 * l.src_l;
  l.bytes = l.dst_layers_at + 8 * l.dst_l;
  return l;
}

// The image's block-id section: both block tables, back to back (the source's first), the one part
// of the image that differs between plans of the same shape (PlanShapeKey).
struct PlanIdsSection {
  size_t at = 0;  // byte offset in the image
  size_t bytes = 0;
};

inline PlanIdsSection IdsSection(const PlanImageLayout& l) {
  return PlanIdsSection{l.src_blocks_at, l.tables_end - l.src_blocks_at};
}

// Writes the block-id section (IdsSection(l), as it lies in the image) into `out` (host memory of
// `out_bytes`); false (nothing written) when it does not fit.
inline bool WritePlanIds(const PlanImageLayout& l, const uint32_t* src_blocks,
                         const uint32_t* dst_blocks, void* out, size_t out_bytes) {
  const PlanIdsSection ids = IdsSection(l);
  if (out == nullptr || out_bytes < ids.bytes) return false;
  auto* at = static_cast<uint8_t*>(out);
  if (l.src_n > 0) std::memcpy(at, src_blocks, 4 * l.src_n);
  if (l.dst_n > 0) std::memcpy(at + 4 * l.src_n, dst_blocks, 4 * l.dst_n);
  return true;
}

// The header the GPU reads when the image starts at device address `device`: the regions'
// device-visible bases and the tables' device addresses filled in.
inline PlanHeader DevicePlanHeader(const PlanHeader& header, const PlanImageLayout& layout,
                                   uint64_t device, uint64_t src_base, uint64_t dst_base) {
  PlanHeader h = header;
  h.src.base = src_base;
  h.dst.base = dst_base;
  h.src.block_table = device + layout.src_blocks_at;
  h.dst.block_table = device + layout.dst_blocks_at;
  if (layout.src_l > 0) h.src.layer_bases = device + layout.src_layers_at;
  if (layout.dst_l > 0) h.dst.layer_bases = device + layout.dst_layers_at;
  return h;
}

// Writes the whole image for device address `device` into `out` (host memory of `out_bytes`);
// false (nothing written) when it does not fit. The layer tables are read from the host
// addresses in header.{src,dst}.layer_bases.
inline bool WritePlanImage(const PlanHeader& header, const uint32_t* src_blocks,
                           const uint32_t* dst_blocks, uint64_t src_base, uint64_t dst_base,
                           uint64_t device, void* out, size_t out_bytes) {
  const PlanImageLayout l = LayoutPlanImage(header);
  if (out == nullptr || out_bytes < l.bytes) return false;
  auto* at = static_cast<uint8_t*>(out);
  const PlanHeader h = DevicePlanHeader(header, l, device, src_base, dst_base);
  std::memcpy(at, &h, sizeof(h));
  if (l.src_n > 0) std::memcpy(at + l.src_blocks_at, src_blocks, 4 * l.src_n);
  if (l.dst_n > 0) std::memcpy(at + l.dst_blocks_at, dst_blocks, 4 * l.dst_n);
  if (l.layers_at > l.tables_end) std::memset(at + l.tables_end, 0, l.layers_at - l.tables_end);
  if (l.src_l > 0) {
    std::memcpy(at + l.src_layers_at, reinterpret_cast<const void*>(header.src.layer_bases),
                8 * l.src_l);
  }
  if (l.dst_l > 0) {
    std::memcpy(at + l.dst_layers_at, reinterpret_cast<const void*>(header.dst.layer_bases),
                8 * l.dst_l);
  }
  return true;
}

// A plan's shape: its image for device address 0 without the block-id section (the header with
// the sides' bases, the padding, the layer tables' entries). Plans with equal keys have images
// that differ in IdsSection only, at every device address: a buffer uploaded for one serves the
// other once that section is rewritten. A region moved or replaced changes the bases or the
// layer addresses, hence the key. The layer tables are read from the host addresses in
// header.{src,dst}.layer_bases, as WritePlanImage reads them.
inline std::string PlanShapeKey(const PlanHeader& header, uint64_t src_base, uint64_t dst_base) {
  const PlanImageLayout l = LayoutPlanImage(header);
  const PlanHeader h = DevicePlanHeader(header, l, 0, src_base, dst_base);
  std::string key(sizeof(h) + 8 * (l.src_l + l.dst_l), '\0');
  std::memcpy(key.data(), &h, sizeof(h));
  if (l.src_l > 0) {
    std::memcpy(key.data() + sizeof(h), reinterpret_cast<const void*>(header.src.layer_bases),
                8 * l.src_l);
  }
  if (l.dst_l > 0) {
    std::memcpy(key.data() + sizeof(h) + 8 * l.src_l,
                reinterpret_cast<const void*>(header.dst.layer_bases), 8 * l.dst_l);
  }
  return key;
}

}  // namespace kvrail::kernels

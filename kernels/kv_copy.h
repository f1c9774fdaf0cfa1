// The fused gather/scatter kernel: moves a plan's head vectors (coalesced into chunks) from the
// source region to the destination region on a GPU, computing every address from the plan header
// and the two block tables (kernels/plan_math.h). The destination may be the same GPU, a peer GPU
// (direct NVLink stores) or mapped pinned host memory.
//
// No CUDA header is needed to use it: streams are the runtime's opaque `CUstream_st*`
// (cudaStream_t is a typedef of it).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device_abi.h"
#include "kernels/kernel_arch.h"
#include "kernels/plan_image.h"
#include "kernels/segment_math.h"

struct CUstream_st;

namespace kvrail::kernels {

using CudaStream = CUstream_st*;

// A plan resident in device memory, ready to launch.
struct DevicePlan {
  const PlanHeader* header = nullptr;  // device address: header with engine fields filled in
  uint32_t num_tiles = 0;              // copied from the header
  uint32_t access_bytes = 1;           // the plan's access width narrowed to the base pointers
  uint32_t piece_bytes = 0;            // > 0: the warp path with pieces of this size (plan_math.h)
  // The segment path (plan_math.h: SegmentAt) when there are no pieces: chunked plans (not
  // kBytes) whose access width is under 8 bytes, and short chunks that do not merge at 8-byte
  // accesses or as 16-byte head vectors (segment_math.h: TakesSegmentPath). Set by Upload; a
  // benchmark may change piece_bytes / segments to time the other paths (any of the three moves
  // any plan correctly, pieces only with a piece size from PieceBytesFor).
  bool segments = false;
  // The segment path's form, set by Upload (segment_math.h: SegmentFormFor, then kernel_arch.h:
  // SegmentFormOn for the current device). LaunchKvCopy runs the forms the daemon uses
  // (IsDaemonSegmentForm), a bulk-staged one as SegmentFormOn says for `arch` below; a
  // benchmark picks any form through kv_copy_forms.h.
  SegmentForm segment_form = SegmentForm::kDefault;
  // What the device the plan was uploaded to runs the kernels as (CurrentKernelArch, probed once
  // by Upload): the launches choose their forms from it (SegmentFormOn, DigestStagingOn) without
  // asking the device again. A plan made by hand leaves it unknown: no bulk-copy form runs.
  KernelArch arch;
};

// Owns one device allocation holding a plan's header followed by its two block tables.
class DevicePlanBuffer {
 public:
  // Copies `header` (with src/dst base addresses and table pointers filled in) and the tables to
  // the current device. `src_base` / `dst_base` are the regions' device-visible addresses (device
  // memory, a peer's memory or mapped pinned host memory). Stream-ordered on `stream`: the
  // buffer is allocated, filled and (on destruction) freed in that stream's order, without
  // synchronizing the device, so launch the kernels that read it on the same stream, and let it
  // go only while `stream` is still alive. Tables in pageable memory are staged before this
  // returns; tables in pinned memory are read by the copy engine later, in stream order, so they
  // must stay until the stream has passed this point (record an event after it). A per-layer
  // side's header.{src,dst}.layer_bases is read as a host pointer to its layer table (addresses
  // valid on the current device) and replaced by the table's copy in the buffer.
  // With `staging` (pinned host memory of `staging_bytes`) large enough for the whole image
  // (plan_image.h: LayoutPlanImage(header).bytes), the image is written there and copied with
  // one asynchronous copy (a small plan's upload: one API call instead of three to five, none
  // from pageable memory); keep `staging` until the stream has passed this point. Otherwise as
  // above, with the header copied from `staging` when it holds one.
  static absl::StatusOr<DevicePlanBuffer> Upload(const PlanHeader& header,
                                                 const uint32_t* src_blocks,
                                                 const uint32_t* dst_blocks, uint64_t src_base,
                                                 uint64_t dst_base, CudaStream stream,
                                                 void* staging = nullptr, size_t staging_bytes = 0);
  // Rewrites the block-id section (plan_image.h: IdsSection) with another plan's ids, in the
  // stream order of the buffer's upload: the plan must have the shape the buffer was uploaded
  // for (plan_image.h: PlanShapeKey equal; so its tables have the same sizes). Kernels enqueued
  // on that stream before this read the old ids, those after it the new ones; the caller makes
  // sure no kernel still to be enqueued expects the old ones. With `staging` (pinned) large
  // enough for the section, the ids are written there and go in one asynchronous copy (keep
  // `staging` until the stream has passed this point); otherwise one copy per table, read as in
  // Upload (pageable tables staged before this returns, pinned ones later in stream order).
  // On an error the section may hold a mix of old and new ids: the buffer must not be used
  // again.
  absl::Status UploadBlockIds(const uint32_t* src_blocks, const uint32_t* dst_blocks,
                              void* staging = nullptr, size_t staging_bytes = 0);
  // Bytes of the device allocation (the whole image).
  size_t bytes() const { return layout_.bytes; }

  DevicePlanBuffer(DevicePlanBuffer&& other) noexcept;
  DevicePlanBuffer& operator=(DevicePlanBuffer&& other) noexcept;
  DevicePlanBuffer(const DevicePlanBuffer&) = delete;
  DevicePlanBuffer& operator=(const DevicePlanBuffer&) = delete;
  ~DevicePlanBuffer();

  const DevicePlan& plan() const { return plan_; }

 private:
  DevicePlanBuffer() = default;
  void* memory_ = nullptr;
  CudaStream stream_ = nullptr;
  PlanImageLayout layout_;
  DevicePlan plan_;
};

// Enqueues the kernel for tiles [tile_begin, tile_end) of `plan` on `stream`: `num_ctas` CTAs of
// `threads_per_cta` threads. With `plan.piece_bytes` set each warp grid-strides over pieces (up
// to 4 KiB inside one chunk), each thread keeping up to 8 16-byte loads in flight; with
// `plan.segments` each warp moves 32 chunk segments per step in 16-byte destination units;
// otherwise each CTA grid-strides over slabs, 8 loads of the access width per thread. Returns the
// CUDA launch error, if any, as a Status naming the CUDA error.
absl::Status LaunchKvCopy(const DevicePlan& plan, uint32_t tile_begin, uint32_t tile_end,
                          int num_ctas, CudaStream stream, int threads_per_cta = 512);

// Stores `value` at `device_word` (8-byte aligned, e.g. mapped host memory) in `stream`'s order
// from a one-thread kernel that first makes every earlier write of the stream visible to the host
// (__threadfence_system): the GPU-written completion where cuStreamWriteValue64 is missing.
absl::Status LaunchDoneWordStore(uint64_t device_word, uint64_t value, CudaStream stream);
// What the current device runs this library's kernels as (kernel_arch.h): probed once per device
// (the first call loads the module), then a cached lookup. An error when there is no device or
// the binary holds no code for it (a GPU older than sm_80: FAILED_PRECONDITION).
absl::StatusOr<KernelArch> CurrentKernelArch();

// Loads every kernel of this library on the current device (one empty launch each, on
// `stream`, waited for): with lazy module loading a kernel's first launch would otherwise load
// it inside the first transfer (and may synchronize the whole context).
absl::Status WarmUpKvCopy(CudaStream stream);

}  // namespace kvrail::kernels

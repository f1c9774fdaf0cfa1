// Host side of kv_copy.h: plan upload and launch, CUDA errors turned into absl::Status.
#include "kernels/kv_copy.h"

#include <atomic>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/kv_copy_launch.h"
#include "kernels/plan_image.h"
#include "kernels/plan_math.h"
#include "kernels/segment_math.h"

namespace kvrail::kernels {
namespace {

absl::Status CudaStatus(int error, const char* what) {
  if (error == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", internal::ErrorName(error), ": ", internal::ErrorString(error)));
}

// The inner-loop choice in Upload (see there).
constexpr uint32_t kMinWarpPieceBytes = 2048;

uint32_t NarrowToAlignment(uint32_t access, uint64_t address) {
  while (access > 1 && address % access != 0) access /= 2;
  return access;
}

// CurrentKernelArch's cache: per device ordinal, device_cc << 16 | code_arch (0: not probed).
// Devices past the table are probed on every call.
constexpr int kArchCacheDevices = 64;
std::atomic<uint32_t> g_arch_cache[kArchCacheDevices];

}  // namespace

absl::StatusOr<KernelArch> CurrentKernelArch() {
  int device = -1;
  if (absl::Status s = CudaStatus(internal::CurrentDevice(&device), "cudaGetDevice"); !s.ok()) {
    return s;
  }
  KernelArch arch;
  const uint32_t cached = device >= 0 && device < kArchCacheDevices
                              ? g_arch_cache[device].load(std::memory_order_relaxed)
                              : 0u;
  if (cached != 0) {
    arch.device_cc = static_cast<int>(cached >> 16);
    arch.code_arch = static_cast<int>(cached & 0xffff);
    return arch;
  }
  if (absl::Status s =
          CudaStatus(internal::ProbeKernelArch(&device, &arch.device_cc, &arch.code_arch),
                     "probe the kernels' architecture");
      !s.ok()) {
    return s;
  }
  if (!RunsKernels(arch)) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ", device, " (compute capability ", arch.device_cc / 10, ".",
                     arch.device_cc % 10, ") runs the kernels as sm_", arch.code_arch,
                     ": they need sm_", kMinKernelArch, " or newer"));
  }
  if (device >= 0 && device < kArchCacheDevices) {
    g_arch_cache[device].store(
        static_cast<uint32_t>(arch.device_cc) << 16 | static_cast<uint32_t>(arch.code_arch),
        std::memory_order_relaxed);
  }
  return arch;
}

absl::StatusOr<DevicePlanBuffer> DevicePlanBuffer::Upload(
    const PlanHeader& header, const uint32_t* src_blocks, const uint32_t* dst_blocks,
    uint64_t src_base, uint64_t dst_base, CudaStream stream, void* staging, size_t staging_bytes) {
  // Per-layer sides: entries [0, layer_begin + num_layers) of their layer tables follow the block
  // tables (8-byte aligned), and the header points at those copies (plan_image.h).
  const PlanImageLayout layout = LayoutPlanImage(header);
  absl::StatusOr<KernelArch> arch = CurrentKernelArch();
  if (!arch.ok()) return arch.status();
  DevicePlanBuffer buffer;
  buffer.stream_ = stream;
  buffer.layout_ = layout;
  if (absl::Status s = CudaStatus(internal::DeviceAlloc(&buffer.memory_, layout.bytes, stream),
                                  "cudaMallocAsync(plan)");
      !s.ok()) {
    return s;
  }
  const uint64_t device = reinterpret_cast<uint64_t>(buffer.memory_);
  if (WritePlanImage(header, src_blocks, dst_blocks, src_base, dst_base, device, staging,
                     staging_bytes)) {
    // The whole image from the caller's pinned staging: one copy, read by the copy engine later
    // in stream order (the caller keeps `staging` until the stream has passed this point).
    if (absl::Status s = CudaStatus(
            internal::CopyToDevice(buffer.memory_, staging, layout.bytes, stream), "upload plan");
        !s.ok()) {
      return s;
    }
  } else {
    PlanHeader h = DevicePlanHeader(header, layout, device, src_base, dst_base);
    // Three copies straight from the caller's memory, no staging image (a megabyte-sized table
    // would be copied once more on the host). Copies from pageable memory (`h`, unless the
    // staging holds it) are staged by the driver before cudaMemcpyAsync returns; pinned tables
    // are read later (see kv_copy.h).
    const void* h_from = &h;
    if (staging != nullptr && staging_bytes >= sizeof(h)) {
      std::memcpy(staging, &h, sizeof(h));
      h_from = staging;
    }
    uint8_t* at = static_cast<uint8_t*>(buffer.memory_);
    const std::pair<const void*, size_t> parts[3] = {
        {h_from, sizeof(h)}, {src_blocks, 4 * layout.src_n}, {dst_blocks, 4 * layout.dst_n}};
    for (const auto& [from, n] : parts) {
      if (n == 0) continue;
      if (absl::Status s = CudaStatus(internal::CopyToDevice(at, from, n, stream), "upload plan");
          !s.ok()) {
        return s;
      }
      at += n;
    }
    // The layer tables are the caller's (pageable) host arrays: staged before this returns.
    const std::pair<uint64_t, size_t> layer_parts[2] = {{header.src.layer_bases, layout.src_l},
                                                        {header.dst.layer_bases, layout.dst_l}};
    at = static_cast<uint8_t*>(buffer.memory_) + layout.layers_at;
    for (const auto& [from, n] : layer_parts) {
      if (n == 0) continue;
      if (absl::Status s = CudaStatus(
              internal::CopyToDevice(at, reinterpret_cast<const void*>(from), 8 * n, stream),
              "upload layer table");
          !s.ok()) {
        return s;
      }
      at += 8 * n;
    }
  }
  buffer.plan_.header = static_cast<const PlanHeader*>(buffer.memory_);
  buffer.plan_.num_tiles = header.num_tiles;
  // The planner's width covers offsets and strides; the bases are the engine's.
  buffer.plan_.access_bytes =
      NarrowToAlignment(NarrowToAlignment(header.access_bytes, src_base), dst_base);
  buffer.plan_.piece_bytes = PieceBytesFor(header, buffer.plan_.access_bytes);
  // Which inner loop (measured on one H200 GPU0 -> GPU0 at 32 CTAs, tests/gpu/layout_bench):
  // pieces under 2 KiB keep too little in flight per warp (512-byte pieces 250 GB/s) where the
  // slab path keeps 64 KiB per CTA (256-byte head vectors with
  // 16-byte accesses: 607-732 GB/s), so they take the slab path; plans whose accesses are
  // narrower than 8 bytes (odd vector sizes, odd offsets) take the segment path (657-byte
  // vectors 223-226 GB/s against 54-65 on the slab path at 1-byte accesses; bf16 at an odd
  // offset 182 against 125); short unmerged chunks at 8-byte accesses and short 16-byte head
  // vectors take it too, where the split form beat the slab path (TakesSegmentPath below).
  if (buffer.plan_.piece_bytes != 0 && buffer.plan_.piece_bytes < kMinWarpPieceBytes) {
    buffer.plan_.piece_bytes = 0;
  }
  // The segment form per plan (segment_math.h: TakesSegmentPath, SegmentFormFor) and device
  // (kernel_arch.h: SegmentFormOn).
  buffer.plan_.segments =
      buffer.plan_.piece_bytes == 0 && TakesSegmentPath(header, buffer.plan_.access_bytes);
  buffer.plan_.segment_form = SegmentFormOn(SegmentFormFor(header), *arch);
  buffer.plan_.arch = *arch;
  return buffer;
}

absl::Status DevicePlanBuffer::UploadBlockIds(const uint32_t* src_blocks,
                                              const uint32_t* dst_blocks, void* staging,
                                              size_t staging_bytes) {
  if (memory_ == nullptr) return absl::FailedPreconditionError("no plan buffer to rewrite");
  const PlanIdsSection ids = IdsSection(layout_);
  if (ids.bytes == 0) return absl::OkStatus();
  uint8_t* at = static_cast<uint8_t*>(memory_) + ids.at;
  if (WritePlanIds(layout_, src_blocks, dst_blocks, staging, staging_bytes)) {
    return CudaStatus(internal::CopyToDevice(at, staging, ids.bytes, stream_), "upload block ids");
  }
  const std::pair<const void*, size_t> parts[2] = {{src_blocks, 4 * layout_.src_n},
                                                   {dst_blocks, 4 * layout_.dst_n}};
  for (const auto& [from, n] : parts) {
    if (n == 0) continue;
    if (absl::Status s =
            CudaStatus(internal::CopyToDevice(at, from, n, stream_), "upload block ids");
        !s.ok()) {
      return s;
    }
    at += n;
  }
  return absl::OkStatus();
}

DevicePlanBuffer::DevicePlanBuffer(DevicePlanBuffer&& other) noexcept
    : memory_(std::exchange(other.memory_, nullptr)),
      stream_(other.stream_),
      layout_(other.layout_),
      plan_(other.plan_) {}

DevicePlanBuffer& DevicePlanBuffer::operator=(DevicePlanBuffer&& other) noexcept {
  if (this != &other) {
    if (memory_ != nullptr) internal::DeviceFree(memory_, stream_);
    memory_ = std::exchange(other.memory_, nullptr);
    stream_ = other.stream_;
    layout_ = other.layout_;
    plan_ = other.plan_;
  }
  return *this;
}

DevicePlanBuffer::~DevicePlanBuffer() {
  if (memory_ != nullptr) internal::DeviceFree(memory_, stream_);
}

absl::Status WarmUpKvCopy(CudaStream stream) {
  absl::StatusOr<KernelArch> arch = CurrentKernelArch();
  if (!arch.ok()) return arch.status();
  return CudaStatus(internal::WarmUpKernels(stream, HasBulkCopies(*arch)), "kv_copy warm-up");
}

absl::Status LaunchDoneWordStore(uint64_t device_word, uint64_t value, CudaStream stream) {
  if (device_word == 0 || device_word % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("done word at ", device_word, ": not an 8-byte aligned address"));
  }
  return CudaStatus(
      internal::DoneWordStoreLaunch(reinterpret_cast<uint64_t*>(device_word), value, stream),
      "done word store");
}

absl::Status LaunchKvCopy(const DevicePlan& plan, uint32_t tile_begin, uint32_t tile_end,
                          int num_ctas, CudaStream stream, int threads_per_cta) {
  if (tile_end > plan.num_tiles || tile_begin > tile_end) {
    return absl::InvalidArgumentError(absl::StrCat("tiles [", tile_begin, ", ", tile_end,
                                                   ") outside the plan's ", plan.num_tiles));
  }
  if (num_ctas <= 0 || threads_per_cta <= 0 || threads_per_cta > 512 || threads_per_cta % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad launch shape: ", num_ctas, " CTAs x ", threads_per_cta, " threads"));
  }
  if (plan.segments && plan.piece_bytes == 0) {
    if (!IsDaemonSegmentForm(plan.segment_form)) {
      return absl::InvalidArgumentError(
          absl::StrCat("DevicePlan::segment_form ", static_cast<int>(plan.segment_form),
                       " is a benchmark form: launch it with kernels/kv_copy_forms.h"));
    }
    // The form for the device Upload probed (DevicePlan::arch), not asked again per launch.
    return CudaStatus(
        internal::KvCopySegmentsLaunch(plan.header, tile_begin, tile_end, num_ctas, threads_per_cta,
                                       SegmentFormOn(plan.segment_form, plan.arch), stream),
        "kv_copy launch");
  }
  return CudaStatus(
      internal::KvCopyLaunch(plan.header, tile_begin, tile_end, num_ctas, threads_per_cta,
                             plan.access_bytes, plan.piece_bytes, stream),
      "kv_copy launch");
}

}  // namespace kvrail::kernels

#include "daemon/engine/cuda/cuda_gpu_ops.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/cuda/context_sync.h"
#include "base/cuda/cuda_util.h"
#include "base/status.h"
#include "kernels/device_abi.h"
#include "kernels/kv_copy.h"
#include "kernels/kv_digest.h"

namespace kvrail::engine::cuda_detail {

namespace {

using WaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WriteValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WriteValue64Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

// cuStreamWaitValue32 / cuStreamWriteValue32 through the runtime's driver entry point (nothing
// links libcuda); nullptr when the driver offers none.
WaitValue32Fn StreamWaitValue32() {
  static const auto fn =
      reinterpret_cast<WaitValue32Fn>(cuda::DriverEntryPoint("cuStreamWaitValue32"));
  return fn;
}

WriteValue32Fn StreamWriteValue32() {
  static const auto fn =
      reinterpret_cast<WriteValue32Fn>(cuda::DriverEntryPoint("cuStreamWriteValue32"));
  return fn;
}

WriteValue64Fn StreamWriteValue64() {
  static const auto fn =
      reinterpret_cast<WriteValue64Fn>(cuda::DriverEntryPoint("cuStreamWriteValue64"));
  return fn;
}

class CudaStream final : public GpuStream {
 public:
  explicit CudaStream(cuda::Stream s) : s_(std::move(s)) {}
  cudaStream_t get() const { return s_.get(); }

 private:
  cuda::Stream s_;
};

class CudaEvent final : public GpuEvent {
 public:
  explicit CudaEvent(cuda::Event e) : e_(std::move(e)) {}
  cudaEvent_t get() const { return e_.get(); }

 private:
  cuda::Event e_;
};

class CudaPlan final : public GpuPlan {
 public:
  explicit CudaPlan(kernels::DevicePlanBuffer b) : b_(std::move(b)) {}
  const kernels::DevicePlan& plan() const { return b_.plan(); }
  kernels::DevicePlanBuffer& buffer() { return b_; }

 private:
  kernels::DevicePlanBuffer b_;
};

class CudaDigests final : public GpuDigests {
 public:
  explicit CudaDigests(kernels::TileDigestBuffer b) : b_(std::move(b)) {}
  uint64_t host_source(uint32_t tile) const override { return b_.host_source(tile); }
  uint64_t host_destination(uint32_t tile) const override { return b_.host_destination(tile); }
  kernels::TileDigestBuffer& buffer() { return b_; }

 private:
  kernels::TileDigestBuffer b_;
};

class CudaHostMemory final : public HostMemory {
 public:
  CudaHostMemory(void* host, uint64_t device) : host_(host), device_(device) {}
  ~CudaHostMemory() override {
    cuda::ContextSyncScope sync("cudaFreeHost(engine host memory)");
    cudaFreeHost(host_);
  }
  void* host() const override { return host_; }
  uint64_t device() const override { return device_; }

 private:
  void* host_;
  uint64_t device_;
};

cudaStream_t S(GpuStream& s) { return static_cast<CudaStream&>(s).get(); }
cudaEvent_t E(GpuEvent& e) { return static_cast<CudaEvent&>(e).get(); }

kernels::DigestKernelMode KernelMode(DigestPass pass) {
  switch (pass) {
    case DigestPass::kCopyHashSource:
      return kernels::DigestKernelMode::kCopyHashSource;
    case DigestPass::kHashSource:
      return kernels::DigestKernelMode::kHashSource;
    case DigestPass::kHashDestination:
      break;
  }
  return kernels::DigestKernelMode::kHashDestination;
}

class CudaGpuOps final : public GpuOps {
 public:
  CudaGpuOps(int device, cuda::Stream main) : device_(device), main_(std::move(main)) {}

  int device() const override { return device_; }
  absl::Status EnablePeerAccess(int peer) override { return cuda::EnablePeerAccess(device_, peer); }
  GpuStream& main_stream() override { return main_; }

  absl::StatusOr<std::unique_ptr<GpuStream>> CreateStream() override {
    KVRAIL_ASSIGN_OR_RETURN(cuda::Stream s, cuda::Stream::Create(device_));
    return std::make_unique<CudaStream>(std::move(s));
  }
  absl::StatusOr<std::unique_ptr<GpuEvent>> CreateEvent() override {
    KVRAIL_ASSIGN_OR_RETURN(cuda::Event e, cuda::Event::Create());
    return std::make_unique<CudaEvent>(std::move(e));
  }
  absl::Status Record(GpuEvent& event, GpuStream& stream) override {
    return cuda::CudaStatus(cudaEventRecord(E(event), S(stream)), "cudaEventRecord");
  }
  bool Passed(GpuEvent& event) override {
    const cudaError_t e = cudaEventQuery(E(event));
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) (void)cudaGetLastError();
    return true;
  }
  absl::Status Wait(GpuEvent& event, bool* sticky) override {
    const cudaError_t e = cudaEventSynchronize(E(event));
    *sticky = cuda::IsStickyError(e);
    return cuda::CudaStatus(e, "transfer batch");
  }
  absl::Status Synchronize(GpuStream& stream) override {
    return cuda::CudaStatus(cudaStreamSynchronize(S(stream)), "cudaStreamSynchronize");
  }
  double Seconds(GpuEvent& from, GpuEvent& to) override {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, E(from), E(to)) != cudaSuccess) (void)cudaGetLastError();
    return ms / 1e3;
  }
  absl::Status StreamWaitEvent(GpuStream& stream, GpuEvent& event) override {
    return cuda::CudaStatus(cudaStreamWaitEvent(S(stream), E(event), 0), "cudaStreamWaitEvent");
  }

  bool WordOpsAvailable() const override {
    return StreamWaitValue32() != nullptr && StreamWriteValue32() != nullptr;
  }
  absl::Status WaitWord(GpuStream& stream, uint64_t device_word, uint32_t value) override {
    if (StreamWaitValue32() == nullptr) {
      return absl::FailedPreconditionError("the driver has no cuStreamWaitValue32");
    }
    const CUresult r = StreamWaitValue32()(reinterpret_cast<CUstream>(S(stream)), device_word,
                                           value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) {
      return absl::InternalError(absl::StrCat("cuStreamWaitValue32 failed: CUresult ", r));
    }
    return absl::OkStatus();
  }
  absl::Status WriteWord(GpuStream& stream, uint64_t device_word, uint32_t value) override {
    if (StreamWriteValue32() == nullptr) {
      return absl::FailedPreconditionError("the driver has no cuStreamWriteValue32");
    }
    const CUresult r = StreamWriteValue32()(reinterpret_cast<CUstream>(S(stream)), device_word,
                                            value, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (r != CUDA_SUCCESS) {
      return absl::InternalError(absl::StrCat("cuStreamWriteValue32 failed: CUresult ", r));
    }
    return absl::OkStatus();
  }

  absl::Status WriteDoneWord(GpuStream& stream, uint64_t device_word, uint64_t value) override {
    if (stream_write64_ && StreamWriteValue64() != nullptr) {
      // CU_STREAM_WRITE_VALUE_DEFAULT: a memory barrier before the write (as
      // __threadfence_system, scoped to the stream), so every byte the stream's kernels and
      // copies wrote is visible before the word.
      const CUresult r = StreamWriteValue64()(reinterpret_cast<CUstream>(S(stream)), device_word,
                                              value, CU_STREAM_WRITE_VALUE_DEFAULT);
      if (r == CUDA_SUCCESS) return absl::OkStatus();
      // Not offered on this device (no 64-bit stream memory operations): the kernel from now on.
      if (r != CUDA_ERROR_NOT_SUPPORTED && r != CUDA_ERROR_INVALID_VALUE) {
        return absl::InternalError(absl::StrCat("cuStreamWriteValue64 failed: CUresult ", r));
      }
      stream_write64_ = false;
    }
    return kernels::LaunchDoneWordStore(device_word, value, S(stream));
  }

  absl::StatusOr<std::unique_ptr<GpuPlan>> UploadPlan(const planner::Plan& plan, const uint8_t* src,
                                                      uint8_t* dst, GpuStream& stream,
                                                      void* staging,
                                                      size_t staging_bytes) override {
    KVRAIL_ASSIGN_OR_RETURN(kernels::DevicePlanBuffer buffer,
                            kernels::DevicePlanBuffer::Upload(
                                plan.header(), plan.src_blocks().data(), plan.dst_blocks().data(),
                                reinterpret_cast<uint64_t>(src), reinterpret_cast<uint64_t>(dst),
                                S(stream), staging, staging_bytes));
    return std::make_unique<CudaPlan>(std::move(buffer));
  }
  absl::Status UploadBlockIds(GpuPlan& resident, const planner::Plan& plan, void* staging,
                              size_t staging_bytes) override {
    return static_cast<CudaPlan&>(resident).buffer().UploadBlockIds(
        plan.src_blocks().data(), plan.dst_blocks().data(), staging, staging_bytes);
  }
  absl::Status DisarmPlan(GpuPlan& plan, GpuStream& stream) override {
    auto* header = reinterpret_cast<uint8_t*>(
        const_cast<kernels::PlanHeader*>(static_cast<CudaPlan&>(plan).plan().header));
    return cuda::CudaStatus(cudaMemsetAsync(header + offsetof(kernels::PlanHeader, num_tiles), 0,
                                            sizeof(uint32_t), S(stream)),
                            "cudaMemsetAsync(gate abort: num_tiles)");
  }
  absl::Status LaunchCopy(GpuPlan& plan, uint32_t begin, uint32_t end, int ctas,
                          GpuStream& stream) override {
    return kernels::LaunchKvCopy(static_cast<CudaPlan&>(plan).plan(), begin, end, ctas, S(stream),
                                 kThreadsPerCta);
  }

  absl::StatusOr<std::unique_ptr<GpuDigests>> CreateDigests(uint32_t num_tiles,
                                                            GpuStream& stream) override {
    KVRAIL_ASSIGN_OR_RETURN(kernels::TileDigestBuffer buffer,
                            kernels::TileDigestBuffer::Create(num_tiles, S(stream)));
    return std::make_unique<CudaDigests>(std::move(buffer));
  }
  absl::Status LaunchDigest(GpuPlan& plan, uint32_t begin, uint32_t end, DigestPass pass,
                            GpuDigests& digests, int ctas, GpuStream& stream) override {
    kernels::TileDigestBuffer& d = static_cast<CudaDigests&>(digests).buffer();
    return kernels::LaunchKvDigest(
        static_cast<CudaPlan&>(plan).plan(), begin, end, KernelMode(pass),
        pass == DigestPass::kHashDestination ? d.destination() : d.source(), ctas, S(stream),
        kThreadsPerCta);
  }
  absl::Status CopyBackDigests(GpuDigests& digests, uint32_t begin, uint32_t end) override {
    return static_cast<CudaDigests&>(digests).buffer().CopyBack(begin, end);
  }

  absl::Status CopyRuns(const std::vector<scheduler::CopyRun>& runs, const uint8_t* src,
                        uint8_t* dst, GpuStream& stream) override {
    dsts_.resize(runs.size());
    srcs_.resize(runs.size());
    sizes_.resize(runs.size());
    for (size_t i = 0; i < runs.size(); ++i) {
      dsts_[i] = dst + runs[i].dst;
      srcs_[i] = src + runs[i].src;
      sizes_[i] = runs[i].bytes;
    }
    return cuda::BatchCopy(dsts_.data(), srcs_.data(), sizes_.data(), runs.size(),
                           cudaMemcpyFlagPreferOverlapWithCompute, S(stream), "transfer batch");
  }

  absl::StatusOr<std::unique_ptr<HostMemory>> AllocHost(size_t bytes, bool mapped) override {
    void* host = nullptr;
    cudaError_t e;
    {
      cuda::ContextSyncScope sync("cudaHostAlloc(engine host memory)");
      e = cudaHostAlloc(
          &host, bytes,
          mapped ? cudaHostAllocMapped | cudaHostAllocPortable : cudaHostAllocDefault);
    }
    KVRAIL_RETURN_IF_ERROR(cuda::CudaStatus(e, "cudaHostAlloc(engine host memory)"));
    std::memset(host, 0, bytes);
    void* device = nullptr;
    if (mapped) {
      const cudaError_t d = cudaHostGetDevicePointer(&device, host, 0);
      if (d != cudaSuccess) {
        cudaFreeHost(host);
        return cuda::CudaStatus(d, "cudaHostGetDevicePointer(engine host memory)");
      }
    }
    return std::make_unique<CudaHostMemory>(host, reinterpret_cast<uint64_t>(device));
  }

 private:
  const int device_;
  CudaStream main_;
  bool stream_write64_ = true;  // until the device refuses cuStreamWriteValue64
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuOps>> CreateCudaGpuOps(int device) {
  KVRAIL_ASSIGN_OR_RETURN(cuda::Stream main, cuda::Stream::Create(device));
  return std::make_unique<CudaGpuOps>(device, std::move(main));
}

}  // namespace kvrail::engine::cuda_detail

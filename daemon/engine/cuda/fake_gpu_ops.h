// A GPU for tests, on the CPU: GpuOps whose streams are queues of operations that run in order
// when the dispatcher looks (Passed), waits (Wait, Synchronize) or the test says (Run). Kernels
// and copy-engine batches really copy (kernels from the plan's uploaded image: header, ids and
// layer tables as the stream left them, so an upload that came late or wrote the wrong ids shows
// in the bytes), a disarmed plan copies nothing, word waits block their stream until the host word
// has reached the value, and chosen calls fail (FailNext), and a kernel may fault as it runs
// (FaultNextKernel: as on a GPU, the fault is sticky and nothing after it runs on any stream).
// Tests see what is still queued to write (pending_writes) and every done word stored (done_words).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/engine/cuda/gpu_ops.h"

namespace kvrail::engine::cuda_detail {

// Thread-safe (one lock over the fake GPU's state; the host words are read and stored
// atomically, so the gate watchdog may store them from its own thread).
class FakeGpuOps final : public GpuOps {
 public:
  explicit FakeGpuOps(int device = 0);
  ~FakeGpuOps() override;

  // The next call of `op` ("UploadPlan", "UploadBlockIds", "LaunchCopy", "LaunchDigest",
  // "CopyRuns", "Record", "CopyBackDigests", "WaitWord", "WriteWord", "WriteDoneWord",
  // "DisarmPlan", "CreateStream", "AllocHost", "Wait") fails with `status`; `sticky` for "Wait":
  // the error leaves the GPU unusable.
  void FailNext(const std::string& op, absl::Status status, bool sticky = false);
  // Off: the GPU runs only when waited for (Wait, Synchronize) or told to (Run); Passed then
  // says what has run so far.
  void set_auto_run(bool on);
  // Runs every stream as far as its operations can go.
  void Run();
  // The next kernel to run faults instead of copying: it and every operation after it on any
  // stream never run; waits return the fault, sticky (the context is gone).
  void FaultNextKernel();
  // A done word the fake GPU stored (WriteDoneWord), with the operations that write destination
  // bytes still queued on any stream and the kernels run when it was stored.
  struct DoneWordStored {
    uint64_t device_word = 0;
    uint64_t value = 0;
    int writes_pending = 0;
    int kernels_run = 0;
  };
  std::vector<DoneWordStored> done_words() const;
  // Queued operations that will still write destination bytes.
  int pending_writes() const;
  // Operations queued and not run, on all streams.
  int pending_ops() const;
  int streams_made() const;
  int kernels_run() const;
  // Plan uploads: bytes sent to the GPU (whole images, id sections), images made, id sections
  // rewritten, and id sections rewritten while a kernel that reads the image was still queued.
  uint64_t upload_bytes() const;
  int plans_made() const;
  int id_uploads() const;
  int overwrites_while_read() const;

  int device() const override { return device_; }
  absl::Status EnablePeerAccess(int peer) override { return absl::OkStatus(); }
  GpuStream& main_stream() override { return *main_; }
  absl::StatusOr<std::unique_ptr<GpuStream>> CreateStream() override;
  absl::StatusOr<std::unique_ptr<GpuEvent>> CreateEvent() override;
  absl::Status Record(GpuEvent& event, GpuStream& stream) override;
  bool Passed(GpuEvent& event) override;
  absl::Status Wait(GpuEvent& event, bool* sticky) override;
  absl::Status Synchronize(GpuStream& stream) override;
  double Seconds(GpuEvent& from, GpuEvent& to) override;
  absl::Status StreamWaitEvent(GpuStream& stream, GpuEvent& event) override;
  bool WordOpsAvailable() const override { return true; }
  absl::Status WaitWord(GpuStream& stream, uint64_t device_word, uint32_t value) override;
  absl::Status WriteWord(GpuStream& stream, uint64_t device_word, uint32_t value) override;
  absl::Status WriteDoneWord(GpuStream& stream, uint64_t device_word, uint64_t value) override;
  absl::StatusOr<std::unique_ptr<GpuPlan>> UploadPlan(const planner::Plan& plan, const uint8_t* src,
                                                      uint8_t* dst, GpuStream& stream,
                                                      void* staging, size_t staging_bytes) override;
  absl::Status UploadBlockIds(GpuPlan& resident, const planner::Plan& plan, void* staging,
                              size_t staging_bytes) override;
  absl::Status DisarmPlan(GpuPlan& plan, GpuStream& stream) override;
  absl::Status LaunchCopy(GpuPlan& plan, uint32_t begin, uint32_t end, int ctas,
                          GpuStream& stream) override;
  absl::StatusOr<std::unique_ptr<GpuDigests>> CreateDigests(uint32_t num_tiles,
                                                            GpuStream& stream) override;
  absl::Status LaunchDigest(GpuPlan& plan, uint32_t begin, uint32_t end, DigestPass pass,
                            GpuDigests& digests, int ctas, GpuStream& stream) override;
  absl::Status CopyBackDigests(GpuDigests& digests, uint32_t begin, uint32_t end) override;
  absl::Status CopyRuns(const std::vector<scheduler::CopyRun>& runs, const uint8_t* src,
                        uint8_t* dst, GpuStream& stream) override;
  absl::StatusOr<std::unique_ptr<HostMemory>> AllocHost(size_t bytes, bool mapped) override;

 private:
  struct Op {
    std::function<bool()> run;  // false: blocked (try again later)
    bool writes = false;
  };
  struct Stream;
  absl::Status Injected(const std::string& op, bool* sticky = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Push(GpuStream& stream, Op op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int PendingWritesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int device_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::pair<absl::Status, bool>> fail_ ABSL_GUARDED_BY(mu_);
  bool auto_run_ ABSL_GUARDED_BY(mu_) = true;
  std::vector<std::deque<Op>> queues_ ABSL_GUARDED_BY(mu_);  // per stream, by its index
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;  // fake GPU time: one tick per operation run
  int kernels_run_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t upload_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int plans_made_ ABSL_GUARDED_BY(mu_) = 0;
  int id_uploads_ ABSL_GUARDED_BY(mu_) = 0;
  int overwrites_while_read_ ABSL_GUARDED_BY(mu_) = 0;
  bool fault_next_kernel_ ABSL_GUARDED_BY(mu_) = false;
  bool faulted_ ABSL_GUARDED_BY(mu_) = false;  // a kernel faulted: nothing runs any more
  std::vector<DoneWordStored> done_words_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<GpuStream> main_;
};

}  // namespace kvrail::engine::cuda_detail

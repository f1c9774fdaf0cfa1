// The CUDA engine's GPU-side readiness wait, its pure decisions: whether a layer-wise
// job gated by producer flag words (spec.ready_flags) waits on the GPU (cuStreamWaitValue32 GEQ
// on the producer's word, on a stream of the job's own, then the copy kernel) or through the
// readiness poller (CPU wake-up, then launch); how a job that ends with waits still pending gets
// them released so no stream of the daemon stays blocked; and what its gated tiles report.
//
// The release protocol (the engine executes it, daemon/engine/cuda/gpu_gate.cc, with no CUDA
// call): the job's abort word (daemon-owned, mapped host memory) is raised FIRST; a stream of
// the job's own, armed at set-up behind cuStreamWaitValue32 on that word, then zeroes num_tiles
// in the job's device plan header and writes a done word (the copy kernels return at once on
// num_tiles 0); once the done word is seen, the producer's word is raised to the awaited value
// by the daemon (ReleaseStore: only when it has not reached it), which lets the pending wait pass
// and the disarmed kernel run empty. Raising a producer's word is visible to anyone else watching
// it, so it is done at once only when the producer is gone (its session ended: every transfer
// waiting on its words ends too); a live producer (the job was cancelled or missed its deadline)
// gets `grace` to write the word itself first.
//
// No CUDA, no threads, no clocks of its own. Thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace kvrail::scheduler {

// What the engine knows when a gated layer-wise job first reaches it.
struct GateInputs {
  bool enabled = false;       // CudaEngineOptions::stream_wait
  bool ready = true;          // the engine's abort page and cuStreamWriteValue32 exist
  bool flags_mapped = false;  // the flag words have a device address on the job's GPU
  bool kernel_mode = false;   // the plan runs on the copy kernel (copy engines cannot honour
                              // an abort word: a released wait would let them copy)
  bool digest = false;        // spec.digest: the digest kernels have no abort word either
  int waiting_jobs = 0;       // gated jobs of this GPU already holding a stream
  int max_jobs = 0;           // CudaEngineOptions::stream_wait_jobs (or fewer: queue_limit)
  std::string queue_limit;    // PlanGateQueues's reason when the hardware queues set max_jobs
};

struct GateChoice {
  bool stream_wait = false;
  std::string reason;  // why (for the engine's note / log), either way
};

GateChoice ChooseGate(const GateInputs& in);

// Why a job with pending waits ended.
enum class GateEnd {
  kProducerGone,  // the session owning the flag words ended (nobody will write them)
  kOther,         // cancelled, deadline, a failure elsewhere: the producer may still write
};

// Whether the daemon raises the producer's word now (`since_end` after the job ended).
bool ReleaseNow(GateEnd end, absl::Duration since_end, absl::Duration grace);

// What the engine's gate watchdog (a thread of its own, no blocking CUDA call) knows about one
// gated job at a tick. A pending GPU wait blocks every context-synchronizing CUDA call of
// kvraild (base/cuda/context_sync.h: cudaHostRegister/Unregister, cudaIpcOpen/CloseMemHandle,
// cuMemMap/Unmap, cudaFreeHost, cudaDeviceEnablePeerAccess, a module load) until the producer
// writes its word; a producer that itself waits for kvraild (a region registration, a reply)
// would never write it. The watchdog bounds that: it releases the job's waits (no byte of the
// unready layers moves; they fail) when such a call has been blocked for `bound`, or when the
// dispatcher has not come round for `bound` (stuck in a call that was not marked).
struct GateWatchInputs {
  bool ended = false;          // Job::ended returned a status
  bool producer_gone = false;  // ... and nobody may write the words any more
  absl::Duration since_end;    // since the watchdog first saw it ended
  absl::Duration grace;        // a live producer's time to write its words (ReleaseNow)
  bool waits_pending = false;  // a launched layer's word has not reached the value yet
  // The oldest context-synchronizing call open now (nullopt: none) and how long it has been.
  std::optional<absl::Duration> sync_blocked_for;
  std::string sync_what;
  absl::Duration dispatcher_silent_for;  // since the dispatcher's last loop turn
  absl::Duration bound;                  // CudaEngineOptions::stream_wait_sync_bound
};

enum class GateReleaseCause { kNone, kEnded, kContextSync, kDispatcherStuck };

struct GateReleaseDecision {
  GateReleaseCause cause = GateReleaseCause::kNone;
  // For kContextSync / kDispatcherStuck: the status the job's unready layers fail with
  // (UNAVAILABLE, naming the call and how long it waited). kEnded uses the job's own status.
  absl::Status why;
  bool release() const { return cause != GateReleaseCause::kNone; }
};

// The watchdog's decision for one job. An ended job follows ReleaseNow; a live one is released
// only while one of its waits is pending and the context-synchronizing call (or the silent
// dispatcher) has waited at least `bound` (zero `bound`: never for those causes).
GateReleaseDecision DecideGateRelease(const GateWatchInputs& in);

// The value the daemon stores into a producer's word `word` to let a wait for `value` (GEQ,
// wrapping epoch order) pass; nullopt when the word has reached it already (storing would move
// a later epoch back).
std::optional<uint32_t> ReleaseStore(uint32_t word, uint32_t value);

// The status a gated tile of layer `layer` reports once its stream has passed: OK when its copy
// ran (`aborted` false), else `ended` (the job's end status, or UNAVAILABLE when none was given)
// prefixed with the readiness that was never met, naming the field ("spec.ready_flags[3]: ...").
absl::Status GatedTileStatus(bool aborted, const std::string& field, uint32_t layer, uint32_t value,
                             const absl::Status& ended);

// Hardware work queues. CUDA maps a process's streams onto a few hardware queues per GPU
// (CUDA_DEVICE_MAX_CONNECTIONS, read at context creation: 1-32, default 8; under MPS the
// client's share of the server's pool), and work queued behind a pending cuStreamWaitValue32 in
// the SAME queue waits with it. Measured on one H200 (docs/benchmarks.md): with 1 queue the
// one-process byte-for-byte case hangs without MPS; under MPS it hung at the default and passed
// at 32. A gated job parks kStreamsPerGatedJob streams in waits for its
// life (its copy stream behind the producer's words, its abort stream behind the abort word), so
// the engine makes those streams once, at start, in a pool of one pair per admitted job beside its
// kOtherEngineStreams (the dispatcher's stream, the copy-engine part's): a new job reuses a pair
// instead of creating streams, which the driver would deal onto queues already holding others.
constexpr int kDefaultHardwareQueues = 8;
constexpr int kMaxHardwareQueues = 32;
constexpr int kOtherEngineStreams = 2;
constexpr int kStreamsPerGatedJob = 2;

// CUDA_DEVICE_MAX_CONNECTIONS's value as the engine counts it: unset, empty, not a whole number
// or below 1 -> the driver's default (8); above 32 -> 32 (the driver's cap).
int HardwareQueuesFromEnv(const char* value);

struct GateQueuePlan {
  int max_jobs = 0;    // gated jobs one GPU may hold at once (each with its pair of streams)
  std::string reason;  // set when the queues, not cuda_stream_wait_jobs, are the limit
};

// How many gated jobs one GPU holds so that every parked wait has a queue of its own, apart from
// the engine's other streams: min(requested_jobs, (hardware_queues - kOtherEngineStreams) /
// kStreamsPerGatedJob), at least 0. 0 with the reason when the queues leave none (the gated
// layers then go through the readiness poller).
GateQueuePlan PlanGateQueues(int requested_jobs, int hardware_queues);

// The gated jobs of one GPU, each holding a slot (in the CUDA engine: a pair of parked streams,
// PlanGateQueues) until its last gated launch passed. `queue_limit` is PlanGateQueues's reason
// when the hardware queues set `max_jobs`; a refusal at the limit names it. Thread-compatible
// (the dispatcher's).
class GateSlots {
 public:
  explicit GateSlots(int max_jobs, std::string queue_limit = std::string())
      : max_jobs_(max_jobs), queue_limit_(std::move(queue_limit)) {}
  // A job's first gated layer: decides, and takes a slot when the answer is the stream wait.
  // A job that holds a slot keeps it (same answer, no second slot).
  GateChoice Admit(const void* job, GateInputs in);
  bool Holds(const void* job) const { return held_.contains(job); }
  // The job's stream drained and it gets no more layers: its slot is free again.
  void Release(const void* job) { held_.erase(job); }
  int held() const { return static_cast<int>(held_.size()); }

 private:
  const int max_jobs_;
  const std::string queue_limit_;
  absl::flat_hash_set<const void*> held_;
};

}  // namespace kvrail::scheduler

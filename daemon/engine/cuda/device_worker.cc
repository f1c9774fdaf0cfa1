#include "daemon/engine/cuda/device_worker.h"

#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>

#include <cstdlib>
#include <utility>

#include "base/cuda/context_sync.h"
#include "base/cuda/cuda_util.h"
#include "daemon/engine/cuda/warm_up.h"
#include "daemon/scheduler/cuda_batch_policy.h"
#include "daemon/scheduler/stream_gate.h"

namespace kvrail::engine::cuda_detail {

namespace {

// The GPU's SM count (0 when the runtime cannot say: then no critical raise).
int SmCount(int device) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return sms;
}

GateOptions GateOptionsFor(const CudaEngineOptions& options) {
  // How many gated jobs this GPU holds: stream_wait_jobs, bounded by the hardware queues
  // CUDA_DEVICE_MAX_CONNECTIONS gives (scheduler::PlanGateQueues).
  const scheduler::GateQueuePlan queues = scheduler::PlanGateQueues(
      options.stream_wait_jobs,
      scheduler::HardwareQueuesFromEnv(std::getenv("CUDA_DEVICE_MAX_CONNECTIONS")));
  GateOptions g;
  g.enabled = options.stream_wait;
  g.max_jobs = queues.max_jobs;
  g.queue_limit = queues.reason;
  g.sync_bound_ms = options.stream_wait_sync_bound_ms;
  g.blocked_sync = [](absl::Time now) -> std::optional<std::pair<absl::Duration, std::string>> {
    const std::optional<cuda::OpenContextSync> sync = cuda::OldestContextSync();
    if (!sync.has_value()) return std::nullopt;
    return std::make_pair(now - sync->since, std::string(sync->what));
  };
  return g;
}

}  // namespace

DeviceWorker::DeviceWorker(const CudaEngineOptions& options, std::unique_ptr<GpuOps> ops)
    : options_(options),
      ops_(std::move(ops)),
      critical_ctas_(scheduler::ResolveCriticalCtas(options.critical_ctas, SmCount(ops_->device()),
                                                    options.max_ctas)),
      queues_(options.limits, options.batch_bytes, Clock::Real()),
      gate_(ops_.get(), Clock::Real(), GateOptionsFor(options)),
      dispatcher_(ops_.get(), Clock::Real(), options, critical_ctas_, &queues_, &gate_, &stats_) {
  thread_ = std::thread([this] { Serve(); });
  if (options_.stream_wait) gate_.Start();
}

DeviceWorker::~DeviceWorker() {
  queues_.Stop();
  thread_.join();
}

void DeviceWorker::Serve() {
  const int device = ops_->device();
  // Binds this thread to its GPU for good: every event and launch below goes there. Code that
  // visits another GPU from this thread does so under a cuda::ScopedDevice, which gives the
  // thread back its GPU.
  absl::Status bound = cuda::SetDevice(device);
  if (bound.ok() && options_.stream_wait) {
    // The 20 us looks at gated words (kGateWordPoll) must not stretch to the default 50 us
    // timer slack (as the readiness poller, daemon/readiness).
    ::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    // Made before serving: the streams in their order (the copy-engine part's first, then each
    // parked wait on a hardware queue of its own), and the abort page. Without either, no
    // stream wait.
    absl::Status made = dispatcher_.MakeCopyStream();
    if (made.ok()) made = gate_.Make();
    if (!made.ok()) {
      spdlog::warn("cuda:{} no GPU stream wait (gated layers use the readiness poller): {}", device,
                   made.ToString());
    } else if (const GateOptions g = GateOptionsFor(options_); !g.queue_limit.empty()) {
      spdlog::warn("cuda:{} GPU stream wait for at most {} jobs at once: {}", device, g.max_jobs,
                   g.queue_limit);
    }
  }
  if (bound.ok() && options_.staged_plan_upload) {
    // Made before serving (cudaHostAlloc may synchronize the context). Without it plans upload
    // unstaged: only speed is lost.
    if (absl::Status made = dispatcher_.stager().Make(); !made.ok()) {
      spdlog::warn("cuda:{} plan uploads unstaged: {}", device, made.ToString());
    }
  }
  std::string warm_text;
  if (bound.ok() && options_.warm_up) {
    // A failed warm-up costs only speed: the first transfer pays what it would have.
    absl::StatusOr<std::string> warm = WarmUp(device, options_, dispatcher_.tuners());
    if (warm.ok()) {
      warm_text = *std::move(warm);
    } else {
      spdlog::warn("cuda:{} warm-up failed: {}", device, warm.status().ToString());
    }
  }
  if (!bound.ok()) stats_.Broke(bound);
  stats_.WarmDone(std::move(warm_text));
  dispatcher_.Serve();
}

bool DeviceWorker::AdmitGated(const std::shared_ptr<Job>& job) {
  if (!options_.stream_wait) {
    // Before ready_gate: that would pin the flag region for the GPU, for nothing.
    job->OnEngineNote(scheduler::ChooseGate(scheduler::GateInputs{}).reason);
    return false;
  }
  const DeviceSides* sides = job->device_sides();
  std::optional<Job::ReadyGate> gate =
      sides != nullptr ? sides->ready_gate(ops_->device()) : std::nullopt;
  if (!gate.has_value()) return false;
  scheduler::GateInputs in;
  in.flags_mapped = gate->device_words != 0 && gate->host_words != nullptr &&
                    gate->count >= job->plan().num_layers() && ops_->WordOpsAvailable();
  in.kernel_mode = scheduler::ChoosePlanMode(dispatcher_.ModeInputsFor(*job, false)).mode ==
                   scheduler::Mode::kKernel;
  in.digest = job->wants_digest();
  return gate_.Admit(job, *std::move(gate), in);
}

std::string DeviceWorker::Describe() const {
  std::string text = stats_.Describe(ops_->device(), options_.max_ctas, critical_ctas_);
  if (!stats_.broken().ok()) return text;
  return text + gate_.Text();
}

}  // namespace kvrail::engine::cuda_detail

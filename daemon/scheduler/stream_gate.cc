#include "daemon/scheduler/stream_gate.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvrail::scheduler {

GateChoice ChooseGate(const GateInputs& in) {
  if (!in.enabled) return {false, "readiness poller (cuda_stream_wait off)"};
  if (!in.ready) {
    return {false,
            "readiness poller (cuda_stream_wait on, but this GPU's abort page or the "
            "driver's stream write was not available at start: see the log)"};
  }
  if (!in.flags_mapped) {
    return {false, "readiness poller (the ready flags have no device address on this GPU)"};
  }
  if (!in.kernel_mode) {
    return {false,
            "readiness poller (the plan runs on the copy engines, which cannot skip an "
            "aborted layer)"};
  }
  if (in.digest) {
    return {false,
            "readiness poller (spec.digest: the digest kernels cannot skip an aborted "
            "layer)"};
  }
  if (in.waiting_jobs >= in.max_jobs) {
    // The limit named: the hardware queues' reason when they set it, else the setting.
    return {
        false,
        absl::StrCat("readiness poller (", in.waiting_jobs, " jobs already wait on this GPU",
                     in.queue_limit.empty() ? absl::StrCat(", cuda_stream_wait_jobs ", in.max_jobs)
                                            : absl::StrCat(": ", in.queue_limit),
                     ")")};
  }
  return {true, "GPU stream wait on the ready flags (cuStreamWaitValue32)"};
}

bool ReleaseNow(GateEnd end, absl::Duration since_end, absl::Duration grace) {
  return end == GateEnd::kProducerGone || since_end >= grace;
}

GateReleaseDecision DecideGateRelease(const GateWatchInputs& in) {
  GateReleaseDecision d;
  if (in.ended) {
    if (ReleaseNow(in.producer_gone ? GateEnd::kProducerGone : GateEnd::kOther, in.since_end,
                   in.grace)) {
      d.cause = GateReleaseCause::kEnded;
    }
    return d;
  }
  if (!in.waits_pending || in.bound <= absl::ZeroDuration()) return d;
  if (in.sync_blocked_for.has_value() && *in.sync_blocked_for >= in.bound) {
    d.cause = GateReleaseCause::kContextSync;
    d.why = absl::UnavailableError(absl::StrCat(
        "kvraild released its GPU wait: a context-synchronizing CUDA call (", in.sync_what,
        ") had waited ", absl::ToInt64Milliseconds(*in.sync_blocked_for),
        " ms behind it (the engine's bound: ", absl::ToInt64Milliseconds(in.bound), " ms)"));
    return d;
  }
  if (in.dispatcher_silent_for >= in.bound) {
    d.cause = GateReleaseCause::kDispatcherStuck;
    d.why = absl::UnavailableError(absl::StrCat(
        "kvraild released its GPU wait: the CUDA engine's dispatcher had been blocked for ",
        absl::ToInt64Milliseconds(in.dispatcher_silent_for),
        " ms (a CUDA call waiting behind the wait; the engine's bound: ",
        absl::ToInt64Milliseconds(in.bound), " ms)"));
  }
  return d;
}

std::optional<uint32_t> ReleaseStore(uint32_t word, uint32_t value) {
  if (static_cast<int32_t>(word - value) >= 0) return std::nullopt;
  return value;
}

absl::Status GatedTileStatus(bool aborted, const std::string& field, uint32_t layer, uint32_t value,
                             const absl::Status& ended) {
  if (!aborted) return absl::OkStatus();
  const absl::Status why = ended.ok() ? absl::UnavailableError("the transfer ended") : ended;
  return absl::Status(
      why.code(),
      absl::StrCat(field, "[", layer,
                   "]: the layer's copy waited on the GPU for "
                   "the flag to reach ",
                   value, " and was cancelled there (no byte written): ", why.message()));
}

int HardwareQueuesFromEnv(const char* value) {
  int64_t n = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &n) || n < 1) return kDefaultHardwareQueues;
  return static_cast<int>(std::min<int64_t>(n, kMaxHardwareQueues));
}

GateQueuePlan PlanGateQueues(int requested_jobs, int hardware_queues) {
  GateQueuePlan plan;
  const int fit = std::max(0, (hardware_queues - kOtherEngineStreams) / kStreamsPerGatedJob);
  plan.max_jobs = std::max(0, std::min(requested_jobs, fit));
  if (fit < requested_jobs) {
    plan.reason = absl::StrCat(
        hardware_queues, " hardware queues (CUDA_DEVICE_MAX_CONNECTIONS) leave room for ", fit,
        " gated jobs of ", kStreamsPerGatedJob, " parked streams beside the engine's ",
        kOtherEngineStreams, " (cuda_stream_wait_jobs ", requested_jobs, ")");
  }
  return plan;
}

GateChoice GateSlots::Admit(const void* job, GateInputs in) {
  if (held_.contains(job))
    return {true, "GPU stream wait on the ready flags (cuStreamWaitValue32)"};
  in.waiting_jobs = held();
  in.max_jobs = max_jobs_;
  in.queue_limit = queue_limit_;
  GateChoice c = ChooseGate(in);
  if (c.stream_wait) held_.insert(job);
  return c;
}

}  // namespace kvrail::scheduler

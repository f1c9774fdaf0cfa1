// The CUDA engine's options (CreateCudaEngine, cuda_engine.h), apart so that the engine's parts
// read them without including the engine's factory.
#pragma once

#include <cstdint>
#include <vector>

#include "base/predictive_wake.h"
#include "daemon/engine/engine.h"  // PriorityLimits

namespace kvrail::engine {

struct CudaEngineOptions {
  // SM budget: the most CTAs (of 512 threads) one launch may use. 0: copy engines only.
  int max_ctas = 32;
  // > 0: always launch this many CTAs (capped by max_ctas); 0: find the knee at run time.
  int fixed_ctas = 0;
  // Plans whose coalesced contiguous runs average at least this many bytes go to the copy
  // engines (cudaMemcpyBatchAsync) instead of the kernel.
  uint64_t copy_engine_min_run_bytes = 1 << 20;
  // Bytes one launch (batch of consecutive tiles) aims for.
  uint64_t batch_bytes = 64 << 20;
  // Batches between two re-probes of the CTA knee.
  int reprobe_batches = 256;
  // GPU-to-GPU transfers run on the destination GPU (its SMs load from the peer) instead of the
  // source GPU (its SMs store into the peer).
  bool run_on_destination = false;
  // Devices to serve; empty: every GPU the runtime sees.
  std::vector<int> devices;
  // Per priority class: CTAs per launch and bytes in flight.
  PriorityLimits limits;
  // CTAs of a critical-priority transfer's kernel launches, above max_ctas (latency-critical
  // work gets the whole GPU; scheduler::ChooseLaunchCtas): < 0 one per SM of the GPU, 0 off
  // (the budget applies).
  int critical_ctas = -1;
  // Copy-engine-only mode (max_ctas 0): plans whose coalesced runs average under
  // `copy_only_kernel_below_run_bytes` run on a kernel of at most `copy_only_kernel_ctas` CTAs
  // (0: never); the transfer's path_reason, the log and Describe say so
  // (scheduler::ChoosePlanMode).
  int copy_only_kernel_ctas = 4;
  uint64_t copy_only_kernel_below_run_bytes = 128 << 10;
  // Before serving, each GPU's dispatcher loads the kernels (lazy module loading would otherwise
  // load them inside the first transfer), keeps the stream-ordered pool's memory between plans,
  // and the engine fills its pinned table pool: the first transfer runs like the hundredth.
  bool warm_up = true;
  // Kernel and copy engines together: the most percent of a kernel batch's bytes handed to the
  // copy engines beside the kernel (0: never), and a fixed percent (0: learned per run-size class,
  // scheduler::SplitTuner).
  int copy_split_max_percent = 40;
  int copy_split_fixed_percent = 0;
  // Layer-wise jobs gated by producer flag words (Job::ready_gate, admitted by AdmitGated) wait
  // on the GPU: per job a stream of its own, cuStreamWaitValue32 (GEQ) before each layer's copy
  // (scheduler/stream_gate.h). Off: AdmitGated says no, and such layers reach the engine only
  // once the readiness poller saw them ready.
  bool stream_wait = false;
  // The critical path: an idle dispatcher spins this long for the next job before it
  // sleeps (0: sleeps at once); plan uploads go through pinned staging slots (one copy for a
  // small plan) instead of up to five copies, the header from pageable memory.
  int dispatcher_spin_us = 100;
  bool staged_plan_upload = true;
  // The share of its thread's time each GPU's dispatcher may spend in that spin, kept as a
  // SpinBudget over 100 ms (base/spin_budget.h): a spin ends early once the budget is spent.
  // 1: no cap; 0: never spins.
  double dispatcher_spin_budget = 1.0;
  // Predictive wake (DaemonConfig.predictive_wake, base/predictive_wake.h): at a steady job
  // cadence an idle dispatcher sleeps until the next job's predicted arrival less `wake.margin`
  // and its measured overshoot (its timer slack set to 1 us), spins on the queues' hint until
  // `wake.tolerance` past it, then sleeps as before; the spin is drawn from
  // dispatcher_spin_budget.
  bool predictive_wake = false;
  PredictiveWakeOptions wake;
  // Engine::Expect wakes the GPU's sleeping dispatcher (then it spins as above) while a submit for
  // it is planned. Off, or without the spin: Expect does nothing.
  bool wake_on_submit = true;
  // The most gated jobs per GPU waiting at once (two streams each: the waits and the abort).
  int stream_wait_jobs = 8;
  // A pending GPU wait blocks every context-synchronizing CUDA call of the process
  // (base/cuda/context_sync.h) until its producer writes the word. The engine's gate watchdog
  // releases a job's pending waits (its unready layers fail, no byte of them moves) when such a
  // call has been blocked this long, or the dispatcher has been silent this long; 0: never
  // (scheduler::DecideGateRelease).
  int stream_wait_sync_bound_ms = 1000;
  // The GPU writes the completion: a job with a done word (Job::DoneWord, TransferSpec.done_word)
  // gets it stored by its stream after its last batch, so the client sees the end without a
  // daemon thread in between (docs/architecture.md, "GPU-written completion"). Off: the word is
  // never written; clients read the completion queue as before.
  bool done_words = true;
  // Plans kept warm: a job's uploaded plan buffer stays on the GPU after the job, keyed by the
  // plan's shape (everything in its image but the block ids: layouts, bases, tiling), and a later
  // job of that shape rewrites only the ids in it instead of allocating and uploading the whole
  // plan (warm_plans.h). At most `warm_plan_entries` buffers and `warm_plan_bytes` per GPU, the
  // least recently used evicted first. Off: every job uploads its whole plan.
  bool warm_plans = true;
  int warm_plan_entries = 32;
  uint64_t warm_plan_bytes = 16 << 20;
};

}  // namespace kvrail::engine

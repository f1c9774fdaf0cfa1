// Dispatcher: batches (kernel, copy engines, both), their completion and the tuners' samples,
// and the gated batches' completion (see dispatcher.h).
#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "daemon/engine/cuda/dispatcher.h"
#include "daemon/scheduler/stream_gate.h"

namespace kvrail::engine::cuda_detail {

using scheduler::Mode;

namespace {

// The first job's first batch: the end of one step of its enqueue (see JobProgress::marking).
void MarkFirstBatch(JobState& s, const char* step, const Clock& clock) {
  if (s.progress.marking) s.progress.first_batch_marks.emplace_back(step, clock.Now());
}

}  // namespace

Batch Dispatcher::Launch(JobState& s, const Taken& taken) {
  if (stats_->first_job_pending()) {
    s.progress.marking = true;
    MarkFirstBatch(s, "launch began", *clock_);
  }
  if (stats_->first_job_pending() && !s.gate.has_value() && s.setup.ok()) {
    // Best effort: without the anchor the first job's batches are not traced.
    absl::StatusOr<std::unique_ptr<GpuEvent>> anchor = TakeEvent();
    if (anchor.ok() && ops_->Record(**anchor, ops_->main_stream()).ok()) {
      s.progress.trace_anchor = *std::move(anchor);
    }
    MarkFirstBatch(s, "anchor recorded", *clock_);
  }
  Batch b = LaunchBatch(s, taken);
  s.progress.marking = false;
  if (s.progress.trace_anchor != nullptr && s.progress.first_launch.has_value()) {
    b.enqueued_us = absl::ToDoubleMicroseconds(clock_->Now() - *s.progress.first_launch);
  }
  if (stats_->first_job_pending()) {
    // The daemon's first job after start: what its first batch waited for and cost here, so a
    // slow first transfer can be told apart from a slow engine.
    stats_->FirstJobStarted();
    const JobProgress& p = s.progress;
    std::string text = absl::StrFormat(
        "; first job: dispatcher took it %.0f us after its enqueue, set-up %.0f us (device "
        "addresses %.0f, mode %.0f, plan upload %.0f), first launch enqueued %.0f us after "
        "its set-up",
        absl::ToDoubleMicroseconds(taken.since_enqueue),
        absl::ToDoubleMicroseconds(p.setup_addresses + p.setup_mode + p.setup_upload),
        absl::ToDoubleMicroseconds(p.setup_addresses), absl::ToDoubleMicroseconds(p.setup_mode),
        absl::ToDoubleMicroseconds(p.setup_upload),
        absl::ToDoubleMicroseconds(clock_->Now() - stats_->first_setup_at()));
    absl::StrAppend(&text, "; first batch's enqueue steps (us after its set-up began):");
    for (const auto& [step, at] : s.progress.first_batch_marks) {
      absl::StrAppendFormat(&text, " %s %.0f,", step,
                            absl::ToDoubleMicroseconds(at - stats_->first_setup_at()));
    }
    text.pop_back();
    stats_->FirstJob(std::move(text));
    s.progress.first_batch_marks.clear();
  }
  return b;
}

Batch Dispatcher::LaunchBatch(JobState& s, const Taken& taken) {
  Batch b;
  b.state = &s;
  b.taken = taken;
  b.split = taken.end;
  ++s.in_flight;
  s.progress.last_batch_bytes = taken.bytes;
  if (!s.progress.first_launch.has_value()) s.progress.first_launch = clock_->Now();
  for (uint32_t t = taken.begin; t < taken.end; ++t) s.job->OnTileStart(t);
  if (!s.setup.ok()) {
    b.launch = s.setup;
    s.launch_failed = true;
    return b;
  }
  if (absl::Status broken = stats_->broken(); !broken.ok()) {
    b.launch = broken;
    s.launch_failed = true;
    return b;
  }
  b.launch = EnqueueBatch(s, b);
  if (!b.launch.ok()) s.launch_failed = true;
  if (!b.launch.ok() && (b.enqueued || b.copy_enqueued)) Fence(b);
  return b;
}

void Dispatcher::MaybeWriteDoneWord(JobState& s, uint32_t batch_tiles, GpuStream& stream) {
  s.tiles_launched += batch_tiles;
  if (!s.done_word.has_value() || s.launch_failed ||
      s.tiles_launched != s.job->plan().num_tiles()) {
    return;
  }
  // A job that ended meanwhile (cancelled, past its deadline) reports its end from the daemon.
  bool producer_gone = false;
  if (!s.job->ended(&producer_gone).ok()) return;
  // Behind every kernel and copy of the job: they are all on this stream, or joined it (the
  // copy part of a split batch) before this point. The batch's `stop` follows the word, so the
  // daemon ends the transfer only after the word is stored: the client's completion entry never
  // comes before it, and the slot the client recycles after that entry is written no more.
  const absl::Status wrote =
      ops_->WriteDoneWord(stream, s.done_word->device_word, s.done_word->value);
  if (wrote.ok()) {
    stats_->DoneWordWritten();
  } else {
    stats_->DoneWordFailed(wrote);
  }
  s.done_keep = std::move(s.done_word->keep);
  s.done_word.reset();
}

absl::Status Dispatcher::EnqueueBatch(JobState& s, Batch& b) {
  const uint32_t begin = b.taken.begin, end = b.taken.end;
  // Ids the planner left unchecked: checked here, on the dispatcher, while the GPU runs the
  // batch before. A failure fails this batch and, sticky, every later one of the job; nothing
  // of it reaches the GPU.
  KVRAIL_RETURN_IF_ERROR(s.job->plan().CheckTiles(begin, end));
  MarkFirstBatch(s, "ids checked", *clock_);
  absl::Status released;
  if (s.gate.has_value() && s.lease.control->Aborted(&released)) {
    // Released before this layer was taken: nothing reaches the GPU.
    const uint32_t layer = s.job->plan().tile(begin).layer;
    return scheduler::GatedTileStatus(true, s.gate->field, layer, s.gate->value, released);
  }
  GpuStream& stream = s.gate.has_value() ? *s.lease.stream : ops_->main_stream();
  b.stream = &stream;
  KVRAIL_ASSIGN_OR_RETURN(b.start, TakeEvent());
  KVRAIL_ASSIGN_OR_RETURN(b.stop, TakeEvent());
  MarkFirstBatch(s, "events taken", *clock_);
  if (s.gate.has_value()) {
    // The layers' words first (GEQ, wrapping epoch order): the kernel below starts when the
    // producer's stream has written them, without the CPU.
    const uint32_t first = s.job->plan().tile(begin).layer;
    const uint32_t last = s.job->plan().tile(end - 1).layer;
    for (uint32_t layer = first; layer <= last; ++layer) {
      absl::Status waits =
          ops_->WaitWord(stream, s.gate->device_words + 4ull * layer, s.gate->value);
      if (!waits.ok()) {
        return absl::Status(waits.code(),
                            absl::StrCat(s.gate->field, "[", layer, "]: ", waits.message()));
      }
      b.enqueued = true;
    }
    // The watchdog now looks at these words (a pending one may be released).
    std::atomic<uint32_t>& launched = s.lease.control->launched_end;
    uint32_t seen = launched.load();
    while (seen < last + 1 && !launched.compare_exchange_weak(seen, last + 1)) {
    }
  }
  KVRAIL_RETURN_IF_ERROR(ops_->Record(*b.start, stream));
  MarkFirstBatch(s, "start recorded", *clock_);
  if (s.run.mode == Mode::kKernel) {
    scheduler::CtaTuner& ctas = tuners_.Cta(s.run.tuner_key, s.run.max_ctas);
    scheduler::LaunchCtasInputs in;
    in.tuner_ctas = ctas.Next(b.taken.bytes);
    in.class_max_ctas = static_cast<int>(options_.limits[b.taken.cls].max_ctas);
    in.critical = b.taken.cls == static_cast<int>(PriorityClass::kCritical);
    in.critical_ctas = critical_ctas_;
    in.copy_only_kernel = s.run.copy_only_kernel;
    b.chosen = scheduler::ChooseLaunchCtas(in);
    b.ctas = b.chosen.ctas;
    // The copy engines' share: not while the knee is being probed (its samples must be the
    // kernel's alone), else the SplitTuner's.
    if (s.run.may_split &&
        !(ctas.probing() && b.taken.bytes >= scheduler::CtaTuner::kMinSampleBytes)) {
      const double fraction =
          tuners_.Split(s.run.tuner_key, s.run.copy_gbps_prior).Next(b.taken.bytes);
      b.split = scheduler::SplitPoint(s.job->plan(), begin, end, fraction);
      b.split_sampled = true;
    }
    MarkFirstBatch(s, "tuners asked", *clock_);
    if (s.digests != nullptr) {  // the fused gather that also hashes the source (kv_digest.h)
      KVRAIL_RETURN_IF_ERROR(ops_->LaunchDigest(*s.plan, begin, end, DigestPass::kCopyHashSource,
                                                *s.digests, b.ctas, ops_->main_stream()));
    } else {
      KVRAIL_RETURN_IF_ERROR(ops_->LaunchCopy(*s.plan, begin, b.split, b.ctas, stream));
    }
    b.enqueued = true;
    MarkFirstBatch(s, "kernel enqueued", *clock_);
    if (b.split < end) {
      KVRAIL_RETURN_IF_ERROR(LaunchCopyPart(s, b));
      if (!s.run.split_said) {  // TransferStatus.engine: "cuda-kernel+cuda-copy-engine"
        // SetUp refused a job without device sides.
        s.job->device_sides()->OnEngineUsed(scheduler::ModeEngineName(Mode::kCopyEngine));
        s.run.split_said = true;
      }
    }
  } else {
    KVRAIL_RETURN_IF_ERROR(CopyRuns(s, begin, end, stream));
    b.enqueued = true;
  }
  if (s.digests != nullptr) KVRAIL_RETURN_IF_ERROR(DigestBatch(s, begin, end, b.ctas));
  MarkFirstBatch(s, "copies enqueued", *clock_);
  MaybeWriteDoneWord(s, end - begin, stream);
  MarkFirstBatch(s, "done word", *clock_);
  // A gated batch ends here too: no host function after it (the dispatcher polls its words and
  // then waits for this event), so the job's next layer follows on the GPU at once.
  return ops_->Record(*b.stop, stream);
}

absl::Status Dispatcher::LaunchCopyPart(const JobState& s, Batch& b) {
  KVRAIL_ASSIGN_OR_RETURN(GpuStream * copy, CopyStream());
  KVRAIL_ASSIGN_OR_RETURN(b.kernel_done, ops_->CreateEvent());
  KVRAIL_ASSIGN_OR_RETURN(b.copy_done, ops_->CreateEvent());
  KVRAIL_RETURN_IF_ERROR(ops_->Record(*b.kernel_done, ops_->main_stream()));
  KVRAIL_RETURN_IF_ERROR(ops_->StreamWaitEvent(*copy, *b.start));
  b.copy_enqueued = true;
  KVRAIL_RETURN_IF_ERROR(CopyRuns(s, b.split, b.taken.end, *copy));
  KVRAIL_RETURN_IF_ERROR(ops_->Record(*b.copy_done, *copy));
  return ops_->StreamWaitEvent(ops_->main_stream(), *b.copy_done);
}

absl::Status Dispatcher::CopyRuns(const JobState& s, uint32_t begin, uint32_t end,
                                  GpuStream& stream) {
  runs_.clear();
  for (uint32_t t = begin; t < end; ++t) scheduler::AppendTileRuns(s.RunPlan(), t, &runs_);
  return ops_->CopyRuns(runs_, s.src, s.dst, stream);
}

absl::Status Dispatcher::DigestBatch(JobState& s, uint32_t begin, uint32_t end, int ctas) {
  const int hash_ctas = ctas > 0 ? ctas : kDigestCtas;
  GpuStream& stream = ops_->main_stream();
  if (s.run.mode != Mode::kKernel) {
    KVRAIL_RETURN_IF_ERROR(ops_->LaunchDigest(*s.plan, begin, end, DigestPass::kHashSource,
                                              *s.digests, hash_ctas, stream));
  }
  KVRAIL_RETURN_IF_ERROR(ops_->LaunchDigest(*s.plan, begin, end, DigestPass::kHashDestination,
                                            *s.digests, hash_ctas, stream));
  return ops_->CopyBackDigests(*s.digests, begin, end);
}

void Dispatcher::Fence(Batch& b) {
  // The copy part joins the batch's stream first, then `stop` follows everything enqueued.
  bool joined = !b.copy_enqueued;
  if (b.copy_enqueued && copy_stream_ != nullptr) {
    absl::StatusOr<std::unique_ptr<GpuEvent>> done = ops_->CreateEvent();
    if (done.ok() && ops_->Record(**done, *copy_stream_).ok() &&
        ops_->StreamWaitEvent(*b.stream, **done).ok()) {
      b.copy_done = *std::move(done);
      joined = true;
    }
  }
  if (b.stream == nullptr) return;
  if (b.stop == nullptr) {
    absl::StatusOr<std::unique_ptr<GpuEvent>> stop = ops_->CreateEvent();
    if (!stop.ok()) return;
    b.stop = *std::move(stop);
  }
  b.fenced = joined && ops_->Record(*b.stop, *b.stream).ok();
}

void Dispatcher::Complete(Batch& b) {
  JobState& s = *b.state;
  absl::Status status = b.launch;
  if (status.ok()) {
    bool sticky = false;
    status = ops_->Wait(*b.stop, &sticky);
    if (sticky) {
      // The daemon's context on this GPU is gone for good: fail everything after this clearly
      // instead of with a cascade of unrelated runtime errors.
      stats_->Broke(absl::FailedPreconditionError(absl::StrCat(
          "GPU", ops_->device(), " is unusable in this kvraild after an earlier kernel fault (",
          status.message(), "); restart kvraild to use it again")));
      // The kept plan buffers are as unusable as the rest of the context.
      warm_.Clear();
      stats_->WarmPlansKept(0, 0);
    }
  } else if (b.enqueued || b.copy_enqueued) {
    // The launch failed after part of it reached the streams (a kernel, copies, waits): its
    // tiles are reported once nothing writes them any more.
    bool sticky = false;
    if (b.fenced) {
      (void)ops_->Wait(*b.stop, &sticky);
    } else {
      if (b.stream != nullptr) (void)ops_->Synchronize(*b.stream);
      if (b.copy_enqueued && copy_stream_ != nullptr) (void)ops_->Synchronize(*copy_stream_);
    }
  }
  // The tiles are reported first: the transfer's end (and its DONE to the client) does not wait
  // for the tuners and the stats line below (they are off the critical path).
  --s.in_flight;
  for (uint32_t t = b.taken.begin; t < b.taken.end; ++t) {
    absl::Status tile_status = status;
    absl::Status released;
    if (s.gate.has_value() && s.lease.control->Aborted(&released)) {
      // Its kernel ran empty (or it never launched).
      tile_status = scheduler::GatedTileStatus(true, s.gate->field, s.job->plan().tile(t).layer,
                                               s.gate->value, released);
    }
    if (status.ok() && s.digests != nullptr) {  // the mirror holds this batch's digests
      const uint64_t from = s.digests->host_source(t), to = s.digests->host_destination(t);
      s.job->OnTileDigest(t, from, to);
      if (from != to) tile_status = planner::DigestMismatchError(s.job->plan(), t, from, to);
    }
    s.job->OnTileDone(t, tile_status);
  }
  if (status.ok()) Learn(s, b, ops_->Seconds(*b.start, *b.stop));
  queues_->Done(b.taken.cls, b.taken.bytes);  // after the report, as in the host engine
  // Passed and read: reusable (not after an error, which may have left them unusable).
  for (std::unique_ptr<GpuEvent>* e : {&b.start, &b.stop}) {
    if (status.ok() && *e != nullptr && spare_events_.size() < 8) {
      spare_events_.push_back(std::move(*e));
    }
  }
}

void Dispatcher::Learn(JobState& s, Batch& b, double seconds) {
  const double gbps = seconds > 0 ? static_cast<double>(b.taken.bytes) / seconds / 1e9 : 0;
  std::string decision;
  if (b.ctas > 0) {
    scheduler::CtaTuner& tuner = tuners_.Cta(s.run.tuner_key, s.run.max_ctas);
    // The kernel's own part: with a split, its bytes over its own time.
    uint64_t kernel_bytes = b.taken.bytes;
    double kernel_seconds = seconds;
    scheduler::SplitSample split;
    if (b.split < b.taken.end) {
      kernel_bytes = 0;
      for (uint32_t t = b.taken.begin; t < b.split; ++t) {
        kernel_bytes += s.job->plan().tile(t).bytes;
      }
      kernel_seconds = ops_->Seconds(*b.start, *b.kernel_done);
      split.copy_bytes = b.taken.bytes - kernel_bytes;
      split.copy_seconds = ops_->Seconds(*b.start, *b.copy_done);
    }
    split.kernel_bytes = kernel_bytes;
    split.kernel_seconds = kernel_seconds;
    split.total_seconds = seconds;
    // Only the tuner's own choices teach it (not a class cap, a critical raise or the ramp).
    const bool sample = b.chosen.tuner_sample() && !b.taken.ramped;
    if (sample) tuner.Report(b.ctas, kernel_bytes, kernel_seconds);
    decision =
        absl::StrFormat("kernel %d CTAs%s%s, now %s", b.ctas, b.chosen.raised ? " (critical)" : "",
                        b.chosen.capped ? " (class limit)" : "", tuner.Describe());
    if (s.run.may_split) {
      scheduler::SplitTuner& splits = tuners_.Split(s.run.tuner_key, s.run.copy_gbps_prior);
      if (b.split_sampled && sample) splits.Report(split);
      if (b.split < b.taken.end) {
        absl::StrAppendFormat(
            &decision, " beside the copy engines (%.0f%% of this batch)",
            100.0 * static_cast<double>(split.copy_bytes) / static_cast<double>(b.taken.bytes));
      }
      absl::StrAppend(&decision, "; ", splits.Describe());
    }
  } else {
    decision = "copy engine";
  }
  JobProgress& p = s.progress;
  p.gpu_seconds += seconds;
  p.bytes_done += b.taken.bytes;
  ++p.batches;
  // The first job's trace: its first kFirstJobTraceBatches batches (a long first job would
  // otherwise grow the stats line with every batch).
  bool traced = false;
  if (p.trace_anchor != nullptr && b.enqueued_us >= 0 && p.batches <= kFirstJobTraceBatches + 1) {
    if (p.batches <= kFirstJobTraceBatches) {
      absl::StrAppendFormat(&p.trace, "%s%.0f/%.0f/%.0f", p.trace.empty() ? "" : ", ",
                            b.enqueued_us, ops_->Seconds(*p.trace_anchor, *b.start) * 1e6,
                            ops_->Seconds(*p.trace_anchor, *b.stop) * 1e6);
    } else {
      absl::StrAppend(&p.trace, ", ...");
    }
    traced = true;
  }
  stats_->Batch(b.ctas > 0, b.split < b.taken.end,
                absl::StrFormat("%s, %.1f GB/s last batch (%.1f MiB)", decision, gbps,
                                static_cast<double>(b.taken.bytes) / (1 << 20)),
                JobSample{p.batches, p.bytes_done, p.gpu_seconds,
                          absl::ToDoubleSeconds(clock_->Now() - *p.first_launch)},
                traced ? &p.trace : nullptr);
}

void Dispatcher::PollGated() {
  std::vector<JobState*> drained;
  for (auto& entry : states_) {
    JobState& s = *entry.second;
    if (!s.gate.has_value() || s.gated.empty()) continue;
    while (!s.gated.empty()) {
      Batch& b = s.gated.front();
      // Not passed yet: completed now (Complete waits for its event) only once its words have
      // come (or were raised by a release), so the wait is the kernel's, never the producer's.
      const bool on_gpu = b.launch.ok() || b.fenced;
      const bool pending = on_gpu ? !ops_->Passed(*b.stop) : b.enqueued;
      if (pending && !GateWordsCame(s, b)) break;
      Complete(b);
      s.gated.pop_front();
      --gated_pending_;
    }
    if (s.gated.empty()) drained.push_back(&s);
  }
  for (JobState* s : drained) DropIfFinished(s);
}

bool Dispatcher::GateWordsCame(const JobState& s, const Batch& b) const {
  const uint32_t first = s.job->plan().tile(b.taken.begin).layer;
  const uint32_t last = s.job->plan().tile(b.taken.end - 1).layer;
  for (uint32_t l = first; l <= last && l < s.gate->count; ++l) {
    if (!Reached(__atomic_load_n(&s.gate->host_words[l], __ATOMIC_ACQUIRE), s.gate->value)) {
      return false;
    }
  }
  return true;
}

}  // namespace kvrail::engine::cuda_detail

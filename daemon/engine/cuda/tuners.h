// The CUDA engine's learned launch shapes per plan class (tuner key): the CTA knee
// (scheduler::CtaTuner), the kernel / copy-engine split (scheduler::SplitTuner), and the copy
// engines' measured cost per run between GPU pairs (scheduler::CopyEngineCosts).
#pragma once

#include <map>

#include "daemon/engine/cuda/cuda_engine_options.h"
#include "daemon/scheduler/cuda_batch_policy.h"

namespace kvrail::engine::cuda_detail {

// Thread contract: the dispatcher thread only (the warm-up runs there too).
class Tuners {
 public:
  explicit Tuners(const CudaEngineOptions& options)
      : fixed_ctas_(options.fixed_ctas),
        reprobe_batches_(options.reprobe_batches),
        split_max_(options.copy_split_max_percent / 100.0),
        split_fixed_(options.copy_split_fixed_percent / 100.0) {}

  scheduler::CtaTuner& Cta(int key, int max_ctas);
  scheduler::SplitTuner& Split(int key, double copy_gbps_prior);
  scheduler::CopyEngineCosts& copy_costs() { return copy_costs_; }

 private:
  const int fixed_ctas_;
  const int reprobe_batches_;
  const double split_max_, split_fixed_;
  std::map<int, scheduler::CtaTuner> cta_;
  std::map<int, scheduler::SplitTuner> split_;  // same keys as cta_
  scheduler::CopyEngineCosts copy_costs_;
};

}  // namespace kvrail::engine::cuda_detail

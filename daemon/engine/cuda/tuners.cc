#include "daemon/engine/cuda/tuners.h"

namespace kvrail::engine::cuda_detail {

scheduler::CtaTuner& Tuners::Cta(int key, int max_ctas) {
  auto it = cta_.find(key);
  if (it == cta_.end()) {
    it = cta_.emplace(key, scheduler::CtaTuner(max_ctas, fixed_ctas_, reprobe_batches_)).first;
  }
  return it->second;
}

scheduler::SplitTuner& Tuners::Split(int key, double copy_gbps_prior) {
  auto it = split_.find(key);
  if (it == split_.end()) {
    it = split_
             .emplace(key, scheduler::SplitTuner(split_max_, split_fixed_, copy_gbps_prior,
                                                 reprobe_batches_))
             .first;
  }
  return it->second;
}

}  // namespace kvrail::engine::cuda_detail

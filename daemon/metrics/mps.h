// CUDA MPS co-running check. An MPS server serves one user id: the control daemon starts a server
// for the first client's user, and a client of another user waits until that server exits. So
// kvraild's kernels co-run with the inference servers' only when both run as the same user;
// otherwise they take turns on the GPU, which undoes the interference figures measured under MPS.
// ProbeMps tells, at start, which of these holds (as far as /proc shows).
#pragma once

#include <sys/types.h>

#include <string>

#include "proto/kvrail/v1/admin.pb.h"

namespace kvrail::metrics {

struct MpsProbeOptions {
  // The control pipe's folder (cuda_mps_pipe_directory, which config::ApplyEnvironment fills
  // from $CUDA_MPS_PIPE_DIRECTORY); empty: CUDA's default, /tmp/nvidia-mps.
  std::string pipe_directory;
  // Where processes are listed (tests pass a fake tree).
  std::string proc_root = "/proc";
  uid_t daemon_uid = 0;
};

// Stateless; reads the file system only.
v1::OpsMps ProbeMps(const MpsProbeOptions& options);

// True when `mps` says kvraild's kernels may not co-run (a warning is due at start).
bool MpsNeedsAttention(const v1::OpsMps& mps);

}  // namespace kvrail::metrics

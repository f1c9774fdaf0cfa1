// kvraild's configuration: a DaemonConfig textproto file, then flags, then defaults.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "proto/kvrail/v1/config.pb.h"

namespace kvrail::config {

// The longest idle spin a config may ask of a thread on the hot path (session_submission_spin_us,
// cuda_dispatcher_spin_us), in microseconds: a decode step's gap. Each spin is also bounded by
// its budget (session_spin_budget_percent, cuda_dispatcher_spin_budget_percent).
constexpr uint32_t kMaxSpinUs = 10000;

// Parses a DaemonConfig in protobuf text format. Errors name the file and line.
absl::StatusOr<v1::DaemonConfig> LoadConfigFile(const std::string& path);

// Parses text (for tests and --config contents); `origin` names it in errors.
absl::StatusOr<v1::DaemonConfig> ParseConfig(const std::string& text, const std::string& origin);

// `overrides` fields that are set (non-default) replace those of `base`; map entries merge.
void MergeOverrides(const v1::DaemonConfig& overrides, v1::DaemonConfig* base);

// Reads one environment variable: its value, or nullptr when unset (std::getenv in kvraild,
// a map in tests).
using Getenv = std::function<const char*(const char* name)>;

// The environment variables that set config keys, applied in this one place (after the file and
// the flags, before FinalizeConfig; docs/operations.md, "Environment"):
//   KVRAILD_LOW_LATENCY=off|on     overrides low_latency (false|true)
//   KVRAIL_FABRIC_RELAY=VALUE      overrides fabric.relay (auto, off, host, gpu:<ordinal>)
//   KVRAIL_FABRIC_GPU_PACK=VALUE   overrides fabric.gpu_pack (kernel, copy)
//   CUDA_MPS_PIPE_DIRECTORY=DIR    fills cuda_mps_pipe_directory when the config leaves it empty
//                                  (the config's value wins: it is exported to CUDA)
// Unset or empty variables change nothing. A value not understood is INVALID_ARGUMENT naming the
// variable.
absl::Status ApplyEnvironment(const Getenv& getenv, v1::DaemonConfig* config);

// Fills unset fields with defaults (documented in config.proto) and checks values; errors name
// the key, e.g. "socket_mode: 0777 gives everyone write access ...".
absl::Status FinalizeConfig(v1::DaemonConfig* config);

}  // namespace kvrail::config

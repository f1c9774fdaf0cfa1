// kvraild's configuration: a DaemonConfig textproto file, then flags, then defaults.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "proto/kvrail/v1/config.pb.h"

namespace kvrail::config {

// Parses a DaemonConfig in protobuf text format. Errors name the file and line.
absl::StatusOr<v1::DaemonConfig> LoadConfigFile(const std::string& path);

// Parses text (for tests and --config contents); `origin` names it in errors.
absl::StatusOr<v1::DaemonConfig> ParseConfig(const std::string& text, const std::string& origin);

// `overrides` fields that are set (non-default) replace those of `base`; map entries merge.
void MergeOverrides(const v1::DaemonConfig& overrides, v1::DaemonConfig* base);

// Fills unset fields with defaults (documented in config.proto) and checks values; errors name
// the key, e.g. "socket_mode: 0777 gives everyone write access ...".
absl::Status FinalizeConfig(v1::DaemonConfig* config);

}  // namespace kvrail::config

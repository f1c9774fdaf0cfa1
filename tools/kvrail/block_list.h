// Block lists as the `kvrail` CLI reads and prints them: "0-99,200,300-310". Pure functions;
// thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::client::cli {

// Parses "0-99,200,300-310" (inclusive ranges, order kept, whitespace around items allowed) into
// block ids. INVALID_ARGUMENT naming the bad item for empty items, non-numbers, values above
// 2^32-1, reversed ranges, or more than `max_ids` ids in total.
absl::StatusOr<std::vector<uint32_t>> ParseBlockList(absl::string_view text,
                                                     size_t max_ids = size_t{1} << 24);
// The inverse, compressing runs: {0,1,2,3,7} -> "0-3,7".
std::string FormatBlockList(const std::vector<uint32_t>& ids);

}  // namespace kvrail::client::cli

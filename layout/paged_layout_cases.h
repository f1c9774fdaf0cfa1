// Test support: the table of paged layouts in paged_layout_cases.txt (its header says the format)
// that every validating path must judge alike. Not thread-safe (reads a file).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "proto/kvrail/v1/region.pb.h"

namespace kvrail::layout {

struct LayoutCase {
  std::string name;
  v1::PagedKvLayout layout;
  std::optional<uint64_t> region_bytes;  // unbounded when empty
  bool per_layer = false;
  // Valid: the bytes the layout spans. Invalid: the field its error must blame.
  std::optional<uint64_t> bytes;
  std::string field;
};

// The cases of the table at `path` (relative to a test's runfiles root:
// "layout/paged_layout_cases.txt"); a line that does not parse fails the calling test.
std::vector<LayoutCase> ReadLayoutCases(const std::string& path = "layout/paged_layout_cases.txt");

// The field a validator's message blames: what lies between `prefix` and the first ':' ("" when
// the message does not start with `prefix`).
std::string BlamedField(const std::string& message, const std::string& prefix);

}  // namespace kvrail::layout

// The CLI's block lists ("0-99,200,300-310"): parsing what the operator typed, and printing
// tables compactly.
#include "tools/kvrail/block_list.h"

#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvrail::client::cli {
namespace {

absl::StatusOr<uint32_t> ParseBlockId(absl::string_view text, absl::string_view item) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block list item \"", item, "\": missing number"));
  }
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat("block list item \"", item, "\": \"", text,
                                                     "\" is not a non-negative integer"));
    }
  }
  uint64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block list item \"", item, "\": ", text, " is larger than 4294967295"));
  }
  return static_cast<uint32_t>(value);
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> ParseBlockList(absl::string_view text, size_t max_ids) {
  std::vector<uint32_t> ids;
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError("empty block list (want e.g. \"0-99,200,300-310\")");
  }
  size_t index = 0;
  for (absl::string_view raw : absl::StrSplit(text, ',')) {
    const absl::string_view item = absl::StripAsciiWhitespace(raw);
    if (item.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("block list item ", index, " is empty (stray comma?) in \"", text, "\""));
    }
    const size_t dash = item.find('-');
    uint32_t first, last;
    if (dash == absl::string_view::npos) {
      absl::StatusOr<uint32_t> id = ParseBlockId(item, item);
      if (!id.ok()) return id.status();
      first = last = *id;
    } else {
      absl::StatusOr<uint32_t> lo = ParseBlockId(item.substr(0, dash), item);
      if (!lo.ok()) return lo.status();
      absl::StatusOr<uint32_t> hi = ParseBlockId(item.substr(dash + 1), item);
      if (!hi.ok()) return hi.status();
      if (*hi < *lo) {
        return absl::InvalidArgumentError(absl::StrCat("block list item \"", item, "\": range end ",
                                                       *hi, " is below its start ", *lo));
      }
      first = *lo;
      last = *hi;
    }
    const uint64_t count = uint64_t{last} - first + 1;
    if (ids.size() + count > max_ids) {
      return absl::InvalidArgumentError(
          absl::StrCat("block list has more than ", max_ids, " ids (at item \"", item, "\")"));
    }
    for (uint64_t id = first; id <= last; ++id) ids.push_back(static_cast<uint32_t>(id));
    ++index;
  }
  return ids;
}

std::string FormatBlockList(const std::vector<uint32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j] != std::numeric_limits<uint32_t>::max() &&
           ids[j + 1] == ids[j] + 1) {
      ++j;
    }
    if (!out.empty()) out += ',';
    if (j == i) {
      absl::StrAppend(&out, ids[i]);
    } else {
      absl::StrAppend(&out, ids[i], "-", ids[j]);
    }
    i = j + 1;
  }
  return out;
}

}  // namespace kvrail::client::cli

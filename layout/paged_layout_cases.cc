#include "layout/paged_layout_cases.h"

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "catch2/catch.hpp"

namespace kvrail::layout {
namespace {

uint64_t Number(const std::string& token, const std::string& line) {
  uint64_t value = 0;
  INFO(line);
  REQUIRE(absl::SimpleAtoi(token, &value));
  return value;
}

template <typename Enum>
Enum EnumValue(const std::string& token, bool (*parse)(const std::string&, Enum*),
               const std::string& line) {
  Enum value{};
  if (parse(token, &value)) return value;
  return static_cast<Enum>(Number(token, line));
}

}  // namespace

std::vector<LayoutCase> ReadLayoutCases(const std::string& path) {
  std::ifstream in(path);
  INFO(path);
  REQUIRE(in.good());
  std::vector<LayoutCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    std::vector<std::string> t = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (t.empty()) continue;
    INFO(line);
    REQUIRE(t.size() == 18);
    LayoutCase c;
    c.name = t[0];
    v1::PagedKvLayout& l = c.layout;
    l.set_num_layers(static_cast<uint32_t>(Number(t[1], line)));
    l.set_num_parts(static_cast<uint32_t>(Number(t[2], line)));
    l.set_num_blocks(static_cast<uint32_t>(Number(t[3], line)));
    l.set_tokens_per_block(static_cast<uint32_t>(Number(t[4], line)));
    l.set_num_heads(static_cast<uint32_t>(Number(t[5], line)));
    l.set_head_dim(static_cast<uint32_t>(Number(t[6], line)));
    l.set_dtype(EnumValue<v1::DType>(t[7], &v1::DType_Parse, line));
    l.set_order(EnumValue<v1::LayoutOrder>(t[8], &v1::LayoutOrder_Parse, line));
    l.set_layer_stride(Number(t[9], line));
    l.set_part_stride(Number(t[10], line));
    l.set_block_stride(Number(t[11], line));
    l.set_token_stride(Number(t[12], line));
    l.set_head_stride(Number(t[13], line));
    l.set_offset_bytes(Number(t[14], line));
    if (t[15] != "-") c.region_bytes = Number(t[15], line);
    c.per_layer = Number(t[16], line) != 0;
    if (t[17].rfind("ok:", 0) == 0) {
      c.bytes = Number(t[17].substr(3), line);
    } else {
      c.field = t[17];
    }
    cases.push_back(std::move(c));
  }
  REQUIRE(!cases.empty());
  return cases;
}

std::string BlamedField(const std::string& message, const std::string& prefix) {
  if (message.rfind(prefix, 0) != 0) return "";
  const size_t colon = message.find(':', prefix.size());
  if (colon == std::string::npos) return "";
  return message.substr(prefix.size(), colon - prefix.size());
}

}  // namespace kvrail::layout

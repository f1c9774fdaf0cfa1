#include "tools/kvrail/cli_format.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/kvrail_client.h"
#include "tools/kvrail/block_list.h"

namespace kvrail::client::cli {
namespace {

// Strips `prefix` from a protobuf enum value name and lower-cases the rest.
std::string EnumShortName(const std::string& full, absl::string_view prefix) {
  absl::string_view name = full;
  absl::ConsumePrefix(&name, prefix);
  if (name.empty()) return "?";
  return absl::AsciiStrToLower(name);
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < sizeof(kUnits) / sizeof(kUnits[0])) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string HumanRate(uint64_t bytes, double seconds) {
  if (!(seconds > 0)) return "-";
  return absl::StrFormat("%.2f GB/s", static_cast<double>(bytes) / seconds / 1e9);
}

std::string HumanDuration(absl::Duration d) {
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  const int64_t ms = absl::ToInt64Milliseconds(d);
  if (ms < 1000) return absl::StrCat(ms, "ms");
  if (ms < 60 * 1000) return absl::StrFormat("%.1fs", static_cast<double>(ms) / 1000.0);
  const int64_t s = ms / 1000;
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, (s % 86400) / 3600);
}

std::string StateName(v1::TransferState state) {
  return EnumShortName(v1::TransferState_Name(state), "TRANSFER_STATE_");
}
std::string PriorityName(v1::Priority priority) {
  if (priority == v1::PRIORITY_UNSPECIFIED) return "normal";  // the daemon treats it as NORMAL
  return EnumShortName(v1::Priority_Name(priority), "PRIORITY_");
}
std::string PathName(v1::Path path) {
  if (path == v1::PATH_UNSPECIFIED) return "-";
  return EnumShortName(v1::Path_Name(path), "PATH_");
}
std::string DTypeName(v1::DType dtype) { return EnumShortName(v1::DType_Name(dtype), "DTYPE_"); }
std::string PeerStateName(v1::PeerState state) {
  return EnumShortName(v1::PeerState_Name(state), "PEER_STATE_");
}
std::string DirectoryKindName(v1::DirectoryKind kind) {
  return EnumShortName(v1::DirectoryKind_Name(kind), "DIRECTORY_KIND_");
}

absl::StatusOr<std::vector<v1::TransferState>> ParseStates(absl::string_view text) {
  std::vector<v1::TransferState> states;
  for (absl::string_view raw : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::string item = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(raw));
    v1::TransferState state;
    if (!v1::TransferState_Parse(absl::StrCat("TRANSFER_STATE_", item), &state) &&
        !v1::TransferState_Parse(item, &state)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown transfer state \"", absl::StripAsciiWhitespace(raw),
                       "\" (want queued, running, succeeded, failed or cancelled)"));
    }
    if (state == v1::TRANSFER_STATE_UNSPECIFIED) {
      return absl::InvalidArgumentError("transfer state \"unspecified\" cannot be listed");
    }
    states.push_back(state);
  }
  if (states.empty()) return absl::InvalidArgumentError("empty state list");
  return states;
}

absl::StatusOr<v1::Priority> ParsePriority(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "critical") return v1::PRIORITY_CRITICAL;
  if (lower == "normal") return v1::PRIORITY_NORMAL;
  if (lower == "background") return v1::PRIORITY_BACKGROUND;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown priority \"", text, "\" (want critical, normal or background)"));
}

std::string KindDevice(const v1::RegionSpec& spec) {
  switch (spec.memory_kind()) {
    case v1::MEMORY_KIND_HOST:
      return "host";
    case v1::MEMORY_KIND_CUDA:
      return absl::StrCat("cuda:", spec.device());
    default:
      return "?";
  }
}

std::string LayoutSummary(const v1::RegionSpec& spec) {
  if (spec.has_bytes()) return "bytes";
  if (!spec.has_paged_kv()) return "-";
  const v1::PagedKvLayout& l = spec.paged_kv();
  std::string order;
  if (l.layer_stride() || l.part_stride() || l.block_stride() || l.token_stride() ||
      l.head_stride()) {
    order = "strided";
  } else {
    switch (l.order()) {
      case v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD:
        order = "NHD";
        break;
      case v1::LAYOUT_ORDER_LAYER_PART_BLOCK_HND:
        order = "HND";
        break;
      case v1::LAYOUT_ORDER_BLOCK_LAYER_PART_NHD:
        order = "block-major NHD";
        break;
      case v1::LAYOUT_ORDER_BLOCK_LAYER_PART_HND:
        order = "block-major HND";
        break;
      case v1::LAYOUT_ORDER_LAYER_BLOCK_PART_NHD:
        order = "layer-block-part NHD";
        break;
      default:
        order = "order?";
        break;
    }
  }
  std::string out = absl::StrCat("paged ", l.num_layers(), "L×", l.num_parts(), "P×",
                                 l.num_blocks(), "B×", l.tokens_per_block(), "T×", l.num_heads(),
                                 "H×", l.head_dim(), "D ", DTypeName(l.dtype()), " ", order);
  if (l.offset_bytes() != 0) absl::StrAppend(&out, " @+", l.offset_bytes());
  return out;
}

std::string EndpointSummary(const v1::TransferEndpoint& e, bool bytes_transfer) {
  std::string out = absl::StrCat("region ", e.region_id());
  if (!e.node_id().empty()) absl::StrAppend(&out, "@", e.node_id());
  if (!bytes_transfer && e.block_ids_size() == 0) {
    absl::StrAppend(&out, " blocks not reported, layers from ", e.layer_begin(), " heads from ",
                    e.head_begin());
  } else if (!bytes_transfer) {
    const std::vector<uint32_t> ids(e.block_ids().begin(), e.block_ids().end());
    std::string list = FormatBlockList(ids);
    if (list.size() > 60) list = absl::StrCat(list.substr(0, 57), "...");
    absl::StrAppend(&out, " blocks[", e.block_ids_size(), "]=", list);
    absl::StrAppend(&out, " layers from ", e.layer_begin(), " heads from ", e.head_begin());
  } else {
    absl::StrAppend(&out, " bytes from offset ", e.byte_offset());
  }
  return out;
}

double TransferSeconds(const v1::TransferStatus& status) {
  if (status.finished_unix_us() <= 0 || status.started_unix_us() <= 0) return 0;
  return static_cast<double>(status.finished_unix_us() - status.started_unix_us()) / 1e6;
}

std::string ProgressLine(const v1::TransferStatus& status, uint32_t num_layers, double rate_gbps,
                         int width, double eta_seconds) {
  const double fraction = status.bytes_total() == 0
                              ? (status.state() == v1::TRANSFER_STATE_SUCCEEDED ? 1.0 : 0.0)
                              : std::min(1.0, static_cast<double>(status.bytes_done()) /
                                                  static_cast<double>(status.bytes_total()));
  std::string out;
  if (width > 0) {
    const int filled = static_cast<int>(std::floor(fraction * width));
    out = "[";
    out.append(static_cast<size_t>(filled), '#');
    out.append(static_cast<size_t>(width - filled), '.');
    out += "] ";
  }
  absl::StrAppend(&out, absl::StrFormat("%5.1f%%", fraction * 100.0), "  ",
                  HumanBytes(status.bytes_done()), " / ", HumanBytes(status.bytes_total()));
  if (rate_gbps >= 0) absl::StrAppend(&out, absl::StrFormat("  %.2f GB/s", rate_gbps));
  if (num_layers > 0) absl::StrAppend(&out, "  layers ", status.layers_done(), "/", num_layers);
  if (eta_seconds >= 0) {
    absl::StrAppend(&out, "  ETA ", HumanDuration(absl::Seconds(eta_seconds)));
  }
  absl::StrAppend(&out, "  ", StateName(status.state()));
  return out;
}

void RateMeter::Add(absl::Time when, uint64_t bytes_done) {
  samples_.emplace_back(when, bytes_done);
  // Keep the newest sample older than the window as the rate's base.
  size_t first = 0;
  while (first + 1 < samples_.size() && samples_[first + 1].first <= when - window_) ++first;
  samples_.erase(samples_.begin(), samples_.begin() + static_cast<std::ptrdiff_t>(first));
}

double RateMeter::BytesPerSecond() const {
  if (samples_.size() < 2) return -1;
  const auto& [t0, b0] = samples_.front();
  const auto& [t1, b1] = samples_.back();
  const double seconds = absl::ToDoubleSeconds(t1 - t0);
  if (seconds <= 0 || b1 < b0) return -1;
  return static_cast<double>(b1 - b0) / seconds;
}

double RateMeter::EtaSeconds(uint64_t total) const {
  const double rate = BytesPerSecond();
  if (rate <= 0 || samples_.empty()) return -1;
  const uint64_t done = samples_.back().second;
  return done >= total ? 0 : static_cast<double>(total - done) / rate;
}

absl::StatusOr<uint64_t> MatchTransferId(absl::string_view text,
                                         const std::vector<uint64_t>& newest_first) {
  if (text == "last") {
    if (newest_first.empty()) return absl::NotFoundError("transfer id: 'last': no transfers yet");
    return newest_first.front();
  }
  if (text.empty() || text.find_first_not_of("0123456789") != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer id: '", text,
                     "' is neither a transfer id (or a unique prefix of one) nor 'last'"));
  }
  std::vector<uint64_t> matches;
  for (uint64_t id : newest_first) {
    const std::string digits = absl::StrCat(id);
    if (digits == text) return id;
    if (absl::StartsWith(digits, text)) matches.push_back(id);
  }
  if (matches.size() == 1) return matches.front();
  if (matches.size() > 1) {
    std::vector<std::string> shown;
    for (size_t i = 0; i < matches.size() && i < 5; ++i) shown.push_back(absl::StrCat(matches[i]));
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer id: '", text, "' is ambiguous: ", matches.size(), " transfers start with it (",
        absl::StrJoin(shown, ", "), matches.size() > 5 ? ", ..." : "", "); give more digits"));
  }
  uint64_t id = 0;
  if (!absl::SimpleAtoi(text, &id)) {
    return absl::InvalidArgumentError(absl::StrCat("transfer id: '", text, "' is out of range"));
  }
  return id;
}

bool UseColour(int fd) {
  if (::isatty(fd) != 1) return false;
  const char* no_color = std::getenv("NO_COLOR");
  if (no_color != nullptr && *no_color != '\0') return false;
  const char* term = std::getenv("TERM");
  return term == nullptr || std::string(term) != "dumb";
}

std::string ColourState(v1::TransferState state, const std::string& text, bool colour) {
  if (!colour) return text;
  const char* code = nullptr;
  switch (state) {
    case v1::TRANSFER_STATE_SUCCEEDED:
      code = "32";
      break;
    case v1::TRANSFER_STATE_FAILED:
      code = "31";
      break;
    case v1::TRANSFER_STATE_RUNNING:
    case v1::TRANSFER_STATE_QUEUED:
      code = "33";
      break;
    case v1::TRANSFER_STATE_CANCELLED:
      code = "2";
      break;
    default:
      return text;
  }
  return absl::StrCat("\x1b[", code, "m", text, "\x1b[0m");
}

size_t DisplayWidth(absl::string_view text) {
  size_t n = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == 0x1b && i + 1 < text.size() && text[i + 1] == '[') {
      // An ANSI CSI sequence: ESC [ parameters final-byte (0x40-0x7e); takes no columns.
      i += 2;
      while (i < text.size() && !(text[i] >= 0x40 && text[i] <= 0x7e)) ++i;
      continue;
    }
    if ((c & 0xC0) != 0x80) ++n;  // count every byte that starts a code point
  }
  return n;
}

Table::Table(std::vector<std::string> headers)
    : headers_(std::move(headers)), right_(headers_.size(), false) {}

void Table::RightAlign(size_t column) {
  if (column < right_.size()) right_[column] = true;
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::Render() const {
  std::vector<size_t> widths(headers_.size(), 0);
  for (size_t c = 0; c < headers_.size(); ++c) widths[c] = DisplayWidth(headers_[c]);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
  }
  std::string out;
  auto render_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const size_t pad = widths[c] - DisplayWidth(row[c]);
      if (c > 0) line += "  ";
      if (right_[c]) line.append(pad, ' ');
      line += row[c];
      if (!right_[c]) line.append(pad, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line;
    out += '\n';
  };
  render_row(headers_);
  for (const auto& row : rows_) render_row(row);
  return out;
}

std::string PermissionHint(const std::string& path, const std::string& group, unsigned gid,
                           unsigned mode) {
  const std::string name = group.empty() ? absl::StrCat(gid) : group;
  return absl::StrCat("permission denied on ", path, " (group ", name, ", mode ",
                      absl::StrFormat("%04o", mode & 07777),
                      "): join the socket's group: `sudo usermod -aG ", name,
                      " $USER`, then log in again (or run `newgrp ", name, "`)");
}

std::string SocketPermissionProblem(const std::string& target) {
  std::string path = target;
  if (path.rfind("unix:", 0) == 0) path = path.substr(5);
  if (path.empty() || path[0] != '/') return "";
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return "";
  if (::access(path.c_str(), R_OK | W_OK) == 0 || errno != EACCES) return "";
  const struct group* g = ::getgrgid(st.st_gid);
  return PermissionHint(path, g != nullptr ? g->gr_name : "", st.st_gid, st.st_mode);
}

}  // namespace kvrail::client::cli

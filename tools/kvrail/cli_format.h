// Rendering for the `kvrail` CLI: human sizes and rates, enum names, layout summaries, aligned
// tables and the progress line. Pure functions (no I/O), so they are unit-tested directly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/kvrail/v1/admin.pb.h"
#include "proto/kvrail/v1/region.pb.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::client::cli {

// 1536 -> "1.5 KiB"; below 1 KiB plain bytes ("512 B"). Binary units up to TiB.
std::string HumanBytes(uint64_t bytes);
// Decimal GB/s (10^9 bytes per second) with two decimals; "-" when seconds <= 0.
std::string HumanRate(uint64_t bytes, double seconds);
// "850ms", "12.3s", "4m05s", "3h12m", "2d04h"; negative durations render as "0ms".
std::string HumanDuration(absl::Duration d);

// Lower-case names without the enum prefix: "running", "critical", "host_local", "bf16".
std::string StateName(v1::TransferState state);
std::string PriorityName(v1::Priority priority);
std::string PathName(v1::Path path);
std::string DTypeName(v1::DType dtype);
std::string PeerStateName(v1::PeerState state);
std::string DirectoryKindName(v1::DirectoryKind kind);

// "running,queued" -> states (also accepts upper case and the full enum names).
absl::StatusOr<std::vector<v1::TransferState>> ParseStates(absl::string_view text);
// "critical" | "normal" | "background" (case-insensitive).
absl::StatusOr<v1::Priority> ParsePriority(absl::string_view text);

// "host" or "cuda:N".
std::string KindDevice(const v1::RegionSpec& spec);
// "paged 32L×2P×4096B×16T×8H×128D bf16 NHD", "bytes", or "-" when no layout is set. Explicit
// strides render as "strided" in place of the order name.
std::string LayoutSummary(const v1::RegionSpec& spec);
// One side of a transfer: "region 3 blocks[256]=0-255 layers from 0 heads from 0" for paged
// transfers, "region 3 bytes from offset 4096" when `bytes_transfer` (spec.num_bytes != 0). The
// daemon may leave block ids out of the specs it reports; that shows as "blocks not reported".
std::string EndpointSummary(const v1::TransferEndpoint& endpoint, bool bytes_transfer);

// Seconds between start and finish of an ended transfer; <= 0 when unknown.
double TransferSeconds(const v1::TransferStatus& status);

// "[#########...........]  45.2%  1.1 GiB / 2.5 GiB  3.41 GB/s  layers 12/32  running"; `width`
// is the bar's width in cells (<= 0: no bar). `rate_gbps` < 0 leaves the rate out.
// `eta_seconds` >= 0 appends "  ETA 4.1s".
std::string ProgressLine(const v1::TransferStatus& status, uint32_t num_layers, double rate_gbps,
                         int width = 30, double eta_seconds = -1);

// Instantaneous rate from successive progress samples: bytes per second over the samples of the
// last `window` (at least two samples needed). Not thread-safe (a local value).
class RateMeter {
 public:
  explicit RateMeter(absl::Duration window = absl::Seconds(1)) : window_(window) {}
  void Add(absl::Time when, uint64_t bytes_done);
  // < 0 while unknown.
  double BytesPerSecond() const;
  // Seconds until `total` at the current rate; < 0 while unknown (no rate, or nothing moving).
  double EtaSeconds(uint64_t total) const;

 private:
  absl::Duration window_;
  std::vector<std::pair<absl::Time, uint64_t>> samples_;
};

// Resolves what the user typed for a transfer: "last" (the newest of `newest_first`), a unique
// decimal prefix of one of `newest_first`, or a whole id (used as given when no listed id starts
// with it, since the history may not list it). INVALID_ARGUMENT naming the candidates when the
// prefix is ambiguous, or when the text is not a number.
absl::StatusOr<uint64_t> MatchTransferId(absl::string_view text,
                                         const std::vector<uint64_t>& newest_first);

// Whether to colour output: `fd` is a terminal, $NO_COLOR is unset and $TERM is not "dumb".
bool UseColour(int fd);
// `text` in the colour of `state` (green succeeded, red failed, yellow running/queued, dim
// cancelled) when `colour`; else `text` unchanged.
std::string ColourState(v1::TransferState state, const std::string& text, bool colour);

// An aligned text table. Thread contract: not thread-safe (a local value).
class Table {
 public:
  explicit Table(std::vector<std::string> headers);
  // Columns listed here are right-aligned (numbers, sizes).
  void RightAlign(size_t column);
  void AddRow(std::vector<std::string> cells);
  size_t rows() const { return rows_.size(); }
  // Columns separated by two spaces, trailing spaces trimmed, '\n' after each line. Widths count
  // UTF-8 code points, so "×" counts as one column.
  std::string Render() const;

 private:
  std::vector<std::string> headers_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// Display width of a UTF-8 string in code points; ANSI colour sequences ("\x1b[...m") count 0.
size_t DisplayWidth(absl::string_view text);

// What to tell a user refused by the socket's permissions: "permission denied on <path> (group
// <name>, mode 0660): join the group ...". `group` is the socket's group name ("" unknown: its
// number is shown).
std::string PermissionHint(const std::string& path, const std::string& group, unsigned gid,
                           unsigned mode);
// PermissionHint for `target` when it is a unix socket this process may not connect to (no
// read/write access); "" when it may, or it is not a local path.
std::string SocketPermissionProblem(const std::string& target);

}  // namespace kvrail::client::cli

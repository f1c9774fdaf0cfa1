// `kvrail`: the operator's CLI for the node's kvraild.
//
// Exit codes: 0 success; 1 the daemon answered with an error, could not be reached, or a watched
// transfer did not succeed; 2 usage errors (bad flags, bad block lists). Errors go to stderr;
// --json switches stdout to machine output (protobuf JSON with proto field names; lists as JSON
// arrays; `transfers watch` as one JSON event per line).
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/grpc_status.h"
#include "client/kvrail_client.h"
#include "daemon/metrics/build_info.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "tools/kvrail/block_list.h"
#include "tools/kvrail/cli_format.h"
#include "tools/kvrail/cli_top.h"
#include "tools/kvrail/cli_topo.h"
#include "topology/topology.h"

namespace kvrail::client::cli {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

// Options shared by every command.
struct Globals {
  std::string socket = DefaultTarget();
  bool json = false;
};

int Fail(const absl::Status& status) {
  std::cerr << "kvrail: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  return kExitFailed;
}

int UsageError(const absl::Status& status) {
  std::cerr << "kvrail: " << status.message() << "\n";
  return kExitUsage;
}

std::string ToJson(const google::protobuf::Message& message, bool pretty = true) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  options.add_whitespace = pretty;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

template <typename Messages>
void PrintJsonArray(const Messages& messages) {
  std::string out = "[";
  bool first = true;
  for (const auto& m : messages) {
    absl::StrAppend(&out, first ? "\n" : ",\n", ToJson(m));
    first = false;
  }
  out += first ? "]" : "\n]";
  std::cout << out << "\n";
}

std::string FormatUnixUs(int64_t unix_us) {
  if (unix_us <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%E3S", absl::FromUnixMicros(unix_us),
                          absl::LocalTimeZone());
}

std::string Age(int64_t unix_us) {
  if (unix_us <= 0) return "-";
  return HumanDuration(absl::Now() - absl::FromUnixMicros(unix_us));
}

std::string RateIfEnded(const v1::TransferStatus& s) {
  if (!IsFinal(s.state())) return "-";
  return HumanRate(s.bytes_done(), TransferSeconds(s));
}

std::string ErrorText(const v1::TransferStatus& s) {
  if (s.error_code() == 0 && s.error_message().empty()) return "";
  return absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())), ": ",
                      s.error_message());
}

// One line: "transfer 12 succeeded: 512.0 MiB in 0.12s (4.31 GB/s) path host_local engine host".
std::string FinalSummary(const v1::TransferStatus& s) {
  std::string out = absl::StrCat("transfer ", s.transfer_id(), " ", StateName(s.state()), ": ",
                                 HumanBytes(s.bytes_done()), " / ", HumanBytes(s.bytes_total()));
  const double seconds = TransferSeconds(s);
  if (seconds > 0) {
    absl::StrAppend(&out, " in ", HumanDuration(absl::Seconds(seconds)), " (",
                    HumanRate(s.bytes_done(), seconds), ")");
  }
  absl::StrAppend(&out, " path ", PathName(s.path()), " engine ",
                  s.engine().empty() ? "-" : s.engine());
  const std::string error = ErrorText(s);
  if (!error.empty()) absl::StrAppend(&out, " error ", error);
  return out;
}

// Layers a transfer moves, for progress display: spec.num_layers, else the source region's
// layers from src.layer_begin on (looked up best-effort; 0 when unknown).
uint32_t LayersOf(Client& client, const v1::TransferStatus& s) {
  if (s.spec().num_layers() != 0) return s.spec().num_layers();
  absl::StatusOr<v1::ListRegionsResponse> regions = client.ListRegions();
  if (!regions.ok()) return 0;
  for (const v1::RegionInfo& r : regions->regions()) {
    if (r.region_id() == s.spec().src().region_id() && r.spec().has_paged_kv() &&
        s.spec().src().node_id().empty()) {
      const uint32_t layers = r.spec().paged_kv().num_layers();
      return layers > s.spec().src().layer_begin() ? layers - s.spec().src().layer_begin() : 0;
    }
  }
  return 0;
}

// What the user typed for a transfer ("last", a unique prefix, an id), resolved against the
// daemon's newest transfers (as many as it lists at once).
absl::StatusOr<uint64_t> ResolveTransferId(Client& client, const std::string& text) {
  std::vector<uint64_t> ids;
  const bool whole_id = text != "last" && text.size() >= 20;
  if (!whole_id) {
    v1::ListTransfersRequest request;
    request.set_limit(text == "last" ? 1 : 1000);
    absl::StatusOr<v1::ListTransfersResponse> list = client.ListTransfers(request);
    if (!list.ok() && list.status().code() == absl::StatusCode::kResourceExhausted) {
      request.set_limit(0);  // the daemon's own default page
      list = client.ListTransfers(request);
    }
    if (!list.ok()) return list.status();
    for (const v1::TransferStatus& t : list->transfers()) ids.push_back(t.transfer_id());
  }
  return MatchTransferId(text, ids);
}

// ---- commands -----------------------------------------------------------------------------

// "etcd ok (3 peers, 3 registered; 1 registration)" or "etcd DEGRADED for 5s: why (known
// peers keep working)".
std::string DirectoryLine(const v1::DirectoryStatus& d) {
  const bool ok = d.state() == v1::DIRECTORY_STATE_OK;
  std::string line = absl::StrCat(DirectoryKindName(d.kind()), " ", ok ? "ok" : "DEGRADED");
  if (!ok) {
    absl::StrAppend(&line, " for ", Age(d.since_unix_us()), ": ", d.reason(),
                    " (known peers keep working)");
    return line;
  }
  absl::StrAppend(&line, " (", d.peers(), " peers");
  if (d.kind() == v1::DIRECTORY_KIND_ETCD) {
    absl::StrAppend(&line, ", ", d.registered_peers(), " registered; ", d.registrations(),
                    d.registrations() == 1 ? " registration" : " registrations");
    if (!d.last_error().empty()) {
      absl::StrAppend(&line, "; last error ", FormatUnixUs(d.last_error_unix_us()), ": ",
                      d.last_error());
    }
  }
  absl::StrAppend(&line, ")");
  return line;
}

int CmdStatus(Client& client, const Globals& g) {
  absl::StatusOr<v1::Stats> stats = client.GetStats();
  if (!stats.ok()) return Fail(stats.status());
  if (g.json) {
    std::cout << ToJson(*stats) << "\n";
    return kExitOk;
  }
  const v1::Stats& s = *stats;
  std::cout << "kvraild " << (s.version().empty() ? "?" : s.version()) << " on node "
            << (s.node_id().empty() ? "?" : s.node_id()) << ", up " << Age(s.started_unix_us())
            << " (" << client.target() << ")\n";
  std::cout << "  regions:    " << s.regions() << "\n";
  std::cout << "  transfers:  " << s.transfers_active() << " active, " << s.transfers_succeeded()
            << " succeeded, " << s.transfers_failed() << " failed, " << s.transfers_cancelled()
            << " cancelled (" << s.transfers_submitted() << " submitted)\n";
  std::vector<std::string> by_path;
  std::map<std::string, uint64_t> sorted_paths(s.bytes_by_path().begin(), s.bytes_by_path().end());
  for (const auto& [path, bytes] : sorted_paths) {
    by_path.push_back(absl::StrCat(path, " ", HumanBytes(bytes)));
  }
  std::cout << "  moved:      " << HumanBytes(s.bytes_moved())
            << (by_path.empty() ? "" : absl::StrCat(" (", absl::StrJoin(by_path, ", "), ")"))
            << "\n";
  std::map<std::string, uint64_t> queued(s.queued_tiles().begin(), s.queued_tiles().end());
  std::vector<std::string> queued_text;
  for (const auto& [klass, tiles] : queued) queued_text.push_back(absl::StrCat(klass, " ", tiles));
  std::cout << "  queued:     "
            << (queued_text.empty() ? "0 tiles"
                                    : absl::StrCat(absl::StrJoin(queued_text, ", "), " tiles"))
            << "\n";
  std::cout << "  engines:    " << (s.engines().empty() ? "-" : absl::StrJoin(s.engines(), "; "))
            << "\n";
  std::cout << "  draining:   " << (s.draining() ? "yes (new work is refused)" : "no") << "\n";
  if (s.has_mps()) std::cout << "  mps:        " << s.mps().verdict() << "\n";
  if (s.has_directory()) std::cout << "  directory:  " << DirectoryLine(s.directory()) << "\n";
  if (!s.build_info().empty()) std::cout << "  build:      " << s.build_info() << "\n";
  if (!s.rejected_by_code().empty()) {
    std::map<std::string, uint64_t> rejected(s.rejected_by_code().begin(),
                                             s.rejected_by_code().end());
    std::vector<std::string> text;
    for (const auto& [code, n] : rejected) text.push_back(absl::StrCat(code, " ", n));
    std::cout << "  refused:    " << absl::StrJoin(text, ", ") << "\n";
  }
  return kExitOk;
}

int CmdStats(Client& client, const Globals& g) {
  absl::StatusOr<v1::Stats> stats = client.GetStats();
  if (!stats.ok()) return Fail(stats.status());
  if (g.json) {
    std::cout << ToJson(*stats) << "\n";
    return kExitOk;
  }
  const v1::Stats& s = *stats;
  Table t({"FIELD", "VALUE"});
  t.AddRow({"version", s.version()});
  t.AddRow({"node_id", s.node_id()});
  t.AddRow({"started", FormatUnixUs(s.started_unix_us())});
  t.AddRow({"regions", absl::StrCat(s.regions())});
  t.AddRow({"transfers_submitted", absl::StrCat(s.transfers_submitted())});
  t.AddRow({"transfers_succeeded", absl::StrCat(s.transfers_succeeded())});
  t.AddRow({"transfers_failed", absl::StrCat(s.transfers_failed())});
  t.AddRow({"transfers_cancelled", absl::StrCat(s.transfers_cancelled())});
  t.AddRow({"transfers_active", absl::StrCat(s.transfers_active())});
  t.AddRow({"bytes_moved", absl::StrCat(s.bytes_moved(), " (", HumanBytes(s.bytes_moved()), ")")});
  std::map<std::string, uint64_t> queued(s.queued_tiles().begin(), s.queued_tiles().end());
  for (const auto& [k, v] : queued)
    t.AddRow({absl::StrCat("queued_tiles[", k, "]"), absl::StrCat(v)});
  std::map<std::string, uint64_t> paths(s.bytes_by_path().begin(), s.bytes_by_path().end());
  for (const auto& [k, v] : paths) {
    t.AddRow({absl::StrCat("bytes_by_path[", k, "]"), absl::StrCat(v, " (", HumanBytes(v), ")")});
  }
  for (int i = 0; i < s.engines_size(); ++i) {
    t.AddRow({absl::StrCat("engines[", i, "]"), s.engines(i)});
  }
  t.AddRow({"draining", s.draining() ? "true" : "false"});
  std::cout << t.Render();
  return kExitOk;
}

int CmdRegions(Client& client, const Globals& g) {
  absl::StatusOr<v1::ListRegionsResponse> regions = client.ListRegions();
  if (!regions.ok()) return Fail(regions.status());
  if (g.json) {
    PrintJsonArray(regions->regions());
    return kExitOk;
  }
  Table t({"ID", "NAME", "KIND", "SIZE", "LAYOUT", "RW", "SESSION", "ACTIVE", "AGE"});
  t.RightAlign(0);
  t.RightAlign(3);
  t.RightAlign(7);
  for (const v1::RegionInfo& r : regions->regions()) {
    t.AddRow({absl::StrCat(r.region_id()), r.spec().name().empty() ? "-" : r.spec().name(),
              KindDevice(r.spec()), HumanBytes(r.spec().size_bytes()), LayoutSummary(r.spec()),
              r.spec().writable() ? "rw" : "ro",
              r.session_id() == 0 ? "-" : absl::StrCat(r.session_id()),
              absl::StrCat(r.active_transfers()), Age(r.registered_unix_us())});
  }
  std::cout << t.Render();
  return kExitOk;
}

int CmdTransfersList(Client& client, const Globals& g, const std::vector<v1::TransferState>& states,
                     uint32_t limit) {
  absl::StatusOr<v1::ListTransfersResponse> list = client.ListTransfers(states, limit);
  if (!list.ok()) return Fail(list.status());
  if (g.json) {
    PrintJsonArray(list->transfers());
    return kExitOk;
  }
  Table t({"ID", "STATE", "PRIO", "PATH", "DONE", "TOTAL", "RATE", "AGE", "LABEL"});
  for (size_t c : {0, 4, 5, 6, 7}) t.RightAlign(c);
  for (const v1::TransferStatus& s : list->transfers()) {
    t.AddRow({absl::StrCat(s.transfer_id()),
              ColourState(s.state(), StateName(s.state()), UseColour(STDOUT_FILENO)),
              PriorityName(s.spec().priority()), PathName(s.path()), HumanBytes(s.bytes_done()),
              HumanBytes(s.bytes_total()), RateIfEnded(s), Age(s.submitted_unix_us()),
              s.spec().label()});
  }
  std::cout << t.Render();
  return kExitOk;
}

int CmdTransfersShow(Client& client, const Globals& g, uint64_t id) {
  absl::StatusOr<v1::TransferStatus> status = client.Get(id);
  if (!status.ok()) return Fail(status.status());
  if (g.json) {
    std::cout << ToJson(*status) << "\n";
    return kExitOk;
  }
  const v1::TransferStatus& s = *status;
  const v1::TransferSpec& spec = s.spec();
  Table t({"FIELD", "VALUE"});
  t.AddRow({"id", absl::StrCat(s.transfer_id())});
  t.AddRow({"state", StateName(s.state())});
  t.AddRow({"priority", PriorityName(spec.priority())});
  t.AddRow({"label", spec.label().empty() ? "-" : spec.label()});
  t.AddRow({"src", EndpointSummary(spec.src(), spec.num_bytes() != 0)});
  t.AddRow({"dst", EndpointSummary(spec.dst(), spec.num_bytes() != 0)});
  t.AddRow({"layers", spec.num_layers() == 0 ? "all" : absl::StrCat(spec.num_layers())});
  t.AddRow({"heads", spec.num_heads() == 0 ? "all" : absl::StrCat(spec.num_heads())});
  t.AddRow({"tokens", spec.num_tokens() == 0 ? "all" : absl::StrCat(spec.num_tokens())});
  if (spec.num_bytes() != 0) t.AddRow({"bytes", absl::StrCat(spec.num_bytes())});
  t.AddRow({"layerwise", spec.layerwise() ? "yes" : "no"});
  t.AddRow({"timeout", spec.timeout_ms() == 0 ? "none" : absl::StrCat(spec.timeout_ms(), "ms")});
  if (!spec.idempotency_key().empty()) t.AddRow({"idempotency_key", spec.idempotency_key()});
  t.AddRow({"progress", absl::StrCat(HumanBytes(s.bytes_done()), " / ", HumanBytes(s.bytes_total()),
                                     " (", s.bytes_done(), " / ", s.bytes_total(), " bytes)")});
  t.AddRow({"tiles", absl::StrCat(s.tiles_done(), " / ", s.tiles_total())});
  t.AddRow({"layers_done", absl::StrCat(s.layers_done())});
  t.AddRow({"path", PathName(s.path())});
  t.AddRow({"why", s.path_reason().empty() ? "-" : s.path_reason()});
  t.AddRow({"link", s.link().empty() ? "-" : s.link()});
  t.AddRow({"engine", s.engine().empty() ? "-" : s.engine()});
  if (s.nics_size() > 0) t.AddRow({"nics", absl::StrJoin(s.nics(), ", ")});
  t.AddRow({"submitted", FormatUnixUs(s.submitted_unix_us())});
  t.AddRow({"started", FormatUnixUs(s.started_unix_us())});
  t.AddRow({"finished", FormatUnixUs(s.finished_unix_us())});
  if (s.started_unix_us() > 0 && s.submitted_unix_us() > 0) {
    t.AddRow({"queued_for",
              HumanDuration(absl::Microseconds(s.started_unix_us() - s.submitted_unix_us()))});
  }
  if (TransferSeconds(s) > 0) {
    t.AddRow({"ran_for", HumanDuration(absl::Seconds(TransferSeconds(s)))});
    t.AddRow({"rate", HumanRate(s.bytes_done(), TransferSeconds(s))});
  }
  const std::string error = ErrorText(s);
  t.AddRow({"error", error.empty() ? "-" : error});
  std::cout << t.Render();
  return kExitOk;
}

// Live progress until the final state. On a TTY one line redrawn in place; otherwise one plain
// line per event; with --json one JSON event per line.
int CmdTransfersWatch(Client& client, const Globals& g, uint64_t id, uint32_t interval_ms) {
  const bool tty = !g.json && ::isatty(STDOUT_FILENO) == 1;
  uint32_t layers = 0;
  bool layers_known = false;
  RateMeter meter;
  auto on_event = [&](const v1::TransferEvent& e) {
    if (g.json) {
      std::cout << ToJson(e, /*pretty=*/false) << std::endl;
      return true;
    }
    const v1::TransferStatus& s = e.status();
    if (!layers_known) {
      layers = LayersOf(client, s);
      layers_known = true;
    }
    // Instantaneous rate (the last second of progress) and the ETA it implies while running;
    // the whole transfer's average once it ended.
    double rate = -1;
    double eta = -1;
    if (IsFinal(s.state())) {
      rate = TransferSeconds(s) > 0 ? s.bytes_done() / TransferSeconds(s) / 1e9 : -1;
    } else {
      meter.Add(absl::Now(), s.bytes_done());
      if (meter.BytesPerSecond() >= 0) rate = meter.BytesPerSecond() / 1e9;
      eta = meter.EtaSeconds(s.bytes_total());
    }
    if (tty) {
      std::cout << "\r\033[K" << ProgressLine(s, layers, rate, 30, eta) << std::flush;
    } else {
      std::string kind = v1::TransferEvent_Kind_Name(e.kind());
      absl::string_view short_kind = kind;
      absl::ConsumePrefix(&short_kind, "KIND_");
      std::cout << absl::AsciiStrToLower(short_kind);
      if (e.kind() == v1::TransferEvent::KIND_LAYER_DONE) std::cout << " " << e.layer();
      std::cout << "  " << ProgressLine(s, layers, rate, 0, eta) << std::endl;
    }
    return true;
  };
  absl::StatusOr<v1::TransferStatus> last = client.Watch(id, on_event, interval_ms);
  if (tty) std::cout << "\n";
  if (!last.ok()) return Fail(last.status());
  if (!g.json) std::cout << FinalSummary(*last) << "\n";
  return last->state() == v1::TRANSFER_STATE_SUCCEEDED ? kExitOk : kExitFailed;
}

// Cancels, then waits (up to 30 s) for the transfer to end: tiles already running finish first,
// so the status Cancel answers may still say "running". Prints the final state.
int CmdTransfersCancel(Client& client, const Globals& g, uint64_t id) {
  absl::StatusOr<v1::TransferStatus> status = client.Cancel(id);
  if (!status.ok()) return Fail(status.status());
  if (!IsFinal(status->state())) {
    absl::StatusOr<v1::TransferStatus> ended = client.Wait(id, absl::Seconds(30));
    if (!ended.ok()) return Fail(ended.status());
    status = std::move(ended);
  }
  if (!IsFinal(status->state()) && !g.json) {
    std::cout << "transfer " << id << ": cancelling (tiles still running after 30 s)\n";
    return kExitFailed;
  }
  if (g.json) {
    std::cout << ToJson(*status) << "\n";
  } else {
    std::cout << "transfer " << id << ": " << StateName(status->state()) << "\n";
  }
  return kExitOk;
}

struct SubmitArgs {
  uint64_t src_region = 0, dst_region = 0;
  std::string src_blocks, dst_blocks;
  uint32_t layers = 0, src_layer_begin = 0, dst_layer_begin = 0;
  uint32_t heads = 0, src_head_begin = 0, dst_head_begin = 0;
  uint64_t tokens = 0, bytes = 0, src_offset = 0, dst_offset = 0;
  std::string priority = "normal";
  uint64_t timeout_ms = 0;
  std::string label, idempotency_key, src_node, dst_node;
  std::string src_grant, dst_grant;  // another session's regions (TransferEndpoint.grant)
  bool wait = false;
  bool layerwise = false;
};

// Checks the flags and builds the spec (before connecting: usage errors exit 2 even when the
// daemon is down).
absl::StatusOr<v1::TransferSpec> BuildSubmitSpec(const SubmitArgs& a) {
  v1::TransferSpec spec;
  if (a.src_blocks.empty() != a.dst_blocks.empty()) {
    return absl::InvalidArgumentError(
        "--src-blocks and --dst-blocks go together (paged regions); use --bytes for byte regions");
  }
  if (a.src_blocks.empty() && a.bytes == 0) {
    return absl::InvalidArgumentError(
        "give --src-blocks/--dst-blocks (paged regions) or --bytes (byte regions)");
  }
  if (!a.src_blocks.empty()) {
    absl::StatusOr<std::vector<uint32_t>> src = ParseBlockList(a.src_blocks);
    if (!src.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--src-blocks: ", src.status().message()));
    }
    absl::StatusOr<std::vector<uint32_t>> dst = ParseBlockList(a.dst_blocks);
    if (!dst.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--dst-blocks: ", dst.status().message()));
    }
    spec = MakeBlockTransfer(a.src_region, std::move(*src), a.dst_region, std::move(*dst));
  } else {
    spec.mutable_src()->set_region_id(a.src_region);
    spec.mutable_dst()->set_region_id(a.dst_region);
  }
  absl::StatusOr<v1::Priority> priority = ParsePriority(a.priority);
  if (!priority.ok()) return priority.status();
  spec.mutable_src()->set_layer_begin(a.src_layer_begin);
  spec.mutable_dst()->set_layer_begin(a.dst_layer_begin);
  spec.mutable_src()->set_head_begin(a.src_head_begin);
  spec.mutable_dst()->set_head_begin(a.dst_head_begin);
  spec.mutable_src()->set_byte_offset(a.src_offset);
  spec.mutable_dst()->set_byte_offset(a.dst_offset);
  spec.mutable_src()->set_grant(a.src_grant);
  spec.mutable_dst()->set_grant(a.dst_grant);
  spec.mutable_src()->set_node_id(a.src_node);
  spec.mutable_dst()->set_node_id(a.dst_node);
  spec.set_num_layers(a.layers);
  spec.set_num_heads(a.heads);
  spec.set_num_tokens(a.tokens);
  spec.set_num_bytes(a.bytes);
  spec.set_priority(*priority);
  spec.set_timeout_ms(a.timeout_ms);
  spec.set_label(a.label);
  spec.set_idempotency_key(a.idempotency_key);
  spec.set_layerwise(a.layerwise);
  return spec;
}

int CmdSubmit(Client& client, const Globals& g, const v1::TransferSpec& spec, bool wait) {
  absl::StatusOr<v1::SubmitTransferResponse> submitted = client.Submit(spec);
  if (!submitted.ok()) return Fail(submitted.status());
  if (!wait) {
    if (g.json) {
      std::cout << ToJson(*submitted) << "\n";
    } else {
      std::cout << submitted->transfer_id() << "\n";
      if (submitted->deduplicated()) {
        std::cerr << "kvrail: idempotency key matched transfer " << submitted->transfer_id()
                  << "; nothing new submitted\n";
      }
    }
    return kExitOk;
  }
  absl::StatusOr<v1::TransferStatus> final_status;
  if (!g.json && ::isatty(STDERR_FILENO) == 1) {
    // A live progress line (instantaneous rate, ETA) on the terminal while waiting.
    RateMeter meter;
    final_status = client.Watch(
        submitted->transfer_id(),
        [&](const v1::TransferEvent& e) {
          const v1::TransferStatus& s = e.status();
          meter.Add(absl::Now(), s.bytes_done());
          const double rate = meter.BytesPerSecond();
          std::cerr << "\r\033[K"
                    << ProgressLine(s, 0, rate >= 0 ? rate / 1e9 : -1, 30,
                                    meter.EtaSeconds(s.bytes_total()))
                    << std::flush;
          return true;
        },
        /*min_interval_ms=*/200);
    std::cerr << "\r\033[K" << std::flush;
  } else {
    final_status = client.Wait(submitted->transfer_id());
  }
  if (!final_status.ok()) return Fail(final_status.status());
  if (g.json) {
    nlohmann::json out;
    out["submit"] = nlohmann::json::parse(ToJson(*submitted, false));
    out["status"] = nlohmann::json::parse(ToJson(*final_status, false));
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << submitted->transfer_id() << "\n" << FinalSummary(*final_status) << "\n";
  }
  return final_status->state() == v1::TRANSFER_STATE_SUCCEEDED ? kExitOk : kExitFailed;
}

int CmdPeers(Client& client, const Globals& g) {
  absl::StatusOr<v1::ListPeersResponse> peers = client.ListPeers();
  if (!peers.ok()) return Fail(peers.status());
  if (g.json) {
    PrintJsonArray(peers->peers());
    return kExitOk;
  }
  Table t({"NODE", "ADDRESS", "STATE", "LAST SEEN"});
  for (const v1::PeerInfo& p : peers->peers()) {
    t.AddRow(
        {p.node_id(), p.address(), PeerStateName(p.state()),
         p.last_seen_unix_us() > 0 ? absl::StrCat(Age(p.last_seen_unix_us()), " ago") : "never"});
  }
  std::cout << t.Render();
  if (peers->peers_size() == 0) std::cout << "(no peers configured)\n";
  return kExitOk;
}

// The standard gRPC health check (liveness: service ""; readiness: "kvrail.v1.Transfer", which
// turns NOT_SERVING when a drain begins). Exit 0 only for SERVING.
int CmdHealth(Client& client, const Globals& g, const std::string& service) {
  auto channel = grpc::CreateChannel(client.grpc_target(), grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return Fail(FromGrpcStatus(status));
  const std::string name =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  if (g.json) {
    std::cout << ToJson(response) << "\n";
  } else {
    std::cout << (service.empty() ? "kvraild" : service) << ": " << name << "\n";
  }
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk
                                                                             : kExitFailed;
}

int CmdTopo(Client& client, const Globals& g, bool dump, bool dot) {
  absl::StatusOr<v1::GetTopologyResponse> topo = client.GetTopology();
  if (!topo.ok()) return Fail(topo.status());
  if (dump) {
    // Replayable: `kvraild --topology-file` reads exactly this.
    std::cout << topology::DumpTopology(topo->desc());
  } else if (dot) {
    std::cout << RenderTopoDot(*topo);  // `kvrail topo --dot | dot -Tsvg > node.svg`
  } else if (g.json) {
    std::cout << ToJson(*topo) << "\n";
  } else {
    // The daemon's graph is used when present (an older daemon's is computed here); identical
    // GPU pairs collapse into one line and the matrix fits the terminal.
    std::cout << RenderTopo(*topo, TerminalWidth());
  }
  return kExitOk;
}

int Main(int argc, char** argv) {
  CLI::App app{"kvrail: inspect and drive the node's kvraild"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the command; inherited by subcommands
  Globals g;
  app.add_option("--socket", g.socket,
                 "kvraild's unix socket (or host:port); default $KVRAIL_SOCKET or " +
                     std::string(kDefaultSocket))
      ->capture_default_str();
  app.add_flag("--json", g.json, "machine-readable output (protobuf JSON)");
  app.set_version_flag("--version", build::Info("kvrail"));

  CLI::App* status = app.add_subcommand("status", "daemon summary");
  CLI::App* stats = app.add_subcommand("stats", "raw counters (incl. per-path and queue maps)");
  CLI::App* regions = app.add_subcommand("regions", "registered regions");
  CLI::App* peers = app.add_subcommand("peers", "peer daemons and their liveness");
  CLI::App* topo = app.add_subcommand(
      "topo", "node topology: GPU/NIC matrix, NIC affinity, chosen paths (--json: raw response)");
  bool topo_dump = false;
  CLI::App* top = app.add_subcommand("top", "live per-path throughput, queues, SM budget");
  uint32_t top_interval_ms = 1000, top_iterations = 0;
  top->add_option("--interval-ms", top_interval_ms, "refresh period (default 1000)");
  top->add_option("--iterations", top_iterations, "frames to show, 0 = until interrupted");
  std::string top_sort = "r";
  top->add_option(
         "--sort", top_sort,
         "transfers order: r rate, b bytes done, l bytes left, i id, p priority (keys on a TTY)")
      ->check(CLI::IsMember({"r", "b", "l", "i", "p"}));
  CLI::App* health = app.add_subcommand("health", "gRPC health check; exit 0 only when SERVING");
  std::string health_service;
  health->add_option("--service", health_service,
                     "service to ask about (kvrail.v1.Transfer for readiness); empty: the server");
  topo->add_flag("--dump", topo_dump,
                 "print the description as textproto (kvraild --topology-file)");
  bool topo_dot = false;
  topo->add_flag("--dot", topo_dot, "print the topology as a Graphviz graph (dot -Tsvg)");

  CLI::App* transfers = app.add_subcommand("transfers", "list, show, watch or cancel transfers");
  transfers->require_subcommand(0, 1);
  std::string states_text;
  uint32_t limit = 0;
  transfers->add_option("--state", states_text, "only these states, e.g. running,queued");
  transfers->add_option("--limit", limit, "at most N (newest first); default 100");
  CLI::App* t_list = transfers->add_subcommand("list", "transfers, newest first (the default)");
  t_list->add_option("--state", states_text, "only these states, e.g. running,queued");
  t_list->add_option("--limit", limit, "at most N (newest first); default 100");
  std::string transfer_id_text;
  uint32_t interval_ms = 0;
  CLI::App* t_show = transfers->add_subcommand("show", "every field of one transfer");
  t_show->add_option("id", transfer_id_text, "transfer id, a unique prefix of one, or 'last'")
      ->required();
  CLI::App* t_watch = transfers->add_subcommand("watch", "live progress until it ends");
  t_watch->add_option("id", transfer_id_text, "transfer id, a unique prefix of one, or 'last'")
      ->required();
  t_watch->add_option("--interval-ms", interval_ms, "minimum spacing of byte-progress events");
  CLI::App* t_cancel = transfers->add_subcommand("cancel", "cancel a queued or running transfer");
  t_cancel->add_option("id", transfer_id_text, "transfer id, a unique prefix of one, or 'last'")
      ->required();

  SubmitArgs a;
  CLI::App* submit = app.add_subcommand("submit", "submit a transfer; prints its id");
  submit->add_option("--src-region", a.src_region, "source region id")->required();
  submit->add_option("--src-blocks", a.src_blocks, "source blocks, e.g. 0-99,200,300-310");
  submit->add_option("--dst-region", a.dst_region, "destination region id")->required();
  submit->add_option("--dst-blocks", a.dst_blocks, "destination blocks");
  submit->add_option("--src-grant", a.src_grant,
                     "read grant of the source's owner (the CLI owns no regions)");
  submit->add_option("--dst-grant", a.dst_grant, "write grant of the destination's owner");
  submit->add_option("--layers", a.layers, "layers to move (0: all from --src-layer-begin)");
  submit->add_option("--src-layer-begin", a.src_layer_begin);
  submit->add_option("--dst-layer-begin", a.dst_layer_begin);
  submit->add_option("--heads", a.heads, "heads to move (0: all from --src-head-begin)");
  submit->add_option("--src-head-begin", a.src_head_begin);
  submit->add_option("--dst-head-begin", a.dst_head_begin);
  submit->add_option("--tokens", a.tokens, "tokens to move (0: every token of the src blocks)");
  submit->add_option("--bytes", a.bytes, "byte regions: bytes to move");
  submit->add_option("--src-offset", a.src_offset, "byte regions: source offset");
  submit->add_option("--dst-offset", a.dst_offset, "byte regions: destination offset");
  submit->add_option("--src-node", a.src_node, "node holding the source (empty: this node)");
  submit->add_option("--dst-node", a.dst_node, "node holding the destination (empty: this node)");
  submit->add_option("--priority", a.priority, "critical | normal | background")
      ->capture_default_str();
  submit->add_option("--timeout-ms", a.timeout_ms, "deadline from submission (0: none)");
  submit->add_option("--label", a.label, "free text shown by the CLI");
  submit->add_option("--idempotency-key", a.idempotency_key);
  submit->add_flag("--wait", a.wait, "wait for the end; exit 1 unless it succeeded");
  submit->add_flag("--layerwise", a.layerwise,
                   "layer-wise: each layer moves once marked ready (by the submitter)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }

  // Usage checks that need no daemon come first, so they exit 2 even when it is down.
  std::vector<v1::TransferState> states;
  if (!states_text.empty()) {
    absl::StatusOr<std::vector<v1::TransferState>> parsed = ParseStates(states_text);
    if (!parsed.ok()) return UsageError(parsed.status());
    states = *parsed;
  }
  v1::TransferSpec submit_spec;
  if (submit->parsed()) {
    absl::StatusOr<v1::TransferSpec> built = BuildSubmitSpec(a);
    if (!built.ok()) return UsageError(built.status());
    submit_spec = *std::move(built);
  }

  // A socket the user may not open: say which group to join (before gRPC's generic error).
  const std::string denied = SocketPermissionProblem(g.socket);
  if (!denied.empty()) return Fail(absl::PermissionDeniedError(denied));
  // The CLI registers no region (kvrail_regions and the daemon's info log stay the inference
  // servers'); its session says who calls (the operator sees every transfer and may cancel).
  // health, the pods' probe, needs no identity: no session at all.
  ClientOptions options = ClientOptions::FromEnvironment();
  options.target = g.socket;
  options.eager_block_table = false;
  options.open_session = !health->parsed();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options, absl::Seconds(3));
  if (!client.ok()) return Fail(client.status());
  Client& c = **client;
  if (status->parsed()) return CmdStatus(c, g);
  if (stats->parsed()) return CmdStats(c, g);
  if (regions->parsed()) return CmdRegions(c, g);
  if (peers->parsed()) return CmdPeers(c, g);
  if (topo->parsed()) return CmdTopo(c, g, topo_dump, topo_dot);
  if (health->parsed()) return CmdHealth(c, g, health_service);
  if (top->parsed()) return RunTop(c, g.json, top_interval_ms, top_iterations, top_sort[0]);
  if (submit->parsed()) return CmdSubmit(c, g, submit_spec, a.wait);
  if (transfers->parsed()) {
    uint64_t transfer_id = 0;
    if (t_show->parsed() || t_watch->parsed() || t_cancel->parsed()) {
      absl::StatusOr<uint64_t> id = ResolveTransferId(c, transfer_id_text);
      if (!id.ok()) {
        return id.status().code() == absl::StatusCode::kInvalidArgument ? UsageError(id.status())
                                                                        : Fail(id.status());
      }
      transfer_id = *id;
    }
    if (t_show->parsed()) return CmdTransfersShow(c, g, transfer_id);
    if (t_watch->parsed()) return CmdTransfersWatch(c, g, transfer_id, interval_ms);
    if (t_cancel->parsed()) return CmdTransfersCancel(c, g, transfer_id);
    return CmdTransfersList(c, g, states, limit);
  }
  return UsageError(absl::InvalidArgumentError("no command given (try --help)"));
}

}  // namespace
}  // namespace kvrail::client::cli

int main(int argc, char** argv) { return kvrail::client::cli::Main(argc, argv); }

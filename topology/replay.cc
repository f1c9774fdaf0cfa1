// Replay: textproto in and out, JSON out. A fixture or --topology-file is checked for the
// invariants ComputeGraph relies on, so a bad file fails here with its name, not later.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "topology/topology.h"

namespace kvrail::topology {
namespace {

// Keeps the first parse error with its position (the parser reports 0-based line and column).
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (message_.empty()) message_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  void AddWarning(int line, int column, const std::string& message) override {}
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

// The invariants ComputeGraph relies on.
absl::Status Validate(const TopologyDesc& desc, const std::string& name) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", what));
  };
  for (int i = 0; i < desc.gpus_size(); ++i) {
    if (desc.gpus(i).index() != i) {
      return bad(absl::StrCat("gpus[", i, "].index is ", desc.gpus(i).index(), ", want ", i));
    }
  }
  for (const auto& link : desc.gpu_links()) {
    if (link.gpu_a() < 0 || link.gpu_b() >= desc.gpus_size() || link.gpu_a() >= link.gpu_b()) {
      return bad(absl::StrCat("gpu_links entry (", link.gpu_a(), ", ", link.gpu_b(),
                              ") needs 0 <= gpu_a < gpu_b < ", desc.gpus_size()));
    }
  }
  std::set<std::string> names;
  for (const auto& nic : desc.nics()) {
    if (nic.name().empty()) return bad("a nic has no name");
    if (!names.insert(nic.name()).second) return bad(absl::StrCat("nic ", nic.name(), " twice"));
  }
  std::set<std::string> buses;
  for (const auto& dev : desc.pci_devices()) {
    if (!buses.insert(dev.bus_id()).second) {
      return bad(absl::StrCat("pci device ", dev.bus_id(), " twice"));
    }
  }
  for (const auto& dev : desc.pci_devices()) {
    if (!dev.parent_bus_id().empty() && buses.count(dev.parent_bus_id()) == 0) {
      return bad(
          absl::StrCat("pci device ", dev.bus_id(), " has unknown parent ", dev.parent_bus_id()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TopologyDesc> ParseTopology(const std::string& text, const std::string& name) {
  TopologyDesc desc;
  FirstError errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &desc)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ":", errors.message()));
  }
  absl::Status valid = Validate(desc, name);
  if (!valid.ok()) return valid;
  return desc;
}

absl::StatusOr<TopologyDesc> LoadTopologyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseTopology(text.str(), path);
}

std::string DumpTopology(const TopologyDesc& desc) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(desc, &text);
  return text;
}

absl::StatusOr<std::string> TopologyToJson(const TopologyDesc& desc, const TopologyGraph& graph) {
  ::kvrail::v1::TopologySnapshot snapshot;
  *snapshot.mutable_desc() = desc;
  *snapshot.mutable_graph() = graph;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;  // GPU index 0 and false flags are data too
  options.preserve_proto_field_names = true;     // same names as the textproto
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(snapshot, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("topology to JSON: ", status.ToString()));
  }
  return json;
}

}  // namespace kvrail::topology

// topo_probe: probes this machine and prints what kvrail sees.
//   topo_probe            the nvidia-smi-style matrix and kvrail's path choices
//   topo_probe --dump     the TopologyDesc as textproto (a fixture for LoadTopologyFile)
//   topo_probe --json     desc and graph as JSON
//   --sysfs=PATH          read sysfs from PATH instead of /sys
//   --file=PATH           replay a textproto instead of probing
#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "topology/topology.h"

int main(int argc, char** argv) {
  bool dump = false, json = false;
  std::string file;
  kvrail::topology::DiscoverOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--dump") {
      dump = true;
    } else if (arg == "--json") {
      json = true;
    } else if (absl::StartsWith(arg, "--sysfs=")) {
      options.sysfs_root = arg.substr(8);
    } else if (absl::StartsWith(arg, "--file=")) {
      file = arg.substr(7);
    } else {
      std::fprintf(stderr, "usage: topo_probe [--dump | --json] [--sysfs=PATH] [--file=PATH]\n");
      return 2;
    }
  }
  absl::StatusOr<kvrail::topology::TopologyDesc> desc =
      file.empty() ? kvrail::topology::Discover(options) : kvrail::topology::LoadTopologyFile(file);
  if (!desc.ok()) {
    std::fprintf(stderr, "topo_probe: %s\n", desc.status().ToString().c_str());
    return 1;
  }
  if (dump) {
    std::fputs(kvrail::topology::DumpTopology(*desc).c_str(), stdout);
    return 0;
  }
  kvrail::topology::TopologyGraph graph = kvrail::topology::ComputeGraph(*desc);
  if (json) {
    absl::StatusOr<std::string> text = kvrail::topology::TopologyToJson(*desc, graph);
    if (!text.ok()) {
      std::fprintf(stderr, "topo_probe: %s\n", text.status().ToString().c_str());
      return 1;
    }
    std::fputs(text->c_str(), stdout);
    std::fputs("\n", stdout);
    return 0;
  }
  std::fputs(kvrail::topology::RenderTopology(*desc, graph).c_str(), stdout);
  return 0;
}

#include "tools/kvrail/cli_topo.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "topology/topology.h"

namespace kvrail::client::cli {
namespace {

constexpr char kRoutesHeader[] = "\nIntra-node paths kvrail would use:\n";

// "NIC0-3,NIC7" from sorted indexes.
std::string NicRanges(const std::vector<int>& nics) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < nics.size();) {
    size_t j = i;
    while (j + 1 < nics.size() && nics[j + 1] == nics[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat("NIC", nics[i])
                           : absl::StrCat("NIC", nics[i], "-", nics[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

// One line per distinct (path, class, bandwidth, reason): the pairs that share it, or "every
// pair" when all do.
std::string CollapsedRoutes(const v1::TopologyGraph& graph) {
  using Key = std::tuple<std::string, std::string, std::string>;  // path, bandwidth, why
  std::map<Key, std::vector<std::string>> groups;
  std::vector<Key> order;
  for (const v1::GpuRoute& r : graph.routes()) {
    Key key{topology::TransferPathName(r.path()), absl::StrFormat("%.1f", r.bandwidth_gbps()),
            r.why()};
    if (groups.find(key) == groups.end()) order.push_back(key);
    groups[key].push_back(absl::StrCat("GPU", r.gpu_a(), "<->GPU", r.gpu_b()));
  }
  std::string out;
  for (const Key& key : order) {
    const std::vector<std::string>& pairs = groups[key];
    std::string who;
    if (groups.size() == 1 && pairs.size() > 1) {
      who = absl::StrCat("every pair (", pairs.size(), ")");
    } else if (pairs.size() > 6) {
      who = absl::StrCat(absl::StrJoin(pairs.begin(), pairs.begin() + 4, ", "), " and ",
                         pairs.size() - 4, " more pairs");
    } else {
      who = absl::StrJoin(pairs, ", ");
    }
    absl::StrAppend(&out, "  ", who, ": ", std::get<0>(key), ", ~", std::get<1>(key),
                    " GB/s: ", std::get<2>(key), "\n");
  }
  return out;
}

size_t LongestLine(const std::string& text) {
  size_t longest = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n'))
    longest = std::max(longest, line.size());
  return longest;
}

// Per GPU, its NICs grouped by path class ("GPU0: PIX NIC0-1 | NODE NIC2-7 | SYS NIC8-31").
std::string NicGroups(const v1::TopologyDesc& desc, const v1::TopologyGraph& graph) {
  std::string out =
      "\nGPU to NIC paths (NICs grouped by class; matrix too wide for the terminal):\n";
  for (const v1::Gpu& gpu : desc.gpus()) {
    std::map<std::string, std::vector<int>> by_class;
    std::vector<std::string> class_order;
    for (int n = 0; n < desc.nics_size(); ++n) {
      const v1::PathInfo* p = topology::FindGpuNicPath(graph, gpu.index(), desc.nics(n).name());
      const std::string cls = p ? topology::PathClassName(p->path_class(), 0) : "?";
      if (by_class.find(cls) == by_class.end()) class_order.push_back(cls);
      by_class[cls].push_back(n);
    }
    std::vector<std::string> parts;
    for (const std::string& cls : class_order)
      parts.push_back(cls + " " + NicRanges(by_class[cls]));
    absl::StrAppend(&out, "  GPU", gpu.index(), ": ", absl::StrJoin(parts, " | "), "\n");
  }
  return out;
}

std::string DotId(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

}  // namespace

std::string RenderTopo(const v1::GetTopologyResponse& response, size_t width) {
  const v1::TopologyGraph graph =
      response.has_graph() ? response.graph() : topology::ComputeGraph(response.desc());
  std::string text = topology::RenderTopology(response.desc(), graph);
  // The matrix is the block before "\nLegend:"; when it is wider than the terminal, render it
  // with GPUs only and list each GPU's NICs grouped by class instead.
  const size_t legend = text.find("\nLegend:");
  if (width > 0 && legend != std::string::npos && response.desc().nics_size() > 0 &&
      LongestLine(text.substr(0, legend)) > width) {
    v1::TopologyDesc gpus_only = response.desc();
    gpus_only.clear_nics();
    v1::TopologyGraph graph_gpus = graph;
    graph_gpus.clear_gpu_nic_paths();
    const std::string narrow = topology::RenderTopology(gpus_only, graph_gpus);
    const size_t narrow_legend = narrow.find("\nLegend:");
    const size_t legend_end = text.find("\n\n", legend + 1);  // the legend's last line
    std::string rebuilt = narrow.substr(0, narrow_legend);
    // The affinity columns belong to GPUs and NICs alike; the NIC rows reappear as groups.
    absl::StrAppend(&rebuilt, NicGroups(response.desc(), graph));
    absl::StrAppend(&rebuilt,
                    text.substr(legend, legend_end == std::string::npos ? std::string::npos
                                                                        : legend_end - legend));
    if (legend_end != std::string::npos) absl::StrAppend(&rebuilt, text.substr(legend_end));
    text = std::move(rebuilt);
  }
  const size_t routes = text.find(kRoutesHeader);
  if (routes != std::string::npos && graph.routes_size() > 0) {
    const size_t begin = routes + sizeof(kRoutesHeader) - 1;
    size_t end = begin;
    while (end < text.size() && text.compare(end, 2, "  ") == 0) {
      end = text.find('\n', end);
      end = end == std::string::npos ? text.size() : end + 1;
    }
    text = absl::StrCat(text.substr(0, begin), CollapsedRoutes(graph), text.substr(end));
  }
  return absl::StrCat("source: ", response.source().empty() ? "?" : response.source(), "\n", text);
}

std::string RenderTopoDot(const v1::GetTopologyResponse& response) {
  const v1::TopologyDesc& desc = response.desc();
  const v1::TopologyGraph graph =
      response.has_graph() ? response.graph() : topology::ComputeGraph(desc);
  std::string out =
      absl::StrCat("graph ", DotId(desc.hostname().empty() ? "kvrail" : desc.hostname()),
                   " {\n  graph [overlap=false, splines=true];\n");
  std::map<int, std::vector<std::string>> by_numa;
  for (const v1::Gpu& g : desc.gpus()) {
    by_numa[g.numa_node()].push_back(absl::StrCat(
        "    ", DotId(absl::StrCat("GPU", g.index())),
        " [shape=box, label=", DotId(absl::StrCat("GPU", g.index(), "\\n", g.name())), "];\n"));
  }
  for (int n = 0; n < desc.nics_size(); ++n) {
    const v1::Nic& nic = desc.nics(n);
    by_numa[nic.numa_node()].push_back(absl::StrCat(
        "    ", DotId(nic.name()), " [shape=ellipse, label=",
        DotId(absl::StrCat("NIC", n, "\\n", nic.name(), "\\n", nic.link_speed_gbps(), " Gb/s")),
        "];\n"));
  }
  for (const auto& [numa, nodes] : by_numa) {
    absl::StrAppend(&out, "  subgraph ", DotId(absl::StrCat("cluster_numa", numa < 0 ? 999 : numa)),
                    " {\n    label=", DotId(numa < 0 ? "NUMA n/a" : absl::StrCat("NUMA ", numa)),
                    ";\n");
    for (const std::string& node : nodes) out += node;
    out += "  }\n";
  }
  for (const v1::PathInfo& p : graph.gpu_pairs()) {
    const bool nvlink = p.path_class() == v1::PATH_NV;
    const bool p2p = p.path_class() == v1::PATH_PIX || p.path_class() == v1::PATH_PXB;
    if (!nvlink && !p2p) continue;  // host-staged pairs: no direct edge
    absl::StrAppend(&out, "  ", DotId(p.a()), " -- ", DotId(p.b()), " [label=",
                    DotId(absl::StrFormat("%s %.0f GB/s",
                                          topology::PathClassName(p.path_class(), p.nvlink_count()),
                                          p.bandwidth_gbps())),
                    nvlink ? ", penwidth=2" : ", style=dashed", "];\n");
  }
  for (const v1::NearestNics& nearest : graph.nearest_nics()) {
    for (const std::string& nic : nearest.nics()) {
      absl::StrAppend(&out, "  ", DotId(absl::StrCat("GPU", nearest.gpu())), " -- ", DotId(nic),
                      " [label=", DotId(topology::PathClassName(nearest.path_class(), 0)),
                      ", color=gray40];\n");
    }
  }
  out += "}\n";
  return out;
}

size_t TerminalWidth() {
  struct winsize ws {};
  if (::isatty(STDOUT_FILENO) == 1 && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 &&
      ws.ws_col > 0) {
    return ws.ws_col;
  }
  if (::isatty(STDOUT_FILENO) != 1) return 0;
  const char* columns = std::getenv("COLUMNS");
  return columns != nullptr ? static_cast<size_t>(std::atoi(columns)) : 0;
}

}  // namespace kvrail::client::cli

// `kvrail topo` rendering beyond topology::RenderTopology: identical GPU pairs collapsed into one
// line, the matrix fitted to the terminal's width (NIC columns become per-GPU NIC groups when
// they do not fit: p5's 32 NICs), and a Graphviz DOT export. Pure functions; internal to the CLI.
#pragma once

#include <string>

#include "proto/kvrail/v1/admin.pb.h"

namespace kvrail::client::cli {

// The text `kvrail topo` prints; `width` is the terminal's width in columns (0: unlimited).
std::string RenderTopo(const v1::GetTopologyResponse& response, size_t width);

// `kvrail topo --dot`: an undirected graph; GPUs (boxes) and NICs (ellipses) clustered by NUMA
// node, GPU pairs joined by NVLink or PCIe P2P edges labelled with their class and bandwidth,
// and each GPU joined to its nearest NICs (its rail).
std::string RenderTopoDot(const v1::GetTopologyResponse& response);

// The terminal's width from stdout (TIOCGWINSZ), else $COLUMNS, else 0 (not a terminal).
size_t TerminalWidth();

}  // namespace kvrail::client::cli

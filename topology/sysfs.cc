// sysfs sources: NUMA nodes and sockets, NVIDIA PCI functions, NICs and the PCIe tree.
// Everything is read below DiscoverOptions.sysfs_root so tests can replay a fake tree; a missing
// file or folder means "not known", never an error.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "topology/discover_internal.h"

namespace kvrail::topology::internal {
namespace {

namespace fs = std::filesystem;
using ::kvrail::v1::Nic;
using ::kvrail::v1::NicKind;
using ::kvrail::v1::PciDevice;
using ::kvrail::v1::PciKind;
using ::kvrail::v1::TopologyDesc;

// The file's content without surrounding white space, or "" when it cannot be read.
std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(ss.str()));
}

int ReadInt(const fs::path& path, int fallback) {
  int value = 0;
  std::string text = ReadText(path);
  return absl::SimpleAtoi(text, &value) ? value : fallback;
}

// Sorted entry names of a folder; empty when it does not exist.
std::vector<std::string> ListDir(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Where a sysfs symlink leads, or "" when it does not resolve.
fs::path Resolve(const fs::path& link) {
  std::error_code ec;
  fs::path real = fs::canonical(link, ec);
  return ec ? fs::path() : real;
}

// The last PCI address among the components of a resolved device path ("" when none): a
// virtio net device resolves to .../0000:00:03.0/virtio0, and its PCI function is 0000:00:03.0.
std::string LastBusId(const fs::path& real) {
  std::string last;
  for (const auto& part : real) {
    if (IsBusId(part.string())) last = part.string();
  }
  return last;
}

// Parses the kernel's cpulist syntax "0-3,8,10-11".
std::vector<int> ParseCpuList(const std::string& text) {
  std::vector<int> cpus;
  for (absl::string_view range : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<std::string> ends = absl::StrSplit(range, '-');
    int lo = 0, hi = 0;
    if (!absl::SimpleAtoi(ends[0], &lo)) continue;
    hi = lo;
    if (ends.size() > 1 && !absl::SimpleAtoi(ends[1], &hi)) continue;
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  return cpus;
}

// "32.0 GT/s PCIe" -> 5. The generation follows from the per-lane signalling rate.
int LinkGenFromSpeed(const std::string& text) {
  double gts = std::strtod(text.c_str(), nullptr);
  if (gts >= 60) return 6;
  if (gts >= 30) return 5;
  if (gts >= 15) return 4;
  if (gts >= 7) return 3;
  if (gts >= 4) return 2;
  if (gts >= 2) return 1;
  return 0;
}

// "0x030200" -> "030200".
std::string HexField(const fs::path& path) {
  std::string text = absl::AsciiStrToLower(ReadText(path));
  if (text.rfind("0x", 0) == 0) text.erase(0, 2);
  return text;
}

// The PCIe port type from the PCI Express capability in config space (bits 7:4 of the
// capabilities register), or -1 when config space is not readable that far (non-root reads
// only the first 64 bytes).
int PortTypeFromConfig(const fs::path& config) {
  std::ifstream in(config, std::ios::binary);
  if (!in) return -1;
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto byte = [&](size_t i) -> int { return i < bytes.size() ? (uint8_t)bytes[i] : -1; };
  if (byte(0x06) < 0 || !(byte(0x06) & 0x10)) return -1;  // no capability list
  int ptr = byte(0x34);
  for (int hops = 0; ptr >= 0x40 && hops < 48; ++hops) {
    int id = byte(ptr), next = byte(ptr + 1);
    if (id < 0 || next < 0) return -1;
    if (id == 0x10) {
      int reg = byte(ptr + 2);
      return reg < 0 ? -1 : (reg >> 4) & 0xF;
    }
    ptr = next & 0xFC;
  }
  return -1;
}

PciKind KindFromPortType(int type) {
  switch (type) {
    case 0:
    case 1:
    case 9:
      return PciKind::PCI_KIND_ENDPOINT;
    case 4:
      return PciKind::PCI_KIND_ROOT_PORT;
    case 5:
      return PciKind::PCI_KIND_SWITCH_UPSTREAM;
    case 6:
      return PciKind::PCI_KIND_SWITCH_DOWNSTREAM;
    case 7:
    case 8:
      return PciKind::PCI_KIND_BRIDGE;
    default:
      return PciKind::PCI_KIND_UNSPECIFIED;
  }
}

// Without config space: a bridge straight under the host bridge is a root port, a bridge under
// a root port or a downstream port is a switch's upstream port, a bridge under an upstream port
// is a downstream port. Non-bridges are endpoints.
PciKind KindFromShape(const std::string& class_code, PciKind parent_kind, bool has_parent) {
  if (class_code.rfind("0604", 0) != 0) return PciKind::PCI_KIND_ENDPOINT;
  if (!has_parent) return PciKind::PCI_KIND_ROOT_PORT;
  if (parent_kind == PciKind::PCI_KIND_ROOT_PORT ||
      parent_kind == PciKind::PCI_KIND_SWITCH_DOWNSTREAM) {
    return PciKind::PCI_KIND_SWITCH_UPSTREAM;
  }
  if (parent_kind == PciKind::PCI_KIND_SWITCH_UPSTREAM) {
    return PciKind::PCI_KIND_SWITCH_DOWNSTREAM;
  }
  return PciKind::PCI_KIND_BRIDGE;
}

// Leading number of "400 Gb/sec (4X NDR)".
double ParseRateGbps(const std::string& text) { return std::strtod(text.c_str(), nullptr); }

std::string DriverOf(const fs::path& device) {
  fs::path real = Resolve(device / "driver");
  return real.empty() ? "" : real.filename().string();
}

}  // namespace

bool IsBusId(std::string_view s) {
  // dddd[d]:bb:dd.f
  size_t colon = s.find(':');
  if (colon == std::string_view::npos || colon < 4) return false;
  std::string_view rest = s.substr(colon + 1);
  if (rest.size() != 7 || rest[2] != ':' || rest[5] != '.') return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == colon || i == colon + 3 || i == colon + 6) continue;
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

std::string NormalizeBusId(std::string_view bus_id) {
  std::string id = absl::AsciiStrToLower(
      absl::StripAsciiWhitespace(absl::string_view(bus_id.data(), bus_id.size())));
  std::vector<std::string> parts = absl::StrSplit(id, ':');
  if (parts.size() == 2) return absl::StrCat("0000:", id);
  if (parts.size() != 3) return id;
  std::string domain = parts[0];
  while (domain.size() > 4 && domain[0] == '0') domain.erase(0, 1);
  while (domain.size() < 4) domain.insert(0, "0");
  return absl::StrCat(domain, ":", parts[1], ":", parts[2]);
}

void ProbeNumaAndSockets(const std::string& root, TopologyDesc* desc) {
  const fs::path cpu_dir = fs::path(root) / "devices/system/cpu";
  auto socket_of_cpu = [&](int cpu) {
    return ReadInt(cpu_dir / absl::StrCat("cpu", cpu) / "topology/physical_package_id", -1);
  };
  const fs::path node_dir = fs::path(root) / "devices/system/node";
  for (const std::string& name : ListDir(node_dir)) {
    int id = 0;
    if (name.rfind("node", 0) != 0 || !absl::SimpleAtoi(name.substr(4), &id)) continue;
    auto* node = desc->add_numa_nodes();
    node->set_id(id);
    node->set_cpulist(ReadText(node_dir / name / "cpulist"));
    std::vector<int> cpus = ParseCpuList(node->cpulist());
    node->set_socket(cpus.empty() ? -1 : socket_of_cpu(cpus.front()));
    std::istringstream meminfo(ReadText(node_dir / name / "meminfo"));
    for (std::string line; std::getline(meminfo, line);) {
      size_t at = line.find("MemTotal:");
      if (at == std::string::npos) continue;
      uint64_t kb = std::strtoull(line.c_str() + at + 9, nullptr, 10);
      node->set_memory_bytes(kb * 1024);
    }
    for (absl::string_view d :
         absl::StrSplit(ReadText(node_dir / name / "distance"), ' ', absl::SkipEmpty())) {
      int v = 0;
      if (absl::SimpleAtoi(d, &v)) node->add_distances(v);
    }
  }
  std::sort(desc->mutable_numa_nodes()->begin(), desc->mutable_numa_nodes()->end(),
            [](const auto& x, const auto& y) { return x.id() < y.id(); });
  // Sockets: count online CPUs per physical package.
  std::map<int, int> cpus_per_socket;
  for (const std::string& name : ListDir(cpu_dir)) {
    int cpu = 0;
    if (name.rfind("cpu", 0) != 0 || !absl::SimpleAtoi(name.substr(3), &cpu)) continue;
    int socket = socket_of_cpu(cpu);
    if (socket >= 0) ++cpus_per_socket[socket];
  }
  for (const auto& [id, count] : cpus_per_socket) {
    auto* socket = desc->add_sockets();
    socket->set_id(id);
    socket->set_cpu_count(count);
    for (const auto& node : desc->numa_nodes()) {
      if (node.socket() == id) socket->add_numa_nodes(node.id());
    }
  }
}

void ProbeSysfsGpus(const std::string& root, GpuFacts* facts) {
  const fs::path pci = fs::path(root) / "bus/pci/devices";
  for (const std::string& name : ListDir(pci)) {
    if (!IsBusId(name)) continue;
    // NVIDIA (0x10de) VGA (0x0300) or 3D (0x0302) controllers; NVSwitches are class 0x0680.
    if (HexField(pci / name / "vendor") != "10de") continue;
    std::string cls = HexField(pci / name / "class");
    if (cls.rfind("0300", 0) != 0 && cls.rfind("0302", 0) != 0) continue;
    auto* gpu = FindOrAddGpu(facts, NormalizeBusId(name));
    if (gpu->name().empty()) {
      gpu->set_name(absl::StrCat("NVIDIA device ", HexField(pci / name / "device")));
    }
    gpu->set_numa_node(ReadInt(pci / name / "numa_node", -1));
    AddSource(gpu, "sysfs");
  }
}

void ProbeNics(const std::string& root, TopologyDesc* desc) {
  std::set<std::string> rdma_buses;
  const fs::path ib = fs::path(root) / "class/infiniband";
  const fs::path pci = fs::path(root) / "bus/pci/devices";
  for (const std::string& name : ListDir(ib)) {
    fs::path device = ib / name / "device";
    std::string bus = LastBusId(Resolve(device));
    if (bus.empty()) continue;
    Nic nic;
    nic.set_name(name);
    nic.set_pci_bus_id(NormalizeBusId(bus));
    nic.set_numa_node(ReadInt(pci / bus / "numa_node", -1));
    nic.set_rdma_capable(true);
    nic.set_driver(DriverOf(device));
    std::vector<std::string> ports = ListDir(ib / name / "ports");
    std::string link_layer;
    if (!ports.empty()) {
      link_layer = ReadText(ib / name / "ports" / ports.front() / "link_layer");
      nic.set_link_speed_gbps(
          ParseRateGbps(ReadText(ib / name / "ports" / ports.front() / "rate")));
    }
    if (nic.driver() == "efa" || name.rfind("efa", 0) == 0 || name.rfind("rdmap", 0) == 0) {
      nic.set_kind(NicKind::NIC_KIND_EFA);
    } else if (link_layer == "Ethernet") {
      nic.set_kind(NicKind::NIC_KIND_ROCE);
    } else {
      nic.set_kind(NicKind::NIC_KIND_INFINIBAND);
    }
    std::vector<std::string> netdevs = ListDir(device / "net");
    if (!netdevs.empty()) nic.set_netdev(netdevs.front());
    rdma_buses.insert(nic.pci_bus_id());
    *desc->add_nics() = std::move(nic);
  }
  const fs::path net = fs::path(root) / "class/net";
  for (const std::string& name : ListDir(net)) {
    fs::path device = net / name / "device";
    std::string bus = LastBusId(Resolve(device));
    if (bus.empty()) continue;  // virtual interfaces (lo, bridges, veth) have no PCI function
    if (rdma_buses.count(NormalizeBusId(bus)) != 0) continue;  // already listed as RDMA device
    Nic nic;
    nic.set_name(name);
    nic.set_netdev(name);
    nic.set_pci_bus_id(NormalizeBusId(bus));
    nic.set_numa_node(ReadInt(pci / bus / "numa_node", -1));
    nic.set_kind(NicKind::NIC_KIND_ETHERNET);
    nic.set_driver(DriverOf(device));
    int mbps = ReadInt(net / name / "speed", -1);  // -1 or unreadable when down or unknown
    if (mbps > 0) nic.set_link_speed_gbps(mbps / 1000.0);
    *desc->add_nics() = std::move(nic);
  }
}

absl::Status BuildPciTree(const std::string& root, TopologyDesc* desc) {
  const fs::path pci = fs::path(root) / "bus/pci/devices";
  std::map<std::string, std::string> labels;  // bus id -> "GPU0" / NIC name
  for (const auto& gpu : desc->gpus()) labels[gpu.pci_bus_id()] = absl::StrCat("GPU", gpu.index());
  for (const auto& nic : desc->nics()) {
    std::string& label = labels[nic.pci_bus_id()];
    label = label.empty() ? nic.name() : absl::StrCat(label, ",", nic.name());
  }
  std::map<std::string, int> index_of;  // bus id -> position in desc->pci_devices
  std::map<std::string, int> numa_of;
  for (const auto& [bus, label] : labels) {
    // sysfs names the domain with 4 digits; a normalized id matches it.
    fs::path real = Resolve(pci / bus);
    if (real.empty()) {
      desc->add_notes(absl::StrCat("sysfs: PCI device ", bus, " (", label,
                                   ") not found; its PCIe path is unknown"));
      continue;
    }
    std::string host_bridge, parent;
    fs::path walked;
    for (const auto& part : real) {
      walked /= part;
      std::string p = part.string();
      if (p.rfind("pci", 0) == 0 && p.find(':') != std::string::npos && !IsBusId(p)) {
        host_bridge = p;
        parent.clear();
        continue;
      }
      if (!IsBusId(p) || host_bridge.empty()) continue;
      std::string id = NormalizeBusId(p);
      if (index_of.count(id) == 0) {
        PciDevice dev;
        dev.set_bus_id(id);
        dev.set_parent_bus_id(parent);
        dev.set_host_bridge(host_bridge);
        dev.set_vendor_id(HexField(walked / "vendor"));
        dev.set_device_id(HexField(walked / "device"));
        dev.set_class_code(HexField(walked / "class"));
        dev.set_numa_node(ReadInt(walked / "numa_node", -1));
        dev.set_link_gen(LinkGenFromSpeed(ReadText(walked / "current_link_speed")));
        dev.set_link_width(ReadInt(walked / "current_link_width", 0));
        PciKind kind = KindFromPortType(PortTypeFromConfig(walked / "config"));
        if (kind == PciKind::PCI_KIND_UNSPECIFIED) {
          PciKind parent_kind = parent.empty() ? PciKind::PCI_KIND_UNSPECIFIED
                                               : desc->pci_devices(index_of[parent]).kind();
          kind = KindFromShape(dev.class_code(), parent_kind, !parent.empty());
        }
        dev.set_kind(kind);
        auto it = labels.find(id);
        if (it != labels.end()) dev.set_label(it->second);
        index_of[id] = desc->pci_devices_size();
        numa_of[id] = dev.numa_node();
        *desc->add_pci_devices() = std::move(dev);
      }
      parent = id;
    }
  }
  for (auto& gpu : *desc->mutable_gpus()) {
    if (gpu.numa_node() < 0 && numa_of.count(gpu.pci_bus_id())) {
      gpu.set_numa_node(numa_of[gpu.pci_bus_id()]);
    }
  }
  for (auto& nic : *desc->mutable_nics()) {
    if (nic.numa_node() < 0 && numa_of.count(nic.pci_bus_id())) {
      nic.set_numa_node(numa_of[nic.pci_bus_id()]);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvrail::topology::internal

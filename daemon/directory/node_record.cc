#include "daemon/directory/node_record.h"

#include "absl/strings/str_cat.h"

namespace kvrail::directory {

v1::DirectoryNodeRecord BuildNodeRecord(const NodeRecordInputs& in) {
  v1::DirectoryNodeRecord record;
  record.set_node_id(in.node_id);
  record.set_address(in.address);
  record.set_instance_id(in.instance_id);
  record.set_boot_id(BootIdFromInstance(in.instance_id));
  record.set_build_info(in.build_info);
  record.set_registered_unix_us(absl::ToUnixMicros(in.now));
  for (const std::string& address : in.fabric_addresses) record.add_fabric_addresses(address);
  for (const v1::Nic& nic : in.topology.nics()) {
    v1::DirectoryNic* out = record.add_nics();
    out->set_name(nic.name());
    out->set_pci_bus_id(nic.pci_bus_id());
    out->set_numa_node(nic.numa_node());
    out->set_link_speed_gbps(nic.link_speed_gbps());
    out->set_rdma_capable(nic.rdma_capable());
    for (const v1::Rail& rail : in.graph.rails()) {
      for (const std::string& name : rail.nics()) {
        if (name == nic.name()) out->add_rails(rail.index());
      }
    }
  }
  for (const v1::Gpu& gpu : in.topology.gpus()) {
    v1::DirectoryGpu* out = record.add_gpus();
    out->set_uuid(gpu.uuid());
    out->set_index(gpu.index());
    out->set_name(gpu.name());
    out->set_pci_bus_id(gpu.pci_bus_id());
  }
  return record;
}

uint64_t BootIdFromInstance(const std::string& instance_id) {
  uint64_t id = 0;
  int digits = 0;
  for (char c : instance_id) {
    int v;
    if (c >= '0' && c <= '9') {
      v = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      v = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      v = c - 'A' + 10;
    } else {
      continue;
    }
    id = (id << 4) | static_cast<uint64_t>(v);
    if (++digits == 16) break;
  }
  return id;
}

std::string EncodeNodeRecord(const v1::DirectoryNodeRecord& record) {
  std::string out;
  record.SerializeToString(&out);
  return out;
}

std::string NodeIdFromKey(std::string_view prefix, std::string_view key) {
  if (key.size() <= prefix.size() || key.substr(0, prefix.size()) != prefix) return "";
  std::string_view id = key.substr(prefix.size());
  if (id.find('/') != std::string_view::npos) return "";
  return std::string(id);
}

namespace {

bool IsHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return false;
  if (address.size() > 300) return false;
  for (size_t i = colon + 1; i < address.size(); ++i) {
    if (address[i] < '0' || address[i] > '9') return false;
  }
  return address.size() - colon - 1 <= 5;
}

}  // namespace

absl::StatusOr<v1::DirectoryNodeRecord> DecodeNodeRecord(std::string_view prefix,
                                                         std::string_view key,
                                                         std::string_view value) {
  const std::string node_id = NodeIdFromKey(prefix, key);
  if (node_id.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("key: not the prefix '", std::string(prefix), "' followed by one node id"));
  }
  if (value.size() > kMaxRecordBytes) {
    return absl::InvalidArgumentError(absl::StrCat("record of '", node_id, "': ", value.size(),
                                                   " bytes, more than ", kMaxRecordBytes));
  }
  v1::DirectoryNodeRecord record;
  if (!record.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("record of '", node_id, "': not a kvrail.v1.DirectoryNodeRecord"));
  }
  if (record.node_id() != node_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "record of '", node_id, "': node_id names another node (the key's node id must match)"));
  }
  if (!IsHostPort(record.address())) {
    return absl::InvalidArgumentError(
        absl::StrCat("record of '", node_id, "': address is not host:port"));
  }
  if (record.nics_size() > kMaxRecordEntries || record.gpus_size() > kMaxRecordEntries ||
      record.fabric_addresses_size() > kMaxRecordEntries) {
    return absl::InvalidArgumentError(absl::StrCat("record of '", node_id, "': more than ",
                                                   kMaxRecordEntries,
                                                   " nics, gpus or fabric_addresses"));
  }
  return record;
}

}  // namespace kvrail::directory

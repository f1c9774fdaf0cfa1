// The etcd directory's node record: built from what the daemon already knows (its topology, its
// Peer address, its instance), encoded as binary protobuf (v1::DirectoryNodeRecord) under the key
// prefix + node_id, and decoded with bounds (an etcd value is whatever anyone with write access
// put there).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/kvrail/v1/admin.pb.h"
#include "proto/kvrail/v1/topology.pb.h"

namespace kvrail::directory {

// Largest record value accepted (bytes) and the most NICs, GPUs and fabric addresses in one.
inline constexpr size_t kMaxRecordBytes = 64 << 10;
inline constexpr int kMaxRecordEntries = 256;

struct NodeRecordInputs {
  std::string node_id;
  std::string address;  // the Peer address other daemons dial
  std::string instance_id;
  std::string build_info;
  std::vector<std::string> fabric_addresses;
  v1::TopologyDesc topology;
  v1::TopologyGraph graph;  // its rails say which NIC serves which GPU
  absl::Time now;
};

// The record: NICs with the rails they serve, GPUs by UUID, boot id from the instance id.
v1::DirectoryNodeRecord BuildNodeRecord(const NodeRecordInputs& in);

// Changes each time kvraild starts: the first 16 hex digits of the instance id (0 when there
// are none).
uint64_t BootIdFromInstance(const std::string& instance_id);

std::string EncodeNodeRecord(const v1::DirectoryNodeRecord& record);

// The node id a key under `prefix` names ("" when the key is not prefix + one segment).
std::string NodeIdFromKey(std::string_view prefix, std::string_view key);

// Decodes the value of `key` (under `prefix`). INVALID_ARGUMENT naming what is wrong: a key that
// is not prefix + node id, a value over kMaxRecordBytes or that does not parse, a record whose
// node_id differs from its key's, an address that is not host:port, too many entries.
absl::StatusOr<v1::DirectoryNodeRecord> DecodeNodeRecord(std::string_view prefix,
                                                         std::string_view key,
                                                         std::string_view value);

}  // namespace kvrail::directory

// The fabric module: kvrail between nodes. One libfabric RDM endpoint per NIC (tcp;ofi_rxm here;
// verbs;ofi_rxm and efa by name), staging registered once at start, a command ring and a proxy
// thread per NIC, the sender engine (packs tiles into staging slots, writes 32-byte commands),
// the receiver (scatters arriving tiles into the destination layout, returns slot credits), the
// Peer gRPC service (hello, leases, liveness, remote transfer control) and the heartbeat loop
// that fails transfers of a dead peer with UNAVAILABLE. See docs/fabric.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/directory/directory.h"
#include "daemon/regions/regions.h"
#include "daemon/transfers/remote_path.h"

namespace grpc {
class Service;
}

namespace kvrail::fabric {

struct FabricOptions {
  std::string node_id;
  std::string software_version;
  // libfabric provider: "tcp;ofi_rxm" (default), "verbs;ofi_rxm", "efa".
  std::string provider = "tcp;ofi_rxm";
  // One NIC (endpoint) per entry: the local IPv4 address it binds. Several entries with the same
  // address are several endpoints on one link (striping over tcp).
  std::vector<std::string> nic_addresses;
  // Staging per (peer, NIC): `slots` send and `slots` receive slots of `slot_bytes` (the largest
  // tile), registered once at start. slots <= 256.
  uint32_t slots = 16;
  uint64_t slot_bytes = 4 << 20;
  // Posted writes in flight per NIC.
  uint32_t max_inflight = 64;
  // Threads packing (sender) and scattering (receiver) tiles.
  int pack_threads = 2;
  int unpack_threads = 2;
  absl::Duration heartbeat_interval = absl::Milliseconds(300);
  // A peer silent this long is down: its transfers fail with UNAVAILABLE.
  absl::Duration liveness_timeout = absl::Seconds(3);
  // For Hello ("1 GPU, 2 NICs").
  std::string topology_summary;
};

// Thread-safe. Destroy after the transfer manager has drained and the gRPC server has stopped.
class Fabric : public transfers::RemotePath {
 public:
  // Opens the NICs, registers staging, starts proxy, packing and unpacking threads. Peers come
  // from `directory` (its order fixes each peer's index). Errors name the config key
  // ("fabric.provider: ...", "fabric.nics: ...").
  static absl::StatusOr<std::unique_ptr<Fabric>> Create(const FabricOptions& options,
                                                        regions::RegionTable* regions,
                                                        directory::Directory* directory);
  ~Fabric() override = default;

  // The Peer gRPC service, to serve on the daemon's listen addresses.
  virtual grpc::Service* peer_service() = 0;
  // Starts the heartbeat loop (call once the server is listening).
  virtual void StartLiveness() = 0;
  // "fabric: tcp;ofi_rxm, 2 NICs (nic0@10.0.0.1, nic1@10.0.0.1), 16 x 4 MiB slots per peer".
  virtual std::string Describe() const = 0;
  // Where inbound transfers are recorded (the TransferManager), so they are listed and watched on
  // this node too; nullptr detaches it (before the sink is destroyed). Thread-safe.
  virtual void SetInboundSink(transfers::InboundSink* sink) = 0;
};

}  // namespace kvrail::fabric

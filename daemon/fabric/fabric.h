// The fabric module: kvrail between nodes. One libfabric RDM endpoint per NIC (tcp;ofi_rxm here;
// verbs;ofi_rxm and efa by name), staging registered per peer as peers join (from the directory), a
// command ring and a proxy thread per NIC, the sender engine (packs tiles into staging slots,
// writes 32-byte commands), the receiver (scatters arriving tiles into the destination layout,
// returns slot credits), the Peer gRPC service (hello, leases, liveness, remote transfer control)
// and the heartbeat loop that fails transfers of a dead peer with UNAVAILABLE. See docs/fabric.md.
// This header is the module's public interface; the parts behind it (lanes.h, sender.h, receiver.h,
// peer_control.h, peer_service.h) are private to the package.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/access/access.h"
#include "daemon/directory/directory.h"
#include "daemon/fabric/fabric_options.h"  // FabricOptions
#include "daemon/regions/regions.h"
#include "daemon/transfers/remote_path.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace grpc {
class Service;
}

namespace kvrail::fabric {

// Thread-safe. Destroy after the transfer manager has drained and the gRPC server has stopped.
class Fabric : public transfers::RemotePath {
 public:
  // Opens the NICs, starts proxy, packing and unpacking threads, and adds the directory's peers
  // (staging registered for each). Peers the directory lists later are added by the liveness
  // round (each gets the next index); `directory` may be empty at start. Errors name the config
  // key ("fabric.provider: ...", "fabric.nics: ...").
  // `grants` decide which tenant of a peer node may write a region. All outlive the fabric.
  static absl::StatusOr<std::unique_ptr<Fabric>> Create(const FabricOptions& options,
                                                        regions::RegionTable* regions,
                                                        const access::Grants* grants,
                                                        directory::Directory* directory);
  ~Fabric() override = default;

  // The Peer gRPC service, to serve on the daemon's listen addresses.
  virtual grpc::Service* peer_service() = 0;
  // Lets node `peer_node` (in the directory) write region `region_id` and returns its lease
  // (what the peer's GetLease reads). Whether the caller may is the caller's check
  // (Transfer.ExportRegion: the region's owner session). Errors name the field.
  virtual absl::StatusOr<v1::RegionLease> ExportRegion(uint64_t region_id,
                                                       const std::string& peer_node) = 0;
  // Starts the heartbeat loop (call once the server is listening).
  virtual void StartLiveness() = 0;
  // "fabric: tcp;ofi_rxm, 2 NICs (nic0@10.0.0.1, nic1@10.0.0.1), 16 x 4 MiB slots per peer".
  virtual std::string Describe() const = 0;
  // Where inbound transfers are recorded (the TransferManager), so they are listed and watched on
  // this node too; nullptr detaches it (before the sink is destroyed). Thread-safe.
  virtual void SetInboundSink(transfers::InboundSink* sink) = 0;
};

}  // namespace kvrail::fabric

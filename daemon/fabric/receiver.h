// Internal to the fabric module: the receiving side of remote transfers. BeginRemoteTransfer
// (the same plan as the sender's, against the exported destination, and a handle), the unpacking
// threads (checks, then UnpackTile from the receive slot into the destination layout, then the
// slot's credit back to the sender), End/Abort, and this node's record of each inbound transfer
// (InboundSink).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/access/access.h"
#include "daemon/fabric/fabric_options.h"
#include "daemon/fabric/lanes.h"
#include "daemon/fabric/leases.h"
#include "daemon/fabric/peers.h"
#include "daemon/regions/regions.h"
#include "daemon/transfers/remote_path.h"
#include "proto/kvrail/peer/v1/peer.pb.h"

namespace kvrail::fabric {

namespace peer_v1 = ::kvrail::peer::v1;

// Thread contract: thread-safe. Threads of its own: `unpack_threads` unpackers. Arrivals come on
// the lanes' proxy threads (ArrivalSink), Begin/End on gRPC threads.
class Receiver : public ArrivalSink {
 public:
  // Starts the unpackers. The arguments outlive the receiver.
  static std::unique_ptr<Receiver> Create(const FabricOptions& options, Lanes* lanes,
                                          PeerTable* peers, const Leases* leases,
                                          regions::RegionTable* regions,
                                          const access::Grants* grants);

  // A transfer from `request.sender_node_id` into an exported region: `response` gets its handle
  // (what the sender's tile writes name) and, for the sender's rail-aware lane choice, the
  // destination's GPU UUID when the region is GPU memory (empty otherwise: the sender then keeps
  // every lane). Errors name the request field.
  virtual absl::Status Begin(const peer_v1::BeginRemoteTransferRequest& request,
                             peer_v1::BeginRemoteTransferResponse* response) = 0;
  // The sender ended (`abort`: aborted, with `why`) transfer `handle`; returns the tiles applied.
  virtual absl::StatusOr<uint32_t> End(const std::string& sender, uint32_t handle, bool abort,
                                       const std::string& why) = 0;
  // Drops every inbound transfer from `peer` (down or restarted); their records fail.
  virtual void DropPeer(PeerConn* peer, const absl::Status& why) = 0;
  // Whether an inbound transfer from `peer` is still open here (its index is not reclaimed before).
  virtual bool HasTransfers(const PeerConn* peer) const = 0;
  // Where inbound transfers are recorded; nullptr detaches it.
  virtual void SetInboundSink(transfers::InboundSink* sink) = 0;
  // Stops and joins the unpackers; arrivals afterwards are not applied.
  virtual void Stop() = 0;
  // Arrivals refused so far: their immediate data named a peer whose seal (or transfer, handle,
  // tile) does not show it sent them. Neither applied nor credited.
  virtual uint64_t refused_arrivals() const = 0;
};

}  // namespace kvrail::fabric

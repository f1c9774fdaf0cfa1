// The interfaces between the transfers module and the fabric: the sending path (RemotePath) and
// the receiving side's sink (InboundSink). A small target of its own so the fabric depends on
// these two interfaces, not on the transfer manager.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/engine/engine.h"
#include "daemon/planner/planner.h"
#include "daemon/regions/regions.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::transfers {

// The inter-node path (PATH_FABRIC), implemented by daemon/fabric. Thread-safe.
class RemotePath {
 public:
  virtual ~RemotePath() = default;
  struct Prepared {
    // Stand-in for the leased remote destination (data() is null; view() is the lease's).
    std::shared_ptr<regions::Region> dst;
    // Runs the record's tiles (packs, posts, completes on the peer's credit).
    engine::Engine* engine = nullptr;
    // Plan with tiles of at most this size (the staging slot size).
    uint64_t max_tile_bytes = 0;
  };
  // Checks the peer (known, up) and fetches the lease of spec.dst.region_id exported to this
  // node. Errors name the field ("spec.dst.node_id: ...").
  virtual absl::StatusOr<Prepared> Prepare(const v1::TransferSpec& spec) = 0;
  // Announces the planned transfer to the peer and binds `job` (created with Prepared.engine) to
  // it; returns the NICs it will use. Tiles are enqueued only after this returns OK.
  virtual absl::StatusOr<std::vector<std::string>> Begin(
      uint64_t id, const v1::TransferSpec& spec, const regions::Region& src, uint64_t tile_bytes,
      const std::shared_ptr<engine::Job>& job) = 0;
  // The engine that runs the fabric's tiles, for stats and metrics (its gauges: lane failover's
  // counters and lane states); nullptr when there is none to show.
  virtual const engine::Engine* engine() const { return nullptr; }
};

// The job an inbound transfer's tiles report to (InboundSink::Admitted.job). Thread-safe.
class InboundJob : public engine::Job {
 public:
  // True once this node's record of the transfer has ended (EndInbound, a drain, a failure).
  // Tiles landing afterwards should be dropped by the caller rather than reported; a report that
  // comes anyway changes nothing (it is ignored, never counted twice).
  virtual bool Ended() const = 0;
};

// The receiving side of PATH_FABRIC, called by daemon/fabric: a transfer another node writes into
// one of this node's regions is listed, waited on, watched and counted here like a local one.
// Thread-safe.
class InboundSink {
 public:
  virtual ~InboundSink() = default;
  struct Admitted {
    uint64_t id = 0;  // this node's transfer id
    // Report each tile as it lands (OnTileStart, then OnTileDone) while !job->Ended(); the
    // record succeeds when every tile has landed.
    std::shared_ptr<InboundJob> job;
  };
  // `source` stands in for the sender's region (no local address); `dst` is the region written.
  // UNAVAILABLE while draining.
  virtual absl::StatusOr<Admitted> BeginInbound(const v1::TransferSpec& spec,
                                                const planner::Plan& plan,
                                                std::shared_ptr<regions::Region> source,
                                                std::shared_ptr<regions::Region> dst,
                                                const std::string& sender_node,
                                                uint64_t sender_transfer_id) = 0;
  // Ends an inbound transfer that will get no more tiles (aborted by the sender, the sender lost,
  // or ended short) with `why`; a no-op once it has ended. Afterwards Admitted.job->Ended().
  virtual void EndInbound(uint64_t id, const absl::Status& why) = 0;
  // Peer `node_id` is down or restarted (the fabric's liveness): every transfer this node sends
  // to it that has not ended ends now with `why` - including a layer-wise one waiting for its
  // next layer, which has no tile in the fabric to fail.
  virtual void PeerLost(const std::string& node_id, const absl::Status& why) = 0;
};

}  // namespace kvrail::transfers

// Internal to the fabric module: the sending side of remote transfers. RemotePath (Prepare: the
// peer's lease; Begin: the peer's handle), the engine that runs the transfer's tiles (packing
// threads: a free staging slot on some lane of the peer, PackTile into it, a NicCommand to the
// lane's proxy), slot credits (a tile is done when the peer's credit for its slot arrives) and
// the End/Abort RPC once nothing of a transfer is in flight.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "daemon/directory/directory.h"
#include "daemon/engine/engine.h"
#include "daemon/fabric/fabric_options.h"
#include "daemon/fabric/lanes.h"
#include "daemon/fabric/peers.h"
#include "daemon/transfers/remote_path.h"

namespace kvrail::fabric {

// Thread contract: thread-safe. Threads of its own: `pack_threads` packers and one closing thread
// (End/Abort RPCs, kept off the packers and the proxies). Credits and write failures arrive on the
// lanes' proxy threads (CreditSink).
class Sender : public transfers::RemotePath, public engine::Engine, public CreditSink {
 public:
  // Says hello to a peer that is not (or no longer) up; peer control's Introduce.
  using Introduce = std::function<absl::Status(PeerConn* peer)>;
  // Starts the threads. `lanes`, `peers` and `directory` outlive the sender. The directory's
  // record of a peer (its NICs and GPUs) feeds the rail-aware lane choice (lane_route.h);
  // nullptr: every transfer uses every lane.
  static std::unique_ptr<Sender> Create(const FabricOptions& options, uint64_t boot_id,
                                        Lanes* lanes, PeerTable* peers,
                                        const directory::Directory* directory, Introduce introduce);

  // Fails every transfer to `peer` with `why`: queued tiles, tiles in flight (their slots are
  // freed: a late credit finds no owner) and the transfers themselves (Abort is sent).
  virtual void FailPeer(PeerConn* peer, const absl::Status& why) = 0;
  // Whether a transfer to `peer` is still open here (its index is not reclaimed before).
  virtual bool HasTransfers(const PeerConn* peer) const = 0;
  // Stops and joins the packers, then the closing thread once it has sent what was queued.
  // Credits that arrive afterwards still complete tiles (their RPCs are not sent).
  virtual void Stop() = 0;
};

}  // namespace kvrail::fabric

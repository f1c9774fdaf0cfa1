// Internal to the fabric module (re-exported by fabric.h): the fabric's configuration, in its own
// header so the parts (lanes, sender, receiver, peer control) read it without the facade.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/kvrail/v1/topology.pb.h"

namespace kvrail::fabric {

// The node's mTLS material for the Peer service and the channels to peers (PEM text, loaded by
// LoadPeerTls in peer_tls.h). The certificate's subject CN is the node id.
struct PeerTlsPem {
  std::string ca;    // the CA certificate(s) every peer's certificate must chain to
  std::string cert;  // this node's certificate chain
  std::string key;   // its private key
};

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
  // Lane failover (sender.cc, lane_health.h): a lane whose credits stop for `lane_timeout` while
  // it has tiles in flight and another lane to the peer returns credits is failed for that peer
  // (a write error fails it at once); its unacknowledged tiles are re-sent on the other lanes. It
  // rests `lane_cooldown`, then one tile probes it. Lanes all silent together are the peer's
  // matter (liveness), unless that lasts `liveness_timeout`.
  absl::Duration lane_timeout = absl::Milliseconds(500);
  absl::Duration lane_cooldown = absl::Seconds(2);
  // For Hello ("1 GPU, 2 NICs").
  std::string topology_summary;
  // Rail-aware lane choice (lane_route.h): this node's topology (nullptr: unknown, every transfer
  // uses every lane), and per entry of nic_addresses the topology NIC it is on ("" unknown;
  // filled by Fabric::Create from the address's interface when empty). A lane mapped to a NIC
  // names itself "<nic>@<address>" (else "nic<i>@<address>"), so peers see its NIC.
  std::shared_ptr<const v1::TopologyDesc> topology;
  std::vector<std::string> lane_nics;
  // mTLS between daemons (docs/security.md, "Peers"): channels to peers present this node's
  // certificate and verify theirs; the Peer service takes a caller's node id from its
  // certificate. nullptr: insecure_peers (node ids as the messages claim them).
  std::shared_ptr<const PeerTlsPem> tls;
  // The relay hop (relay.h): fabric.relay's value ("auto", "off", "host", "gpu:<ordinal>").
  std::string relay = "auto";
  // GPU regions packed and scattered by the fabric kernels (fabric.gpu_pack "kernel"); false
  // ("copy"): by the copy engines, for benchmark comparisons.
  bool gpu_pack_kernels = true;
};

}  // namespace kvrail::fabric

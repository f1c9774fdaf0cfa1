#include "daemon/directory/directory.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace kvrail::directory {

v1::PeerState ToProto(PeerState state) {
  switch (state) {
    case PeerState::kUp:
      return v1::PEER_STATE_UP;
    case PeerState::kDown:
      return v1::PEER_STATE_DOWN;
    case PeerState::kUnknown:
      break;
  }
  return v1::PEER_STATE_UNKNOWN;
}

v1::DirectoryStatus Directory::Status() const {
  v1::DirectoryStatus status;
  status.set_kind(v1::DIRECTORY_KIND_STATIC);
  status.set_state(v1::DIRECTORY_STATE_OK);
  status.set_peers(static_cast<uint32_t>(Peers().size()));
  return status;
}

void Directory::SetStateListener(std::function<void(const v1::DirectoryStatus&)>) {}

v1::PeerInfo ToPeerInfo(const Peer& peer) {
  v1::PeerInfo info;
  info.set_node_id(peer.node_id);
  info.set_address(peer.address);
  info.set_state(ToProto(peer.state));
  if (peer.last_seen != absl::InfinitePast()) {
    info.set_last_seen_unix_us(absl::ToUnixMicros(peer.last_seen));
  }
  info.set_source(peer.is_static
                      ? (peer.has_record ? v1::PEER_SOURCE_STATIC_AND_ETCD : v1::PEER_SOURCE_STATIC)
                      : v1::PEER_SOURCE_ETCD);
  if (peer.has_record) *info.mutable_record() = peer.record;
  return info;
}

namespace {

// Thread contract: every member is guarded by mu_.
class StaticDirectory final : public Directory {
 public:
  StaticDirectory(const std::map<std::string, std::string>& peers, const std::string& self) {
    for (const auto& [node, address] : peers) {
      if (node == self) continue;
      peers_[node] = Peer{node, address};
    }
  }

  std::vector<Peer> Peers() const override {
    absl::MutexLock lock(&mu_);
    std::vector<Peer> out;
    for (const auto& [node, peer] : peers_) out.push_back(peer);
    return out;
  }

  absl::StatusOr<Peer> Lookup(const std::string& node_id) const override {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(node_id);
    if (it == peers_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "node '", node_id, "' is not in this daemon's peer directory (config peers)"));
    }
    return it->second;
  }

  void MarkUp(const std::string& node_id, absl::Time when, uint64_t boot_id) override {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(node_id);
    if (it == peers_.end()) return;
    it->second.state = PeerState::kUp;
    it->second.last_seen = when;
    it->second.boot_id = boot_id;
  }

  void MarkDown(const std::string& node_id) override {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(node_id);
    if (it != peers_.end()) it->second.state = PeerState::kDown;
  }

  std::vector<v1::PeerInfo> List() const override {
    std::vector<v1::PeerInfo> out;
    for (const Peer& peer : Peers()) out.push_back(ToPeerInfo(peer));
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Directory> CreateStaticDirectory(const std::map<std::string, std::string>& peers,
                                                 const std::string& self) {
  return std::make_unique<StaticDirectory>(peers, self);
}

}  // namespace kvrail::directory

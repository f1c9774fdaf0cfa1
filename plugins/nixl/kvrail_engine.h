// kvrail as a NIXL backend ("KVRAIL"): a NIXL agent's registrations, metadata, transfers and
// notifications carried by kvraild, the node's transfer daemon.
//
// Mapping (docs/integrations.md, "NIXL"):
// - registerMem(DRAM_SEG): the shared file behind the memory (host_memory.h) is passed to kvraild
//   and registered twice: as a bytes region and as a paged view of `granule_bytes` blocks (one
//   block = one granule), each with a READ and a WRITE grant. VRAM_SEG: the same over CUDA IPC.
// - getPublicData / loadRemoteMD: a registration's region ids, granule and grants. getConnInfo /
//   loadRemoteConnInfo: the agent's node, its mailbox region and a WRITE grant for it; loading an
//   agent of another node exports this agent's regions (and later registrations) to that node,
//   so a WRITE from there is accepted (it still needs the grant).
// - prepXfer: the descriptor list becomes kvrail transfers, one per (local registration, remote
//   registration) pair: block tables over the paged views when every descriptor is
//   granule-aligned on both sides, else byte ranges (runs contiguous on both sides merged).
//   postXfer submits them; checkXfer polls them; releaseReqH cancels what still runs.
// - Notifications: the NIXL message rides on the transfer (TransferSpec.notification, prefixed
//   with the sending agent's name) and reaches the remote agent's session when the data has
//   landed; genNotif is an 8-byte write into the remote agent's mailbox carrying the message.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/kvrail_client.h"
#include "plugins/nixl/nixl_abi.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::nixl {

using ::kvrail::client::Client;
using ::kvrail::client::HostBuffer;
namespace v1 = ::kvrail::v1;

inline constexpr char kBackendName[] = "KVRAIL";
inline constexpr char kBackendVersion[] = "1.0";
inline constexpr uint64_t kDefaultGranuleBytes = 4096;
// Bytes a genNotif writes into the remote mailbox.
inline constexpr uint64_t kMailboxWriteBytes = 8;

// The options NIXL lists for the backend (nixl_agent.get_plugin_params("KVRAIL")) with their
// defaults: "socket" (kvraild's socket; empty: $KVRAIL_SOCKET, else /run/kvrail/kvrail.sock) and
// "granule_bytes" (the paged view's block size; both agents of a transfer must use the same).
nixl_b_params_t DefaultOptions();

// One side's view of a registration: what a transfer names to reach it.
struct View {
  uint64_t region_id = 0;  // 0: no such view
  std::string read_grant;
  std::string write_grant;
};

// A registration, local (registerMem) or loaded from a remote agent's metadata (loadRemoteMD).
// Immutable after creation.
class RegionMD : public nixlBackendMD {
 public:
  RegionMD(bool local, nixl_mem_t mem, uintptr_t base, uint64_t len)
      : nixlBackendMD(local), local_(local), mem_(mem), base_(base), len_(len) {}

  bool local() const { return local_; }
  nixl_mem_t mem() const { return mem_; }
  uintptr_t base() const { return base_; }
  uint64_t len() const { return len_; }

  View bytes;
  View paged;            // blocks of `granule` bytes; region_id 0 when len < granule
  uint64_t granule = 0;  // paged view's block size
  std::string node;      // remote registrations: the node of the daemon holding it

  // "v=1 bytes=ID br=TOKEN bw=TOKEN paged=ID pr=TOKEN pw=TOKEN granule=N" (grants of this
  // registration's owner; handed to the agents that load this agent's metadata).
  std::string Serialize() const;
  // Parses Serialize's form. INVALID_ARGUMENT naming the field.
  static absl::StatusOr<std::unique_ptr<RegionMD>> Parse(const std::string& text, nixl_mem_t mem,
                                                         uintptr_t base, uint64_t len,
                                                         const std::string& node);

 private:
  const bool local_;
  const nixl_mem_t mem_;
  const uintptr_t base_;
  const uint64_t len_;
};

// A prepared NIXL transfer: its kvrail transfer specs, and the ids of the last post.
// Thread contract: used by one NIXL call at a time (the agent serializes calls per request).
class XferHandle : public nixlBackendReqH {
 public:
  std::vector<v1::TransferSpec> specs;
  bool to_self = false;  // the remote agent is this agent (a local transfer)
  std::string remote_agent;

  // Of the current post:
  std::vector<uint64_t> ids;
  size_t finished = 0;      // ids[0, finished) are known to have succeeded
  std::string notif_after;  // payload still to send through the mailbox once all finished
  bool notif_self = false;  // deliver the message to this agent itself once all finished
  std::string self_message;
};

// Thread contract: every method may be called from any thread; the kvrail client is
// thread-safe, and the remote agents' connection info is guarded by mu_.
class KvrailEngine : public nixlBackendEngine {
 public:
  explicit KvrailEngine(const nixlBackendInitParams* init_params);
  ~KvrailEngine() override;

  bool supportsRemote() const override { return true; }
  bool supportsLocal() const override { return true; }
  bool supportsNotif() const override { return true; }
  nixl_mem_list_t getSupportedMems() const override { return {DRAM_SEG, VRAM_SEG}; }

  nixl_status_t registerMem(const nixlBlobDesc& mem, const nixl_mem_t& nixl_mem,
                            nixlBackendMD*& out) override;
  nixl_status_t deregisterMem(nixlBackendMD* meta) override;
  nixl_status_t connect(const std::string& remote_agent) override;
  nixl_status_t disconnect(const std::string& remote_agent) override;
  nixl_status_t unloadMD(nixlBackendMD* input) override;
  nixl_status_t prepXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                         const nixl_meta_dlist_t& remote, const std::string& remote_agent,
                         nixlBackendReqH*& handle,
                         const nixl_opt_b_args_t* opt_args = nullptr) const override;
  nixl_status_t postXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                         const nixl_meta_dlist_t& remote, const std::string& remote_agent,
                         nixlBackendReqH*& handle,
                         const nixl_opt_b_args_t* opt_args = nullptr) const override;
  nixl_status_t checkXfer(nixlBackendReqH* handle) const override;
  nixl_status_t releaseReqH(nixlBackendReqH* handle) const override;

  nixl_status_t getPublicData(const nixlBackendMD* meta, std::string& str) const override;
  nixl_status_t getConnInfo(std::string& str) const override;
  nixl_status_t loadRemoteConnInfo(const std::string& remote_agent,
                                   const std::string& remote_conn_info) override;
  nixl_status_t loadRemoteMD(const nixlBlobDesc& input, const nixl_mem_t& nixl_mem,
                             const std::string& remote_agent, nixlBackendMD*& output) override;
  nixl_status_t loadLocalMD(nixlBackendMD* input, nixlBackendMD*& output) override;

  nixl_status_t getNotifs(notif_list_t& notif_list) override;
  nixl_status_t genNotif(const std::string& remote_agent, const std::string& msg) const override;

 private:
  struct RemoteAgent {
    std::string node;
    uint64_t mailbox_region = 0;
    std::string mailbox_grant;
  };

  absl::Status Init();
  // Lets the daemon of `node` write into `region_ids` (Transfer.ExportRegion); a remote agent on
  // another node writes into this agent's registrations only after that.
  absl::Status ExportTo(const std::string& node, const std::vector<uint64_t>& region_ids);
  // This agent's regions (mailbox and every view) and the nodes they are exported to.
  std::vector<uint64_t> LocalRegions() const;
  absl::StatusOr<std::unique_ptr<RegionMD>> Register(const nixlBlobDesc& mem, nixl_mem_t kind);
  absl::StatusOr<View> RegisterView(const nixlBlobDesc& mem, nixl_mem_t kind,
                                    const v1::RegionSpec& spec);
  absl::Status Plan(nixl_xfer_op_t op, const nixl_meta_dlist_t& local,
                    const nixl_meta_dlist_t& remote, XferHandle& handle) const;
  absl::StatusOr<RemoteAgent> FindRemote(const std::string& agent) const;
  absl::StatusOr<uint64_t> SubmitMailboxWrite(const std::string& agent,
                                              const std::string& payload) const;
  // "KVN1" + u16 name length + this agent's name + message. INVALID_ARGUMENT beyond 1024 bytes.
  absl::StatusOr<std::string> NotificationPayload(const std::string& msg) const;
  void QueueSelfNotification(const std::string& msg) const;
  // Logs `status` with the call it failed in and maps it to a NIXL status.
  nixl_status_t Fail(const char* call, const absl::Status& status) const;

  std::unique_ptr<Client> client_;
  uint64_t granule_ = kDefaultGranuleBytes;
  std::string node_;
  std::unique_ptr<HostBuffer> mailbox_;
  uint64_t mailbox_region_ = 0;
  std::string mailbox_grant_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, RemoteAgent> remotes_ ABSL_GUARDED_BY(mu_);
  // Registrations of this agent (deregisterMem removes them) and the other nodes of the remote
  // agents loaded so far, to which every registration is exported.
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> local_views_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> export_nodes_ ABSL_GUARDED_BY(mu_);
  mutable notif_list_t self_notifs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvrail::nixl

#include "plugins/nixl/kvrail_engine.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "client/cuda_export.h"
#include "plugins/nixl/host_memory.h"
#include "proto/kvrail/v1/admin.pb.h"
#include "proto/kvrail/v1/region.pb.h"

namespace kvrail::nixl {
namespace {

// Grants live as long as the daemon allows (a day): NIXL metadata is exchanged once.
constexpr absl::Duration kGrantTtl = absl::Hours(24);

using Fields = absl::flat_hash_map<std::string, std::string>;

Fields ParseFields(const std::string& text) {
  Fields fields;
  for (absl::string_view item : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos) continue;
    fields[std::string(item.substr(0, eq))] = std::string(item.substr(eq + 1));
  }
  return fields;
}

absl::StatusOr<uint64_t> FieldU64(const Fields& fields, const std::string& key,
                                  const std::string& what) {
  const auto it = fields.find(key);
  uint64_t value = 0;
  if (it == fields.end() || !absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": field '", key, "' missing or bad"));
  }
  return value;
}

std::string FieldStr(const Fields& fields, const std::string& key) {
  const auto it = fields.find(key);
  return it == fields.end() ? "" : it->second;
}

const RegionMD* AsRegion(const nixlBackendMD* md) { return static_cast<const RegionMD*>(md); }

}  // namespace

nixl_b_params_t DefaultOptions() {
  return {{"socket", ""}, {"granule_bytes", std::to_string(kDefaultGranuleBytes)}};
}

// --- RegionMD ----------------------------------------------------------------------------------

std::string RegionMD::Serialize() const {
  std::string out = absl::StrCat("v=1 bytes=", bytes.region_id, " granule=", granule);
  if (!bytes.read_grant.empty()) absl::StrAppend(&out, " br=", bytes.read_grant);
  if (!bytes.write_grant.empty()) absl::StrAppend(&out, " bw=", bytes.write_grant);
  if (paged.region_id != 0) {
    absl::StrAppend(&out, " paged=", paged.region_id, " pr=", paged.read_grant,
                    " pw=", paged.write_grant);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<RegionMD>> RegionMD::Parse(const std::string& text, nixl_mem_t mem,
                                                          uintptr_t base, uint64_t len,
                                                          const std::string& node) {
  const Fields fields = ParseFields(text);
  if (FieldStr(fields, "v") != "1") {
    return absl::InvalidArgumentError(
        "remote metadata: not a KVRAIL registration (field 'v' is not 1): the remote agent "
        "registered this memory with another backend");
  }
  auto md = std::make_unique<RegionMD>(false, mem, base, len);
  KVRAIL_ASSIGN_OR_RETURN(md->bytes.region_id, FieldU64(fields, "bytes", "remote metadata"));
  KVRAIL_ASSIGN_OR_RETURN(md->granule, FieldU64(fields, "granule", "remote metadata"));
  md->bytes.read_grant = FieldStr(fields, "br");
  md->bytes.write_grant = FieldStr(fields, "bw");
  if (fields.contains("paged")) {
    KVRAIL_ASSIGN_OR_RETURN(md->paged.region_id, FieldU64(fields, "paged", "remote metadata"));
    md->paged.read_grant = FieldStr(fields, "pr");
    md->paged.write_grant = FieldStr(fields, "pw");
  }
  md->node = node;
  return md;
}

// --- KvrailEngine: set-up ------------------------------------------------------------------------

KvrailEngine::KvrailEngine(const nixlBackendInitParams* init_params)
    : nixlBackendEngine(init_params) {
  const absl::Status status = Init();
  if (!status.ok()) {
    fprintf(stderr, "[KVRAIL] agent '%s': backend not created: %s\n", localAgent.c_str(),
            status.ToString().c_str());
    initErr = true;
  }
}

KvrailEngine::~KvrailEngine() {
  // The daemon releases every region and grant of the session when the client closes.
  client_.reset();
}

absl::Status KvrailEngine::Init() {
  std::string socket;
  if (getInitParam("socket", socket) != NIXL_SUCCESS || socket.empty()) {
    const char* env = getenv("KVRAIL_SOCKET");
    socket = env != nullptr && env[0] != '\0' ? env : client::DefaultTarget();
  }
  std::string granule_text;
  if (getInitParam("granule_bytes", granule_text) == NIXL_SUCCESS && !granule_text.empty()) {
    if (!absl::SimpleAtoi(granule_text, &granule_) || granule_ == 0 || granule_ > (1u << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("granule_bytes: '", granule_text, "' is not in [1, 2^30]"));
    }
  }
  KVRAIL_ASSIGN_OR_RETURN(client_, Client::Connect(socket));
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t session, client_->SessionId());
  (void)session;
  KVRAIL_ASSIGN_OR_RETURN(const v1::Stats stats, client_->GetStats());
  node_ = stats.node_id();
  // The mailbox: what genNotif writes into (a few bytes) to carry a message to this agent.
  KVRAIL_ASSIGN_OR_RETURN(mailbox_, client_->CreateHostBuffer(4096));
  v1::RegionSpec spec;
  spec.set_name(absl::StrCat("nixl ", localAgent, " mailbox"));
  spec.set_writable(true);
  KVRAIL_ASSIGN_OR_RETURN(const v1::RegionInfo info, client_->RegisterHostBuffer(*mailbox_, spec));
  mailbox_region_ = info.region_id();
  KVRAIL_ASSIGN_OR_RETURN(const v1::Grant grant,
                          client_->CreateGrant(mailbox_region_, v1::GRANT_ACCESS_WRITE, kGrantTtl));
  mailbox_grant_ = grant.token();
  return absl::OkStatus();
}

nixl_status_t KvrailEngine::Fail(const char* call, const absl::Status& status) const {
  fprintf(stderr, "[KVRAIL] agent '%s': %s: %s\n", localAgent.c_str(), call,
          status.ToString().c_str());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return NIXL_ERR_INVALID_PARAM;
    case absl::StatusCode::kNotFound:
      return NIXL_ERR_NOT_FOUND;
    case absl::StatusCode::kPermissionDenied:
      return NIXL_ERR_NOT_ALLOWED;
    case absl::StatusCode::kUnimplemented:
      return NIXL_ERR_NOT_SUPPORTED;
    case absl::StatusCode::kCancelled:
      return NIXL_ERR_CANCELED;
    default:
      return NIXL_ERR_BACKEND;
  }
}

// --- Registration ------------------------------------------------------------------------------

absl::StatusOr<View> KvrailEngine::RegisterView(const nixlBlobDesc& mem, nixl_mem_t kind,
                                                const v1::RegionSpec& spec) {
  v1::RegionInfo info;
  if (kind == VRAM_SEG) {
    KVRAIL_ASSIGN_OR_RETURN(
        info, client::RegisterCudaRegion(*client_, reinterpret_cast<const void*>(mem.addr), mem.len,
                                         spec));
  } else {
    KVRAIL_ASSIGN_OR_RETURN(SharedBacking backing, FindSharedBacking(mem.addr, mem.len));
    KVRAIL_ASSIGN_OR_RETURN(const std::string token, client_->ShareFd(backing.fd.get()));
    v1::RegionSpec host = spec;
    host.set_memory_kind(v1::MEMORY_KIND_HOST);
    host.mutable_share()->set_fd_token(token);
    host.mutable_share()->set_offset(backing.offset);
    if (host.size_bytes() == 0) host.set_size_bytes(mem.len);
    KVRAIL_ASSIGN_OR_RETURN(const uint64_t session, client_->SessionId());
    KVRAIL_ASSIGN_OR_RETURN(info, client_->RegisterRegion(host, session));
  }
  View view;
  view.region_id = info.region_id();
  KVRAIL_ASSIGN_OR_RETURN(const v1::Grant read,
                          client_->CreateGrant(view.region_id, v1::GRANT_ACCESS_READ, kGrantTtl));
  KVRAIL_ASSIGN_OR_RETURN(const v1::Grant write,
                          client_->CreateGrant(view.region_id, v1::GRANT_ACCESS_WRITE, kGrantTtl));
  view.read_grant = read.token();
  view.write_grant = write.token();
  return view;
}

absl::StatusOr<std::unique_ptr<RegionMD>> KvrailEngine::Register(const nixlBlobDesc& mem,
                                                                 nixl_mem_t kind) {
  if (kind != DRAM_SEG && kind != VRAM_SEG) {
    return absl::InvalidArgumentError(
        absl::StrCat("mem type ", static_cast<int>(kind), ": KVRAIL serves DRAM and VRAM only"));
  }
  if (mem.len == 0) return absl::InvalidArgumentError("len: 0 bytes");
  auto md = std::make_unique<RegionMD>(true, kind, mem.addr, mem.len);
  md->granule = granule_;
  v1::RegionSpec bytes;
  bytes.set_name(absl::StrCat("nixl ", localAgent, " bytes"));
  bytes.set_writable(true);
  bytes.mutable_bytes();
  if (kind == VRAM_SEG) bytes.set_device(static_cast<int32_t>(mem.devId));
  KVRAIL_ASSIGN_OR_RETURN(md->bytes, RegisterView(mem, kind, bytes));
  const uint64_t blocks = mem.len / granule_;
  if (blocks > 0 && blocks <= UINT32_MAX) {
    v1::RegionSpec paged;
    paged.set_name(absl::StrCat("nixl ", localAgent, " paged"));
    paged.set_writable(true);
    if (kind == VRAM_SEG) paged.set_device(static_cast<int32_t>(mem.devId));
    paged.set_size_bytes(blocks * granule_);
    v1::PagedKvLayout* layout = paged.mutable_paged_kv();
    layout->set_num_layers(1);
    layout->set_num_parts(1);
    layout->set_num_blocks(static_cast<uint32_t>(blocks));
    layout->set_tokens_per_block(1);
    layout->set_num_heads(1);
    layout->set_head_dim(static_cast<uint32_t>(granule_));
    layout->set_dtype(v1::DTYPE_UINT8);
    layout->set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
    auto view = RegisterView(mem, kind, paged);
    if (!view.ok()) {
      (void)client_->UnregisterRegion(md->bytes.region_id);
      return view.status();
    }
    md->paged = *std::move(view);
  }
  return md;
}

nixl_status_t KvrailEngine::registerMem(const nixlBlobDesc& mem, const nixl_mem_t& nixl_mem,
                                        nixlBackendMD*& out) {
  auto md = Register(mem, nixl_mem);
  if (!md.ok()) return Fail("registerMem", md.status());
  std::vector<uint64_t> views = {(*md)->bytes.region_id};
  if ((*md)->paged.region_id != 0) views.push_back((*md)->paged.region_id);
  std::vector<std::string> nodes;
  {
    absl::MutexLock lock(&mu_);
    local_views_[(*md)->bytes.region_id] = views;
    nodes = export_nodes_;
  }
  for (const std::string& node : nodes) {
    const absl::Status exported = ExportTo(node, views);
    if (!exported.ok()) {
      (void)deregisterMem(md->release());
      return Fail("registerMem", exported);
    }
  }
  out = md->release();
  return NIXL_SUCCESS;
}

absl::Status KvrailEngine::ExportTo(const std::string& node,
                                    const std::vector<uint64_t>& region_ids) {
  for (const uint64_t id : region_ids) {
    auto lease = client_->ExportRegion(id, node);
    if (!lease.ok()) {
      return absl::Status(lease.status().code(),
                          absl::StrCat("exporting region ", id, " to node '", node,
                                       "': ", lease.status().message()));
    }
  }
  return absl::OkStatus();
}

std::vector<uint64_t> KvrailEngine::LocalRegions() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> ids = {mailbox_region_};
  for (const auto& [key, views] : local_views_) ids.insert(ids.end(), views.begin(), views.end());
  return ids;
}

nixl_status_t KvrailEngine::deregisterMem(nixlBackendMD* meta) {
  auto* md = static_cast<RegionMD*>(meta);
  if (md == nullptr || !md->local()) return NIXL_ERR_INVALID_PARAM;
  {
    absl::MutexLock lock(&mu_);
    local_views_.erase(md->bytes.region_id);
  }
  absl::Status status = client_->UnregisterRegion(md->bytes.region_id);
  if (md->paged.region_id != 0) status.Update(client_->UnregisterRegion(md->paged.region_id));
  delete md;
  return status.ok() ? NIXL_SUCCESS : Fail("deregisterMem", status);
}

// --- Metadata exchange ---------------------------------------------------------------------------

nixl_status_t KvrailEngine::getPublicData(const nixlBackendMD* meta, std::string& str) const {
  if (meta == nullptr) return NIXL_ERR_INVALID_PARAM;
  str = AsRegion(meta)->Serialize();
  return NIXL_SUCCESS;
}

nixl_status_t KvrailEngine::getConnInfo(std::string& str) const {
  str = absl::StrCat("v=1 node=", node_, " mailbox=", mailbox_region_, " mw=", mailbox_grant_);
  return NIXL_SUCCESS;
}

nixl_status_t KvrailEngine::loadRemoteConnInfo(const std::string& remote_agent,
                                               const std::string& remote_conn_info) {
  const Fields fields = ParseFields(remote_conn_info);
  if (FieldStr(fields, "v") != "1") {
    return Fail("loadRemoteConnInfo",
                absl::InvalidArgumentError(absl::StrCat("remote agent '", remote_agent,
                                                        "': connection info is not KVRAIL's")));
  }
  RemoteAgent remote;
  remote.node = FieldStr(fields, "node");
  auto mailbox = FieldU64(fields, "mailbox", absl::StrCat("remote agent '", remote_agent, "'"));
  if (!mailbox.ok()) return Fail("loadRemoteConnInfo", mailbox.status());
  remote.mailbox_region = *mailbox;
  remote.mailbox_grant = FieldStr(fields, "mw");
  const std::string node = remote.node;
  bool new_node = false;
  {
    absl::MutexLock lock(&mu_);
    remotes_[remote_agent] = std::move(remote);
    if (!node.empty() && node != node_ &&
        std::find(export_nodes_.begin(), export_nodes_.end(), node) == export_nodes_.end()) {
      export_nodes_.push_back(node);
      new_node = true;
    }
  }
  if (new_node) {
    const absl::Status exported = ExportTo(node, LocalRegions());
    if (!exported.ok()) return Fail("loadRemoteConnInfo", exported);
  }
  return NIXL_SUCCESS;
}

absl::StatusOr<KvrailEngine::RemoteAgent> KvrailEngine::FindRemote(const std::string& agent) const {
  absl::MutexLock lock(&mu_);
  const auto it = remotes_.find(agent);
  if (it == remotes_.end()) {
    return absl::NotFoundError(
        absl::StrCat("remote agent '", agent, "': no KVRAIL connection info loaded"));
  }
  return it->second;
}

nixl_status_t KvrailEngine::loadRemoteMD(const nixlBlobDesc& input, const nixl_mem_t& nixl_mem,
                                         const std::string& remote_agent, nixlBackendMD*& output) {
  std::string node;
  {
    absl::MutexLock lock(&mu_);
    const auto it = remotes_.find(remote_agent);
    if (it != remotes_.end()) node = it->second.node;
  }
  auto md = RegionMD::Parse(input.metaInfo, nixl_mem, input.addr, input.len, node);
  if (!md.ok()) return Fail("loadRemoteMD", md.status());
  output = md->release();
  return NIXL_SUCCESS;
}

nixl_status_t KvrailEngine::loadLocalMD(nixlBackendMD* input, nixlBackendMD*& output) {
  // A transfer between two registrations of this agent names the registrations themselves.
  output = input;
  return NIXL_SUCCESS;
}

nixl_status_t KvrailEngine::unloadMD(nixlBackendMD* input) {
  const auto* md = AsRegion(input);
  if (md != nullptr && !md->local()) delete md;  // local ones go with deregisterMem
  return NIXL_SUCCESS;
}

nixl_status_t KvrailEngine::connect(const std::string&) { return NIXL_SUCCESS; }

nixl_status_t KvrailEngine::disconnect(const std::string& remote_agent) {
  absl::MutexLock lock(&mu_);
  remotes_.erase(remote_agent);
  return NIXL_SUCCESS;
}

}  // namespace kvrail::nixl

// KvrailEngine's transfers and notifications (the registrations and metadata are in
// kvrail_engine.cc).
#include <cstdio>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "plugins/nixl/kvrail_engine.h"

namespace kvrail::nixl {
namespace {

constexpr char kNotifMagic[] = "KVN1";
constexpr size_t kNotifMagicLen = 4;
constexpr size_t kNotifMax = 1024;  // TransferSpec.notification's limit

const RegionMD* AsRegion(const nixlBackendMD* md) { return static_cast<const RegionMD*>(md); }

void AppendLe32(std::string& out, uint64_t value) {
  const uint32_t v = static_cast<uint32_t>(value);
  const char bytes[4] = {static_cast<char>(v & 0xff), static_cast<char>((v >> 8) & 0xff),
                         static_cast<char>((v >> 16) & 0xff), static_cast<char>((v >> 24) & 0xff)};
  out.append(bytes, 4);
}

// The descriptors of one NIXL transfer that join one local and one remote registration.
struct Group {
  const RegionMD* local = nullptr;
  const RegionMD* remote = nullptr;
  std::vector<size_t> descs;
};

}  // namespace

absl::StatusOr<std::string> KvrailEngine::NotificationPayload(const std::string& msg) const {
  const size_t size = kNotifMagicLen + 2 + localAgent.size() + msg.size();
  if (localAgent.size() > 0xffff || size > kNotifMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "notifMsg: ", msg.size(), " bytes with agent name '", localAgent,
        "' exceed the notification limit (", kNotifMax - kNotifMagicLen - 2, " bytes together)"));
  }
  std::string out(kNotifMagic, kNotifMagicLen);
  out.push_back(static_cast<char>(localAgent.size() & 0xff));
  out.push_back(static_cast<char>(localAgent.size() >> 8));
  out += localAgent;
  out += msg;
  return out;
}

void KvrailEngine::QueueSelfNotification(const std::string& msg) const {
  absl::MutexLock lock(&mu_);
  self_notifs_.emplace_back(localAgent, msg);
}

absl::Status KvrailEngine::Plan(nixl_xfer_op_t op, const nixl_meta_dlist_t& local,
                                const nixl_meta_dlist_t& remote, XferHandle& handle) const {
  if (op != NIXL_READ && op != NIXL_WRITE) {
    return absl::InvalidArgumentError(absl::StrCat("operation: ", static_cast<int>(op)));
  }
  if (local.descCount() != remote.descCount()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "remote: ", remote.descCount(), " descriptors for ", local.descCount(), " local ones"));
  }
  std::vector<Group> groups;
  absl::flat_hash_map<std::pair<const RegionMD*, const RegionMD*>, size_t> group_of;
  for (int i = 0; i < local.descCount(); ++i) {
    const nixlMetaDesc& l = local[i];
    const nixlMetaDesc& r = remote[i];
    const RegionMD* lmd = AsRegion(l.metadataP);
    const RegionMD* rmd = AsRegion(r.metadataP);
    if (lmd == nullptr || rmd == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(lmd == nullptr ? "local[" : "remote[", i, "]: no KVRAIL registration"));
    }
    if (l.len != r.len) {
      return absl::InvalidArgumentError(
          absl::StrCat("remote[", i, "].len: ", r.len, " bytes, local[", i, "] has ", l.len));
    }
    if (l.addr < lmd->base() || l.addr + l.len > lmd->base() + lmd->len()) {
      return absl::OutOfRangeError(absl::StrCat("local[", i, "]: outside its registration"));
    }
    if (r.addr < rmd->base() || r.addr + r.len > rmd->base() + rmd->len()) {
      return absl::OutOfRangeError(absl::StrCat("remote[", i, "]: outside its registration"));
    }
    const auto [it, added] = group_of.try_emplace({lmd, rmd}, groups.size());
    if (added) groups.push_back(Group{lmd, rmd, {}});
    groups[it->second].descs.push_back(static_cast<size_t>(i));
  }

  handle.specs.clear();
  const bool write = op == NIXL_WRITE;
  for (const Group& g : groups) {
    const RegionMD& lmd = *g.local;
    const RegionMD& rmd = *g.remote;
    // The remote side needs its owner's grant unless this agent owns it (a local transfer).
    const bool needs_grant = !rmd.local();
    const std::string remote_node =
        needs_grant && !rmd.node.empty() && rmd.node != node_ ? rmd.node : "";
    auto endpoint = [&](v1::TransferEndpoint* ep, bool is_remote, const View& view) {
      ep->set_region_id(view.region_id);
      if (is_remote) {
        if (needs_grant) ep->set_grant(write ? view.write_grant : view.read_grant);
        if (!remote_node.empty()) ep->set_node_id(remote_node);
      }
    };
    const uint64_t gran = lmd.granule;
    bool paged =
        lmd.paged.region_id != 0 && rmd.paged.region_id != 0 && gran != 0 && gran == rmd.granule;
    uint64_t ids = 0;
    for (size_t i = 0; paged && i < g.descs.size(); ++i) {
      const nixlMetaDesc& l = local[g.descs[i]];
      const nixlMetaDesc& r = remote[g.descs[i]];
      const uint64_t lo = l.addr - lmd.base(), ro = r.addr - rmd.base();
      paged = lo % gran == 0 && ro % gran == 0 && l.len % gran == 0 &&
              lo + l.len <= lmd.len() / gran * gran && ro + r.len <= rmd.len() / gran * gran;
      ids += l.len / gran;
    }
    if (paged && ids > 0) {
      // One transfer: a block table per side, one granule per id.
      std::string lids, rids;
      lids.reserve(ids * 4);
      rids.reserve(ids * 4);
      for (const size_t d : g.descs) {
        const uint64_t lb = (local[d].addr - lmd.base()) / gran;
        const uint64_t rb = (remote[d].addr - rmd.base()) / gran;
        for (uint64_t k = 0; k < local[d].len / gran; ++k) {
          AppendLe32(lids, lb + k);
          AppendLe32(rids, rb + k);
        }
      }
      v1::TransferSpec& spec = handle.specs.emplace_back();
      v1::TransferEndpoint* src = spec.mutable_src();
      v1::TransferEndpoint* dst = spec.mutable_dst();
      endpoint(write ? src : dst, false, lmd.paged);
      endpoint(write ? dst : src, true, rmd.paged);
      *src->mutable_block_ids_le32() = write ? std::move(lids) : std::move(rids);
      *dst->mutable_block_ids_le32() = write ? std::move(rids) : std::move(lids);
      spec.set_label("nixl");
      continue;
    }
    // Byte ranges: runs contiguous on both sides become one range each.
    size_t i = 0;
    while (i < g.descs.size()) {
      const nixlMetaDesc& first = local[g.descs[i]];
      uint64_t lo = first.addr - lmd.base();
      uint64_t ro = remote[g.descs[i]].addr - rmd.base();
      uint64_t len = first.len;
      size_t j = i + 1;
      while (j < g.descs.size() && local[g.descs[j]].addr - lmd.base() == lo + len &&
             remote[g.descs[j]].addr - rmd.base() == ro + len) {
        len += local[g.descs[j]].len;
        ++j;
      }
      i = j;
      if (len == 0) continue;
      v1::TransferSpec& spec = handle.specs.emplace_back();
      v1::TransferEndpoint* src = spec.mutable_src();
      v1::TransferEndpoint* dst = spec.mutable_dst();
      endpoint(write ? src : dst, false, lmd.bytes);
      endpoint(write ? dst : src, true, rmd.bytes);
      src->set_byte_offset(write ? lo : ro);
      dst->set_byte_offset(write ? ro : lo);
      spec.set_num_bytes(len);
      spec.set_label("nixl");
    }
  }
  return absl::OkStatus();
}

nixl_status_t KvrailEngine::prepXfer(const nixl_xfer_op_t& operation,
                                     const nixl_meta_dlist_t& local,
                                     const nixl_meta_dlist_t& remote,
                                     const std::string& remote_agent, nixlBackendReqH*& handle,
                                     const nixl_opt_b_args_t*) const {
  auto h = std::make_unique<XferHandle>();
  h->remote_agent = remote_agent;
  h->to_self = remote_agent == localAgent;
  const absl::Status status = Plan(operation, local, remote, *h);
  if (!status.ok()) return Fail("prepXfer", status);
  handle = h.release();
  return NIXL_SUCCESS;
}

nixl_status_t KvrailEngine::postXfer(const nixl_xfer_op_t& operation,
                                     const nixl_meta_dlist_t& local,
                                     const nixl_meta_dlist_t& remote,
                                     const std::string& remote_agent, nixlBackendReqH*& handle,
                                     const nixl_opt_b_args_t* opt_args) const {
  if (handle == nullptr) {
    const nixl_status_t prepared =
        prepXfer(operation, local, remote, remote_agent, handle, opt_args);
    if (prepared != NIXL_SUCCESS) return prepared;
  }
  auto* h = static_cast<XferHandle*>(handle);
  if (h->finished < h->ids.size() || !h->notif_after.empty()) return NIXL_ERR_REPOST_ACTIVE;
  h->ids.clear();
  h->finished = 0;
  h->notif_self = false;
  std::string payload;
  const bool notify = opt_args != nullptr && opt_args->hasNotif;
  if (notify && h->to_self) {
    h->notif_self = true;
    h->self_message = opt_args->notifMsg;
  } else if (notify) {
    auto built = NotificationPayload(opt_args->notifMsg);
    if (!built.ok()) return Fail("postXfer", built.status());
    payload = *std::move(built);
    // With one kvrail transfer the message rides on it; with several it follows them all.
    if (h->specs.size() != 1) h->notif_after = payload;
  }
  for (const v1::TransferSpec& planned : h->specs) {
    absl::StatusOr<v1::SubmitTransferResponse> response;
    if (notify && !h->to_self && h->specs.size() == 1) {
      v1::TransferSpec spec = planned;
      spec.set_notification(payload);
      response = client_->Submit(spec);
    } else {
      response = client_->Submit(planned);
    }
    if (!response.ok()) {
      for (const uint64_t id : h->ids) (void)client_->Cancel(id);
      h->ids.clear();
      h->notif_after.clear();
      return Fail("postXfer", response.status());
    }
    h->ids.push_back(response->transfer_id());
  }
  return checkXfer(h);
}

absl::StatusOr<uint64_t> KvrailEngine::SubmitMailboxWrite(const std::string& agent,
                                                          const std::string& payload) const {
  KVRAIL_ASSIGN_OR_RETURN(const RemoteAgent remote, FindRemote(agent));
  v1::TransferSpec spec;
  spec.mutable_src()->set_region_id(mailbox_region_);
  spec.mutable_dst()->set_region_id(remote.mailbox_region);
  spec.mutable_dst()->set_grant(remote.mailbox_grant);
  if (!remote.node.empty() && remote.node != node_) spec.mutable_dst()->set_node_id(remote.node);
  spec.set_num_bytes(kMailboxWriteBytes);
  spec.set_notification(payload);
  spec.set_label("nixl notification");
  KVRAIL_ASSIGN_OR_RETURN(const v1::SubmitTransferResponse response, client_->Submit(spec));
  return response.transfer_id();
}

nixl_status_t KvrailEngine::checkXfer(nixlBackendReqH* handle) const {
  auto* h = static_cast<XferHandle*>(handle);
  if (h == nullptr) return NIXL_ERR_INVALID_PARAM;
  while (h->finished < h->ids.size()) {
    auto status = client_->Get(h->ids[h->finished]);
    if (!status.ok()) return Fail("checkXfer", status.status());
    switch (status->state()) {
      case v1::TRANSFER_STATE_SUCCEEDED:
        ++h->finished;
        continue;
      case v1::TRANSFER_STATE_FAILED:
      case v1::TRANSFER_STATE_CANCELLED: {
        const uint64_t id = h->ids[h->finished];
        h->ids.resize(h->finished);  // a failed post is over: the handle may be posted again
        h->notif_after.clear();
        return Fail("checkXfer",
                    absl::Status(static_cast<absl::StatusCode>(status->error_code()),
                                 absl::StrCat("transfer ", id, ": ", status->error_message())));
      }
      default:
        return NIXL_IN_PROG;
    }
  }
  if (!h->notif_after.empty()) {
    auto id = SubmitMailboxWrite(h->remote_agent, h->notif_after);
    h->notif_after.clear();
    if (!id.ok()) return Fail("checkXfer", id.status());
    h->ids.push_back(*id);
    return NIXL_IN_PROG;
  }
  if (h->notif_self) {
    QueueSelfNotification(h->self_message);
    h->notif_self = false;
  }
  return NIXL_SUCCESS;
}

nixl_status_t KvrailEngine::releaseReqH(nixlBackendReqH* handle) const {
  auto* h = static_cast<XferHandle*>(handle);
  if (h == nullptr) return NIXL_SUCCESS;
  for (size_t i = h->finished; i < h->ids.size(); ++i) (void)client_->Cancel(h->ids[i]);
  delete h;
  return NIXL_SUCCESS;
}

// --- Notifications -------------------------------------------------------------------------------

nixl_status_t KvrailEngine::genNotif(const std::string& remote_agent,
                                     const std::string& msg) const {
  if (remote_agent == localAgent) {
    QueueSelfNotification(msg);
    return NIXL_SUCCESS;
  }
  auto payload = NotificationPayload(msg);
  if (!payload.ok()) return Fail("genNotif", payload.status());
  auto id = SubmitMailboxWrite(remote_agent, *payload);
  if (!id.ok()) return Fail("genNotif", id.status());
  return NIXL_SUCCESS;
}

nixl_status_t KvrailEngine::getNotifs(notif_list_t& notif_list) {
  {
    absl::MutexLock lock(&mu_);
    for (auto& n : self_notifs_) notif_list.push_back(std::move(n));
    self_notifs_.clear();
  }
  auto polled = client_->PollNotifications(256);
  if (!polled.ok()) return Fail("getNotifs", polled.status());
  for (const v1::Notification& n : *polled) {
    const std::string& p = n.notification();
    if (p.size() < kNotifMagicLen + 2 || p.compare(0, kNotifMagicLen, kNotifMagic) != 0) {
      continue;  // a kvrail notification of some other client, not a NIXL message
    }
    const size_t name_len = static_cast<uint8_t>(p[kNotifMagicLen]) |
                            static_cast<size_t>(static_cast<uint8_t>(p[kNotifMagicLen + 1])) << 8;
    if (p.size() < kNotifMagicLen + 2 + name_len) continue;
    std::string agent = p.substr(kNotifMagicLen + 2, name_len);
    if (n.state() != v1::TRANSFER_STATE_SUCCEEDED) {
      // NIXL delivers a message only with data that landed; a failed transfer's is dropped.
      fprintf(stderr,
              "[KVRAIL] agent '%s': dropped the notification of agent '%s': transfer %llu "
              "ended in state %d (%s)\n",
              localAgent.c_str(), agent.c_str(), static_cast<unsigned long long>(n.transfer_id()),
              static_cast<int>(n.state()), n.error_message().c_str());
      continue;
    }
    notif_list.emplace_back(std::move(agent), p.substr(kNotifMagicLen + 2 + name_len));
  }
  return NIXL_SUCCESS;
}

}  // namespace kvrail::nixl

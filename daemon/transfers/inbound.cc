// The receiving side of PATH_FABRIC (InboundSink): transfers another node writes into this one.
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "daemon/transfers/manager_impl.h"
#include "proto/kvrail/v1/spec_copy.h"
#include "spdlog/spdlog.h"

namespace kvrail::transfers {

absl::StatusOr<InboundSink::Admitted> TransferManagerImpl::BeginInbound(
    const v1::TransferSpec& spec, const planner::Plan& plan,
    std::shared_ptr<regions::Region> source, std::shared_ptr<regions::Region> dst,
    const std::string& sender_node, uint64_t sender_transfer_id) {
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return absl::UnavailableError("the receiving daemon is draining");
  }
  // The sender's idempotency key, deadline, layer pacing and flag words are the sender's business
  // (its regions, its node): here every tile is expected and reported as it lands.
  RecordParams params;
  params.spec = v1::WithoutBlockTables(spec);
  params.spec.clear_idempotency_key();
  params.spec.clear_layerwise();
  params.spec.clear_ready_flags();
  params.spec.clear_arrival_flags();
  params.spec.clear_done_word();
  params.src = std::move(source);
  params.dst = dst;
  params.priority = ToClass(spec.priority());
  params.path = v1::PATH_FABRIC;
  params.path_reason =
      absl::StrCat("from node '", sender_node, "' (its transfer ", sender_transfer_id, ")");
  params.engine = &inbound_engine_;  // enqueues nothing: the fabric reports tiles as they land
  params.link = FabricLinkName(sender_node, options_.node_id);
  params.inbound = true;
  // The notification (kept in the spec) goes to the owner of `dst`; spec.session_id is a session
  // of the sender's daemon, meaningless here.
  params.spec.clear_session_id();
  Admission admission;
  admission.submitter_node = sender_node;
  admission.submitter_transfer_id = sender_transfer_id;
  KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<Record> record,
                          Admit(plan, std::move(params), admission));
  // The fabric let it in on the owner's write grant (spec.dst.grant, checked by the receiver):
  // its revocation, expiry or the owner's end stops it here too, before the next tile lands.
  if (!spec.dst().grant().empty()) {
    const LayerRange layers = TransferLayers(*dst, spec, spec.dst());
    grant_uses_->Add(record, {GrantUse{dst, 0, spec.dst().grant(), v1::GRANT_ACCESS_WRITE,
                                       layers.begin, layers.end, "spec.dst"}});
  }
  spdlog::info("transfer {} accepted: inbound from '{}' (its transfer {}), {} bytes, {} tiles",
               record->id(), sender_node, sender_transfer_id, plan.bytes_total(), plan.num_tiles());
  return Admitted{record->id(), record};
}

void TransferManagerImpl::EndInbound(uint64_t id, const absl::Status& why) {
  auto record = Find(id);
  if (record.ok()) End(*record, why);
}

}  // namespace kvrail::transfers

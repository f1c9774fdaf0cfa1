#include "proto/kvrail/v1/spec_copy.h"

namespace kvrail::v1 {
namespace {

// Every TransferEndpoint field but the three table encodings (spec_copy_test checks the list
// against the descriptor, so a new field cannot be forgotten here).
void CopyEndpoint(const TransferEndpoint& from, TransferEndpoint* to) {
  to->set_region_id(from.region_id());
  to->set_layer_begin(from.layer_begin());
  to->set_head_begin(from.head_begin());
  to->set_byte_offset(from.byte_offset());
  to->set_node_id(from.node_id());
  to->set_grant(from.grant());
}

}  // namespace

TransferSpec WithoutBlockTables(const TransferSpec& spec) {
  TransferSpec out;
  if (spec.has_src()) CopyEndpoint(spec.src(), out.mutable_src());
  if (spec.has_dst()) CopyEndpoint(spec.dst(), out.mutable_dst());
  out.set_num_layers(spec.num_layers());
  out.set_num_heads(spec.num_heads());
  out.set_num_tokens(spec.num_tokens());
  out.set_num_bytes(spec.num_bytes());
  out.set_priority(spec.priority());
  out.set_timeout_ms(spec.timeout_ms());
  out.set_idempotency_key(spec.idempotency_key());
  out.set_layerwise(spec.layerwise());
  out.set_label(spec.label());
  if (spec.has_ready_flags()) *out.mutable_ready_flags() = spec.ready_flags();
  if (spec.has_arrival_flags()) *out.mutable_arrival_flags() = spec.arrival_flags();
  out.set_notification(spec.notification());
  out.set_session_id(spec.session_id());
  out.set_digest(spec.digest());
  out.set_reinterpret_dtype(spec.reinterpret_dtype());
  if (spec.has_done_word()) *out.mutable_done_word() = spec.done_word();
  return out;
}

}  // namespace kvrail::v1

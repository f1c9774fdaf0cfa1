// Client's submit part (client_impl.h lists the parts): Submit and SubmitBatch over the
// submission queue, the session socket or gRPC, large block tables through the block-table
// region, and posts of prepared transfers.
#include <string.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "client/client_impl.h"
#include "client/completion_table.h"
#include "client/kvrail_client.h"
#include "client/submission_queue.h"
#include "proto/kvrail/v1/spec_copy.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "wire/session_wire.h"

namespace kvrail::client {
namespace {

// Large block tables travel as little-endian uint32s (TransferEndpoint.block_ids_le32): encoding
// and decoding them is a memcpy, not a varint per id (~1.9 ms saved for 100k + 100k ids).
constexpr int kCompactBlockTableFrom = 1024;

void CompactBlockTable(v1::TransferEndpoint* ep) {
  if (ep->block_ids_size() < kCompactBlockTableFrom || !ep->block_ids_le32().empty()) return;
  std::string* bytes = ep->mutable_block_ids_le32();
  bytes->resize(4 * static_cast<size_t>(ep->block_ids_size()));
  std::memcpy(bytes->data(), ep->block_ids().data(), bytes->size());  // little-endian hosts
  ep->clear_block_ids();
}

// Tables of this many ids or more (either side) go through shared memory on unix sockets.
constexpr size_t kSharedBlockTableFrom = 8192;

size_t TableIds(const v1::TransferEndpoint& ep) {
  return ep.block_ids_size() > 0 ? static_cast<size_t>(ep.block_ids_size())
                                 : ep.block_ids_le32().size() / 4;
}

// Writes `from`'s ids (either encoding) at base + offset as little-endian uint32s and points
// `to` (the same endpoint without its table) at them.
void PutTable(const v1::TransferEndpoint& from, v1::TransferEndpoint* to, uint8_t* base,
              uint64_t offset, uint64_t region) {
  const size_t n = TableIds(from);
  if (n == 0) return;  // no table on this side (a bytes region, or none given)
  if (from.block_ids_size() > 0) {
    std::memcpy(base + offset, from.block_ids().data(), 4 * n);  // little-endian hosts
  } else {
    std::memcpy(base + offset, from.block_ids_le32().data(), 4 * n);
  }
  v1::BlockTableRef* ref = to->mutable_block_table();
  ref->set_region_id(region);
  ref->set_offset_bytes(offset);
  ref->set_count(static_cast<uint32_t>(n));
  // Errors found after the answer (the daemon's deferred id checks) name the caller's field too.
  ref->set_named_as(from.block_ids_size() > 0 ? "block_ids" : "block_ids_le32");
}

}  // namespace
Client::QueuedResults Client::SubmitQueued(absl::Span<v1::SubmitTransferRequest* const> requests,
                                           bool with_done_word) {
  QueuedResults out(requests.size());
  if (impl_->submissions_.load() == nullptr || !impl_->session_submit_.load() ||
      impl_->unix_path_.empty()) {
    return out;
  }
  absl::StatusOr<std::shared_ptr<wire::SessionConnection>> session = impl_->Session();
  SubmissionQueue* queue = impl_->submissions_.load();  // the session's (null once it is lost)
  if (!session.ok() || queue == nullptr) return out;
  absl::InlinedVector<const v1::SubmitTransferRequest*, 4> within;
  absl::InlinedVector<size_t, 4> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i]->spec().dst().node_id().empty()) {
      within.push_back(requests[i]);
      index.push_back(i);
    }
  }
  if (within.empty()) return out;
  // The daemon posts these transfers' ends into the completion queue (when there is one), and
  // each carries a done word as a SUBMIT packet's does (SubmitRequest).
  CompletionTable* completions = impl_->completions_.load();
  const uint64_t mark = completions != nullptr ? completions->OverflowMark() : 0;
  absl::InlinedVector<std::optional<CompletionTable::DoneSlot>, 4> slots(within.size());
  if (with_done_word && completions != nullptr && impl_->options_.gpu_done_word &&
      EnableDoneWords(completions)) {
    for (size_t k = 0; k < within.size(); ++k) {
      v1::SubmitTransferRequest* request = requests[index[k]];
      if (request->spec().has_done_word()) continue;
      slots[k] = completions->TakeDoneSlot();
      if (!slots[k].has_value()) break;
      v1::DoneWord* word = request->mutable_spec()->mutable_done_word();
      word->set_region_id(slots[k]->region_id);
      word->set_byte_offset(uint64_t{8} * slots[k]->index);
      word->set_value(slots[k]->value);
    }
  }
  SubmissionQueue::Results results =
      queue->Submit(within, [conn = *session] { return conn->PeerClosed(); });
  for (size_t k = 0; k < results.size(); ++k) {
    v1::SubmitTransferRequest* request = requests[index[k]];
    if (!results[k].queued || !results[k].response.ok()) {
      if (slots[k].has_value()) {
        // Not taken, or refused: nothing stores the word.
        completions->ReturnDoneSlot(*slots[k]);
        request->mutable_spec()->clear_done_word();
      }
      if (!results[k].queued) continue;
      if (slots[k].has_value() &&
          absl::StrContains(results[k].response.status().message(), "spec.done_word")) {
        // The words' region went meanwhile (yielded to a registration): once more, without.
        out[index[k]] = SubmitRequest(*request, /*with_done_word=*/false);
        continue;
      }
    } else if (completions != nullptr) {
      // A deduplicated submit's transfer carries the first submit's word, not this one.
      const bool watch = slots[k].has_value() && !results[k].response->deduplicated();
      if (slots[k].has_value() && !watch) completions->ReturnDoneSlot(*slots[k]);
      completions->Follow(results[k].response->transfer_id(), mark,
                          watch ? slots[k] : std::optional<CompletionTable::DoneSlot>(),
                          results[k].response->bytes_total());
    }
    out[index[k]] = impl_->Checked(std::move(results[k].response));
  }
  return out;
}

std::pair<uint64_t, uint64_t> Client::SubmissionQueueCounts() {
  uint64_t queued = 0, handed_back = 0;
  absl::MutexLock lock(&impl_->session_mu_);
  for (const auto& queue : impl_->queues_) {
    queued += queue->queued();
    handed_back += queue->handed_back();
  }
  return {queued, handed_back};
}

absl::StatusOr<v1::SubmitTransferResponse> Client::SubmitRequest(v1::SubmitTransferRequest request,
                                                                 bool with_done_word, bool queue) {
  // Through the submission queue when the session has one and the request fits.
  if (queue) {
    if (std::optional<absl::StatusOr<v1::SubmitTransferResponse>> queued =
            std::move(SubmitQueued({&request}, with_done_word)[0]);
        queued.has_value()) {
      return *std::move(queued);
    }
  }
  // Transfers within this node, over the session socket when the daemon has one.
  if (impl_->session_submit_.load() && !impl_->unix_path_.empty() &&
      request.spec().dst().node_id().empty() &&
      request.ByteSizeLong() <= wire::kMaxSessionSubmitBytes) {
    absl::StatusOr<std::shared_ptr<wire::SessionConnection>> session = impl_->Session();
    if (session.ok()) {
      bool sent = false;
      // The daemon posts this transfer's end into the completion queue (when there is one).
      CompletionTable* completions = impl_->completions_.load();
      const uint64_t mark = completions != nullptr ? completions->OverflowMark() : 0;
      // Its done word: the GPU's stream stores it once the bytes landed (TransferSpec.done_word).
      std::optional<CompletionTable::DoneSlot> slot;
      if (with_done_word && completions != nullptr && impl_->options_.gpu_done_word &&
          !request.spec().has_done_word() && EnableDoneWords(completions)) {
        slot = completions->TakeDoneSlot();
        if (slot.has_value()) {
          v1::DoneWord* word = request.mutable_spec()->mutable_done_word();
          word->set_region_id(slot->region_id);
          word->set_byte_offset(uint64_t{8} * slot->index);
          word->set_value(slot->value);
        }
      }
      absl::StatusOr<std::string> answer = (*session)->Exchange(wire::EncodeSubmit(request), &sent);
      if (answer.ok()) {
        absl::StatusOr<v1::SubmitTransferResponse> response = wire::ParseSubmitAnswer(*answer);
        if (response.ok() && completions != nullptr) {
          // A deduplicated submit's transfer carries the first submit's word, not this one.
          const bool watch = slot.has_value() && !response->deduplicated();
          if (slot.has_value() && !watch) completions->ReturnDoneSlot(*slot);
          completions->Follow(response->transfer_id(), mark,
                              watch ? slot : std::optional<CompletionTable::DoneSlot>(),
                              response->bytes_total());
        } else if (slot.has_value()) {
          completions->ReturnDoneSlot(*slot);  // refused: nothing stores the word
          if (absl::StrContains(response.status().message(), "spec.done_word")) {
            // The words' region went meanwhile (yielded to a registration): once more, without.
            request.mutable_spec()->clear_done_word();
            return SubmitRequest(std::move(request), /*with_done_word=*/false, /*queue=*/false);
          }
        }
        if (response.status().code() != absl::StatusCode::kUnimplemented) {
          return impl_->Checked(std::move(response));
        }
        impl_->session_submit_.store(false);  // an older daemon: gRPC from now on
      } else if (sent) {
        // The daemon may have accepted it: never submit twice. Its slot is not given back: the
        // transfer may still store its word there.
        return answer.status();
      }
      if (slot.has_value()) {
        // Not accepted over the session: the gRPC submit below carries no word.
        completions->ReturnDoneSlot(*slot);
        request.mutable_spec()->clear_done_word();
      }
    }
  }
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::SubmitTransfer, request);
}
absl::StatusOr<v1::SubmitTransferResponse> Client::Submit(const v1::TransferSpec& given) {
  // A notification names the submitting session, so the daemon does not deliver it back here.
  v1::TransferSpec with_session;
  const bool fill = !given.notification().empty() && given.session_id() == 0;
  if (fill) {
    with_session = given;
    with_session.set_session_id(impl_->OpenSessionId());
  }
  const v1::TransferSpec& spec = fill ? with_session : given;
  const size_t src_ids = TableIds(spec.src()), dst_ids = TableIds(spec.dst());
  const bool in_message =
      !spec.src().has_block_table() && !spec.dst().has_block_table() &&
      (spec.src().block_ids_size() == 0 || spec.src().block_ids_le32().empty()) &&
      (spec.dst().block_ids_size() == 0 || spec.dst().block_ids_le32().empty());
  if (!impl_->unix_path_.empty() && in_message &&
      std::max(src_ids, dst_ids) >= kSharedBlockTableFrom) {
    absl::MutexLock lock(&impl_->table_mu_);
    const uint64_t need = 4 * static_cast<uint64_t>(src_ids + dst_ids);
    const absl::Status ready = PrepareTableBuffer(need);
    if (ready.ok()) {
      // The request carries the spec without its tables (no megabyte copies) plus references.
      v1::SubmitTransferRequest shared;
      *shared.mutable_spec() = v1::WithoutBlockTables(spec);
      uint8_t* base = impl_->table_buffer_->data();
      PutTable(spec.src(), shared.mutable_spec()->mutable_src(), base, kDoneWordsBytes,
               impl_->table_region_);
      PutTable(spec.dst(), shared.mutable_spec()->mutable_dst(), base,
               kDoneWordsBytes + 4 * src_ids, impl_->table_region_);
      absl::StatusOr<v1::SubmitTransferResponse> response = SubmitRequest(std::move(shared));
      // Only a table region that went away (unregistered by someone else) falls back to the
      // message below; every other answer is the transfer's, and the daemon's errors already
      // name the field the caller set (BlockTableRef.named_as).
      if (response.ok() ||
          !absl::StrContains(response.status().message(), ".block_table.region_id")) {
        return response;
      }
      impl_->table_region_ = 0;
      impl_->RetireTableBufferLocked();
    }
  }
  v1::SubmitTransferRequest request;
  *request.mutable_spec() = spec;
  CompactBlockTable(request.mutable_spec()->mutable_src());
  CompactBlockTable(request.mutable_spec()->mutable_dst());
  return SubmitRequest(std::move(request));
}

std::optional<v1::SubmitTransferRequest> Client::PlainRequest(const v1::TransferSpec& spec) {
  const size_t src_ids = TableIds(spec.src()), dst_ids = TableIds(spec.dst());
  if (!impl_->unix_path_.empty() && std::max(src_ids, dst_ids) >= kSharedBlockTableFrom) {
    return std::nullopt;  // Submit decides between the block-table region and the message
  }
  v1::SubmitTransferRequest request;
  *request.mutable_spec() = spec;
  if (!spec.notification().empty() && spec.session_id() == 0) {
    request.mutable_spec()->set_session_id(impl_->OpenSessionId());
  }
  CompactBlockTable(request.mutable_spec()->mutable_src());
  CompactBlockTable(request.mutable_spec()->mutable_dst());
  return request;
}

std::vector<absl::StatusOr<v1::SubmitTransferResponse>> Client::SubmitBatch(
    const std::vector<v1::TransferSpec>& specs) {
  std::vector<std::optional<v1::SubmitTransferRequest>> plain;
  std::vector<v1::SubmitTransferRequest*> batch;
  std::vector<size_t> index;
  plain.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    plain.push_back(PlainRequest(specs[i]));
    if (plain.back().has_value()) {
      batch.push_back(&*plain.back());
      index.push_back(i);
    }
  }
  QueuedResults queued = SubmitQueued(batch);
  std::vector<absl::StatusOr<v1::SubmitTransferResponse>> out(specs.size(),
                                                              absl::UnknownError("not submitted"));
  std::vector<bool> done(specs.size(), false);
  for (size_t k = 0; k < queued.size(); ++k) {
    if (queued[k].has_value()) {
      out[index[k]] = *std::move(queued[k]);
      done[index[k]] = true;
    }
  }
  // The rest one by one, in order: large block tables, transfers to other nodes, no queue, or
  // what the queue had no room for (by packet at once: the queue is full).
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!done[i]) {
      out[i] = plain[i].has_value()
                   ? SubmitRequest(*std::move(plain[i]), /*with_done_word=*/true, /*queue=*/false)
                   : Submit(specs[i]);
    }
  }
  return out;
}
absl::StatusOr<v1::SubmitTransferResponse> Client::PostPrepared(
    const v1::PostTransferRequest& request) {
  // Through the submission queue when the session has one and the post fits an entry (no socket
  // round trip), else over the session socket (one round trip, answered as a SUBMIT); either way
  // its end is posted into the completion queue.
  if (impl_->session_submit_.load() && !impl_->unix_path_.empty() &&
      request.ByteSizeLong() <= wire::kMaxSessionSubmitBytes) {
    absl::StatusOr<std::shared_ptr<wire::SessionConnection>> session = impl_->Session();
    if (session.ok()) {
      CompletionTable* completions = impl_->completions_.load();
      const uint64_t mark = completions != nullptr ? completions->OverflowMark() : 0;
      if (SubmissionQueue* queue = impl_->submissions_.load(); queue != nullptr) {
        SubmissionQueue::Result queued =
            queue->Post(request, [conn = *session] { return conn->PeerClosed(); });
        if (queued.queued) {
          if (queued.response.ok() && completions != nullptr) {
            completions->Follow(queued.response->transfer_id(), mark, std::nullopt,
                                queued.response->bytes_total());
          }
          return impl_->Checked(std::move(queued.response));
        }
      }
      bool sent = false;
      absl::StatusOr<std::string> answer = (*session)->Exchange(wire::EncodePost(request), &sent);
      if (!answer.ok()) {
        if (sent) return answer.status();  // the daemon may have taken it: never post twice
      } else {
        absl::StatusOr<v1::SubmitTransferResponse> response = wire::ParseSubmitAnswer(*answer);
        if (response.ok() && completions != nullptr) {
          completions->Follow(response->transfer_id(), mark, std::nullopt, response->bytes_total());
        }
        if (response.status().code() != absl::StatusCode::kUnimplemented) {
          return impl_->Checked(std::move(response));
        }
      }
    }
  }
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::PostTransfer, request);
}

}  // namespace kvrail::client

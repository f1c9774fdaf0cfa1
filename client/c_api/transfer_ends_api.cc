// The C ABI's fixed-size hot path (kvrail.h, kvrail_submitted / kvrail_transfer_end): a submit
// and a transfer's end answered in structs, and the completion queue's ends taken many at once,
// so that a caller in another language (the Python package) parses no message per transfer; a
// spec kept parsed (kvrail_spec), and a submit and an end whose arguments and answer are one
// struct in the caller's memory (kvrail_spec_submit, kvrail_end_wait), so that they cost that
// caller one argument each and no allocation.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "client/c_api/client_calls.h"
#include "client/c_api/entry.h"
#include "client/c_api/handle_table.h"
#include "client/c_api/kvrail.h"
#include "client/kvrail_client.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::c_api {

absl::StatusOr<v1::TransferStatus> WaitEnd(client::Client& client, uint64_t transfer_id,
                                           int64_t timeout_ms) {
  if (timeout_ms == 0) {
    int32_t local = 0;
    client.LocalStates(&transfer_id, 1, &local);
    if (!client::IsFinal(static_cast<v1::TransferState>(local))) return client.Get(transfer_id);
  }
  return client.WaitEnd(transfer_id,
                        timeout_ms < 0 ? absl::InfiniteDuration() : absl::Milliseconds(timeout_ms));
}

namespace {

// A struct the caller sized: `name`.struct_size must be this library's sizeof(T).
template <typename T>
absl::Status CheckStructSize(const T* in, const char* name) {
  if (in->struct_size != sizeof(T)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".struct_size: ", in->struct_size,
                                                   ", this library (ABI ", KVRAIL_ABI_VERSION,
                                                   ") knows ", sizeof(T)));
  }
  return absl::OkStatus();
}

// `status` as an end; true when the status says no more than the end's fields (every other
// field at its default, so the two serialize to the same size).
bool FillEnd(const v1::TransferStatus& status, kvrail_transfer_end* end) {
  end->transfer_id = status.transfer_id();
  end->state = static_cast<int32_t>(status.state());
  end->error_code = status.error_code();
  end->bytes_total = status.bytes_total();
  end->bytes_done = status.bytes_done();
  end->finished_unix_us = status.finished_unix_us();
  v1::TransferStatus fields;
  fields.set_transfer_id(status.transfer_id());
  fields.set_state(status.state());
  fields.set_error_code(status.error_code());
  fields.set_bytes_total(status.bytes_total());
  fields.set_bytes_done(status.bytes_done());
  fields.set_finished_unix_us(status.finished_unix_us());
  return fields.ByteSizeLong() == status.ByteSizeLong();
}

void ClearEnd(kvrail_transfer_end* end) {
  *end = kvrail_transfer_end{};
  end->struct_size = sizeof(kvrail_transfer_end);
}

// A submit's answer struct, checked and cleared before anything can fail.
absl::Status ResetSubmitted(kvrail_submitted* submitted) {
  KVRAIL_RETURN_IF_ERROR(RequireOut(submitted, "submitted"));
  KVRAIL_RETURN_IF_ERROR(CheckStructSize(submitted, "submitted"));
  *submitted = kvrail_submitted{};
  submitted->struct_size = sizeof(kvrail_submitted);
  return absl::OkStatus();
}

void FillSubmitted(const v1::SubmitTransferResponse& result, client::Client& client,
                   kvrail_submitted* submitted) {
  submitted->transfer_id = result.transfer_id();
  submitted->bytes_total = result.bytes_total();
  submitted->tiles_total = result.tiles_total();
  submitted->deduplicated = result.deduplicated() ? 1 : 0;
  submitted->followed = client.FollowsCompletion(result.transfer_id()) ? 1 : 0;
}

// A spec as kvrail_spec holds it: parsed once, never changed after (every submit copies it), and
// the client it belongs to (not kept alive by it).
struct SpecTemplate {
  std::weak_ptr<client::Client> client;
  v1::TransferSpec spec;
};

HandleTable<SpecTemplate>& SpecTemplates() {
  static auto* table = new HandleTable<SpecTemplate>();
  return *table;
}

// The spec a submit of this thread sends: a copy of the template reusing the memory of the last
// one (no allocation for a spec of the same shape). A nested submit on the thread (a callback
// submitting from inside one) gets a spec of its own.
class ThreadSpec {
 public:
  ThreadSpec() : spec_(busy_ ? &own_ : &scratch_), held_(!busy_) { busy_ = true; }
  ~ThreadSpec() {
    if (held_) busy_ = false;
  }
  ThreadSpec(const ThreadSpec&) = delete;
  ThreadSpec& operator=(const ThreadSpec&) = delete;

  v1::TransferSpec& spec() { return *spec_; }

 private:
  static thread_local v1::TransferSpec scratch_;
  static thread_local bool busy_;
  v1::TransferSpec own_;
  v1::TransferSpec* spec_;
  bool held_;
};

thread_local v1::TransferSpec ThreadSpec::scratch_;
thread_local bool ThreadSpec::busy_ = false;

}  // namespace
}  // namespace kvrail::c_api

using kvrail::c_api::CheckStructSize;
using kvrail::c_api::ClearEnd;
using kvrail::c_api::FillEnd;
using kvrail::c_api::FillSubmitted;
using kvrail::c_api::FindClient;
using kvrail::c_api::FindLive;
using kvrail::c_api::Guard;
using kvrail::c_api::HandleFrom;
using kvrail::c_api::HandleOf;
using kvrail::c_api::RequireOut;
using kvrail::c_api::ResetBytes;
using kvrail::c_api::ResetSubmitted;
using kvrail::c_api::SpecTemplate;
using kvrail::c_api::SpecTemplates;
using kvrail::c_api::ThreadSpec;
using kvrail::client::Client;
namespace v1 = kvrail::v1;

extern "C" {

int kvrail_submit_blocks_short(kvrail_client* handle, const uint8_t* spec, size_t spec_len,
                               const uint32_t* src_ids, size_t src_count, const uint32_t* dst_ids,
                               size_t dst_count, kvrail_submitted* submitted) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(ResetSubmitted(submitted));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    KVRAIL_ASSIGN_OR_RETURN(
        v1::TransferSpec parsed,
        kvrail::c_api::SpecWithIds(spec, spec_len, src_ids, src_count, dst_ids, dst_count));
    KVRAIL_ASSIGN_OR_RETURN(v1::SubmitTransferResponse result, client->Submit(parsed));
    FillSubmitted(result, *client, submitted);
    return absl::OkStatus();
  });
}

int kvrail_spec_create(kvrail_client* handle, const uint8_t* spec, size_t spec_len,
                       kvrail_spec** out) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(out, "out"));
    *out = nullptr;
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    auto held = std::make_shared<SpecTemplate>();
    KVRAIL_ASSIGN_OR_RETURN(held->spec,
                            kvrail::c_api::SpecWithIds(spec, spec_len, nullptr, 0, nullptr, 0));
    held->client = client;
    *out = HandleFrom<kvrail_spec>(SpecTemplates().Add(std::move(held)));
    return absl::OkStatus();
  });
}

int kvrail_submit_spec(kvrail_spec_submit* submit) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(submit, "submit"));
    // The size without `end` is a caller built before it: everything but the end.
    constexpr uint32_t kWithoutEnd = offsetof(kvrail_spec_submit, end);
    const bool with_end = submit->struct_size != kWithoutEnd;
    if (with_end) KVRAIL_RETURN_IF_ERROR(CheckStructSize(submit, "submit"));
    submit->submitted = kvrail_submitted{};
    submit->submitted.struct_size = sizeof(kvrail_submitted);
    if (with_end) {
      ClearEnd(&submit->end);
      submit->end_len = 0;
    }
    KVRAIL_ASSIGN_OR_RETURN(
        std::shared_ptr<SpecTemplate> held,
        FindLive(SpecTemplates(), submit->spec, "spec", "kvrail_spec", "freed"));
    const size_t src_count = submit->src_count, dst_count = submit->dst_count;
    const uint32_t* ids = submit->ids;
    if (src_count > INT32_MAX || dst_count > INT32_MAX) {
      return absl::InvalidArgumentError("src_count / dst_count: more than 2^31 - 1 ids");
    }
    if (ids == nullptr && src_count + dst_count > 0) {
      return absl::InvalidArgumentError("ids: NULL with src_count + dst_count > 0");
    }
    std::shared_ptr<Client> client = held->client.lock();
    if (client == nullptr) return absl::InvalidArgumentError("spec: its client was closed");
    ThreadSpec thread_spec;
    v1::TransferSpec& spec = thread_spec.spec();
    spec.CopyFrom(held->spec);
    if (src_count > 0) {
      auto* block_ids = spec.mutable_src()->mutable_block_ids();
      block_ids->Clear();
      block_ids->Add(ids, ids + src_count);
    }
    if (dst_count > 0) {
      auto* block_ids = spec.mutable_dst()->mutable_block_ids();
      block_ids->Clear();
      block_ids->Add(ids + src_count, ids + src_count + dst_count);
    }
    KVRAIL_ASSIGN_OR_RETURN(v1::SubmitTransferResponse result, client->Submit(spec));
    FillSubmitted(result, *client, &submit->submitted);
    if (with_end && submit->submitted.followed != 0) {
      if (std::optional<v1::TransferStatus> end = client->EndIfSeen(result.transfer_id())) {
        const size_t size = end->ByteSizeLong();
        if (size <= sizeof(submit->end_status)) {  // always: six scalar fields
          FillEnd(*end, &submit->end);
          end->SerializeWithCachedSizesToArray(submit->end_status);
          submit->end_len = static_cast<uint32_t>(size);
        }
      }
    }
    return absl::OkStatus();
  });
}

int kvrail_spec_free(kvrail_spec* handle) {
  return Guard([&]() -> absl::Status {
    if (handle == nullptr) return absl::OkStatus();
    if (SpecTemplates().Remove(HandleOf(handle)) == nullptr) {
      return absl::InvalidArgumentError(
          "spec: not a live kvrail_spec handle (freed, or never issued)");
    }
    return absl::OkStatus();
  });
}

int kvrail_wait_end_short(kvrail_client* handle, uint64_t transfer_id, int64_t timeout_ms,
                          kvrail_transfer_end* end, uint8_t** status, size_t* status_len) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(end, "end"));
    KVRAIL_RETURN_IF_ERROR(CheckStructSize(end, "end"));
    ClearEnd(end);
    KVRAIL_RETURN_IF_ERROR(ResetBytes(status, status_len, "status"));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    KVRAIL_ASSIGN_OR_RETURN(v1::TransferStatus result,
                            kvrail::c_api::WaitEnd(*client, transfer_id, timeout_ms));
    if (FillEnd(result, end)) return absl::OkStatus();
    end->flags |= KVRAIL_END_MORE;
    return kvrail::c_api::PutBytes(result, status, status_len);
  });
}

int kvrail_wait_end_into(kvrail_end_wait* wait) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(wait, "wait"));
    KVRAIL_RETURN_IF_ERROR(CheckStructSize(wait, "wait"));
    wait->len = 0;
    wait->heap = nullptr;
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(wait->client));
    KVRAIL_ASSIGN_OR_RETURN(v1::TransferStatus result,
                            kvrail::c_api::WaitEnd(*client, wait->transfer_id, wait->timeout_ms));
    const size_t size = result.ByteSizeLong();
    if (size <= sizeof(wait->data)) {
      result.SerializeWithCachedSizesToArray(wait->data);
      wait->len = static_cast<uint32_t>(size);
      return absl::OkStatus();
    }
    size_t len = 0;
    KVRAIL_RETURN_IF_ERROR(kvrail::c_api::PutBytes(result, &wait->heap, &len));
    wait->len = static_cast<uint32_t>(len);  // a status is far below 4 GiB
    return absl::OkStatus();
  });
}

int kvrail_take_ends(kvrail_client* handle, kvrail_transfer_end* ends, size_t max, size_t* count) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(count, "count"));
    *count = 0;
    if (max == 0) return FindClient(handle).status();
    if (ends == nullptr) return absl::InvalidArgumentError("ends: NULL with max > 0");
    KVRAIL_RETURN_IF_ERROR(CheckStructSize(ends, "ends[0]"));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    // Taken in bounded chunks: `max` is the caller's array, not a size to allocate (a huge one
    // would throw out of the allocation, or abort under a sanitizer).
    constexpr size_t kChunk = 256;
    uint64_t ids[kChunk];
    int32_t states[kChunk];
    size_t taken = 0;
    while (taken < max) {
      const size_t want = std::min(kChunk, max - taken);
      const size_t n = client->TakeCompletions(ids, want);
      client->LocalStates(ids, n, states);
      for (size_t i = 0; i < n; ++i) {
        kvrail_transfer_end* end = &ends[taken + i];
        ClearEnd(end);
        end->transfer_id = ids[i];
        end->flags = KVRAIL_END_ASK;
        // A success is read from the queue; a failure's message, and what the queue cannot tell,
        // are the daemon's: left to the caller, so this call never waits on the daemon for them.
        if (states[i] != v1::TRANSFER_STATE_SUCCEEDED) continue;
        absl::StatusOr<v1::TransferStatus> status =
            client->WaitEnd(ids[i], absl::InfiniteDuration());
        if (!status.ok() || !kvrail::client::IsFinal(status->state())) continue;
        end->flags = FillEnd(*status, end) ? 0 : KVRAIL_END_MORE;
      }
      taken += n;
      if (n < want) break;
    }
    *count = taken;
    return absl::OkStatus();
  });
}

}  // extern "C"

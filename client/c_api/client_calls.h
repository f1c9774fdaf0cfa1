// Internal to //client/c_api: what the transfer entry points of c_api.cc and
// transfer_ends_api.cc share - a live handle's object, the client behind a handle and a spec with
// its block ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/c_api/entry.h"
#include "client/c_api/handle_table.h"
#include "client/c_api/kvrail.h"
#include "client/kvrail_client.h"
#include "google/protobuf/message_lite.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::c_api {

// The live object behind a handle of `table`; INVALID_ARGUMENT naming the argument `name` for
// NULL and for a handle that is `ended` (closed, freed, released) or was never issued.
template <typename T, typename Handle>
absl::StatusOr<std::shared_ptr<T>> FindLive(HandleTable<T>& table, Handle* handle,
                                            absl::string_view name, absl::string_view type,
                                            absl::string_view ended) {
  if (handle == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, ": NULL"));
  std::shared_ptr<T> found = table.Find(HandleOf(handle));
  if (found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not a live ", type, " handle (", ended, ", or never issued)"));
  }
  return found;
}

// The live client behind `handle`; INVALID_ARGUMENT naming "client" for NULL and for a handle
// that was closed or never issued.
absl::StatusOr<std::shared_ptr<client::Client>> FindClient(kvrail_client* handle);

// Clears an optional (out, out_len) pair so that no failure leaves garbage in it; the error names
// `name`_len when only `out` is given.
absl::Status ResetBytes(uint8_t** out, size_t* out_len, const char* name);

// Serializes `message` into malloc'ed bytes for an optional out pair (kvrail_free releases them).
absl::Status PutBytes(const google::protobuf::MessageLite& message, uint8_t** out, size_t* out_len);

// kvrail_wait_end's answer: the end from the completion queue when it holds it (no call), else
// the daemon's status; `timeout_ms` as kvrail_wait's (< 0: until it ends, 0: now).
absl::StatusOr<v1::TransferStatus> WaitEnd(client::Client& client, uint64_t transfer_id,
                                           int64_t timeout_ms);

// `spec` (a serialized TransferSpec, its errors naming "spec") with its src / dst block ids
// replaced by the `src_count` / `dst_count` ids given (none given: the spec's own are kept).
absl::StatusOr<v1::TransferSpec> SpecWithIds(const uint8_t* spec, size_t spec_len,
                                             const uint32_t* src_ids, size_t src_count,
                                             const uint32_t* dst_ids, size_t dst_count);

}  // namespace kvrail::c_api

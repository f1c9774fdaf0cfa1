// The C ABI of kvrail.h over the C++ client (client/kvrail_client.h, client/cuda_export.h).
// Every entry point: look the handles up (HandleTable), convert the arguments, call the C++
// client, and leave the result in the calling thread's last error. No C++ exception crosses the
// ABI (each body runs under Guard).
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
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
#include "client/cuda_export.h"
#include "client/kvrail_client.h"
#include "google/protobuf/message_lite.h"
#include "layout/paged_layout.h"

namespace kvrail::c_api {

LastError& Last() {
  thread_local LastError last;
  return last;
}

namespace {

using client::Client;
using client::HostBuffer;

HandleTable<Client>& Clients() {
  // Never destroyed: clients still open at exit are released by the process's end (the daemon
  // sees the session close), not by static destructors racing gRPC's own shutdown.
  static auto* table = new HandleTable<Client>();
  return *table;
}

HandleTable<HostBuffer>& Buffers() {
  static auto* table = new HandleTable<HostBuffer>();
  return *table;
}

// A prepared transfer as the C ABI holds it: the daemon's id and the client it belongs to (not
// kept alive by it: a closed client's session is gone, and the daemon freed its prepared ids).
struct Prepared {
  std::weak_ptr<Client> client;
  uint64_t id = 0;
};

HandleTable<Prepared>& PreparedTable() {
  static auto* table = new HandleTable<Prepared>();
  return *table;
}

absl::StatusOr<std::shared_ptr<Prepared>> FindPrepared(kvrail_prepared* handle) {
  return FindLive(PreparedTable(), handle, "prepared", "kvrail_prepared", "released");
}

absl::StatusOr<std::shared_ptr<HostBuffer>> FindBuffer(kvrail_host_buffer* handle) {
  return FindLive(Buffers(), handle, "buffer", "kvrail_host_buffer", "freed");
}

// Parses `len` bytes as a `T`; the error names the argument and the expected message type.
template <typename T>
absl::StatusOr<T> Parse(const uint8_t* data, size_t len, const char* name) {
  T message;
  if (len == 0) return message;  // every field at its default
  if (data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": NULL with length ", len));
  }
  if (len > static_cast<size_t>(INT32_MAX) ||
      !message.ParseFromArray(data, static_cast<int>(len))) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", len, " bytes are not a serialized ", message.GetTypeName()));
  }
  return message;
}

// The out parameters of a registration: `region_id` required, the RegionInfo bytes optional;
// cleared before anything can fail so a failed call leaves nothing stale.
absl::Status ResetRegionOuts(uint64_t* region_id, uint8_t** info, size_t* info_len) {
  KVRAIL_RETURN_IF_ERROR(RequireOut(region_id, "region_id"));
  *region_id = 0;
  return ResetBytes(info, info_len, "info");
}

absl::Status PutStatus(const v1::TransferStatus& status, int32_t* state, uint8_t** out,
                       size_t* out_len) {
  if (state != nullptr) *state = static_cast<int32_t>(status.state());
  return PutBytes(status, out, out_len);
}

absl::Status PutRegion(const v1::RegionInfo& info, uint64_t* region_id, uint8_t** out,
                       size_t* out_len) {
  *region_id = info.region_id();
  return PutBytes(info, out, out_len);
}

// The struct as the message, unchecked: the values are judged by the one validator
// (layout/paged_layout.h), here or by the daemon, never by rules of the C ABI's own.
absl::StatusOr<v1::PagedKvLayout> ToLayout(const kvrail_paged_layout* in) {
  if (in == nullptr) return absl::InvalidArgumentError("layout: NULL");
  if (in->struct_size != sizeof(kvrail_paged_layout)) {
    return absl::InvalidArgumentError(absl::StrCat("layout.struct_size: ", in->struct_size,
                                                   ", this library (ABI ", KVRAIL_ABI_VERSION,
                                                   ") knows ", sizeof(kvrail_paged_layout)));
  }
  v1::PagedKvLayout out;
  out.set_num_layers(in->num_layers);
  out.set_num_parts(in->num_parts);
  out.set_num_blocks(in->num_blocks);
  out.set_tokens_per_block(in->tokens_per_block);
  out.set_num_heads(in->num_heads);
  out.set_head_dim(in->head_dim);
  out.set_dtype(static_cast<v1::DType>(in->dtype));
  out.set_order(static_cast<v1::LayoutOrder>(in->order));
  out.set_layer_stride(in->layer_stride);
  out.set_part_stride(in->part_stride);
  out.set_block_stride(in->block_stride);
  out.set_token_stride(in->token_stride);
  out.set_head_stride(in->head_stride);
  out.set_offset_bytes(in->offset_bytes);
  return out;
}

// kvrail_paged_layout_check: the one validator, its errors naming "layout.<field>".
absl::Status CheckLayout(const kvrail_paged_layout* in, uint64_t region_bytes, uint32_t flags,
                         uint64_t* bytes) {
  if (bytes != nullptr) *bytes = 0;
  if ((flags & ~KVRAIL_LAYOUT_PER_LAYER) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("flags: unknown bits ", flags));
  }
  KVRAIL_ASSIGN_OR_RETURN(const v1::PagedKvLayout converted, ToLayout(in));
  layout::CheckOptions options;
  options.field_prefix = "layout.";
  if (region_bytes != 0) options.region_bytes = region_bytes;
  options.per_layer = (flags & KVRAIL_LAYOUT_PER_LAYER) != 0;
  KVRAIL_ASSIGN_OR_RETURN(const layout::ResolvedLayout resolved,
                          layout::CheckPagedLayout(converted, options));
  if (bytes != nullptr) *bytes = resolved.end;
  return absl::OkStatus();
}

// What kvrail_get/wait/cancel share: resolve the client, clear the outputs, run `call`.
template <typename Call>
int StatusCall(kvrail_client* handle, int32_t* state, uint8_t** status, size_t* status_len,
               Call&& call) {
  return Guard([&]() -> absl::Status {
    if (state != nullptr) *state = KVRAIL_STATE_UNSPECIFIED;
    KVRAIL_RETURN_IF_ERROR(ResetBytes(status, status_len, "status"));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    KVRAIL_ASSIGN_OR_RETURN(v1::TransferStatus result, call(*client));
    return PutStatus(result, state, status, status_len);
  });
}

// What the list calls share: resolve the client, run `call`, serialize its answer.
template <typename Call>
int MessageCall(kvrail_client* handle, uint8_t** out, size_t* out_len, Call&& call) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(out, "out"));
    KVRAIL_RETURN_IF_ERROR(ResetBytes(out, out_len, "out"));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    KVRAIL_ASSIGN_OR_RETURN(auto result, call(*client));
    return PutBytes(result, out, out_len);
  });
}

}  // namespace

// Clears an optional (out, out_len) pair so that no failure leaves garbage in it.
absl::Status ResetBytes(uint8_t** out, size_t* out_len, const char* name) {
  if (out == nullptr) return absl::OkStatus();
  *out = nullptr;
  if (out_len == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, "_len: NULL while ", name, " is set"));
  }
  *out_len = 0;
  return absl::OkStatus();
}

// Serializes `message` into malloc'ed bytes for an optional out pair (kvrail_free releases them).
absl::Status PutBytes(const google::protobuf::MessageLite& message, uint8_t** out,
                      size_t* out_len) {
  if (out == nullptr) return absl::OkStatus();
  const size_t size = message.ByteSizeLong();
  auto* bytes = static_cast<uint8_t*>(std::malloc(size == 0 ? 1 : size));
  if (bytes == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("kvrail: malloc(", size, ") failed"));
  }
  if (size > 0 && !message.SerializeToArray(bytes, static_cast<int>(size))) {
    std::free(bytes);
    return absl::InternalError(absl::StrCat("kvrail: could not serialize ", message.GetTypeName()));
  }
  *out = bytes;
  *out_len = size;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Client>> FindClient(kvrail_client* handle) {
  return FindLive(Clients(), handle, "client", "kvrail_client", "closed");
}

absl::StatusOr<v1::TransferSpec> SpecWithIds(const uint8_t* spec, size_t spec_len,
                                             const uint32_t* src_ids, size_t src_count,
                                             const uint32_t* dst_ids, size_t dst_count) {
  if (src_count > 0 && src_ids == nullptr) {
    return absl::InvalidArgumentError("src_ids: NULL with src_count > 0");
  }
  if (dst_count > 0 && dst_ids == nullptr) {
    return absl::InvalidArgumentError("dst_ids: NULL with dst_count > 0");
  }
  if (src_count > INT32_MAX || dst_count > INT32_MAX) {
    return absl::InvalidArgumentError("src_count / dst_count: more than 2^31 - 1 ids");
  }
  KVRAIL_ASSIGN_OR_RETURN(v1::TransferSpec parsed, Parse<v1::TransferSpec>(spec, spec_len, "spec"));
  if (src_count > 0) {
    auto* ids = parsed.mutable_src()->mutable_block_ids();
    ids->Clear();
    ids->Add(src_ids, src_ids + src_count);
  }
  if (dst_count > 0) {
    auto* ids = parsed.mutable_dst()->mutable_block_ids();
    ids->Clear();
    ids->Add(dst_ids, dst_ids + dst_count);
  }
  return parsed;
}

}  // namespace kvrail::c_api

using kvrail::c_api::Buffers;
using kvrail::c_api::Clients;
using kvrail::c_api::FindBuffer;
using kvrail::c_api::FindClient;
using kvrail::c_api::FindPrepared;
using kvrail::c_api::Guard;
using kvrail::c_api::HandleFrom;
using kvrail::c_api::HandleOf;
using kvrail::c_api::Parse;
using kvrail::c_api::PreparedTable;
using kvrail::c_api::PutBytes;
using kvrail::c_api::PutRegion;
using kvrail::c_api::RequireOut;
using kvrail::c_api::ResetBytes;
using kvrail::c_api::ResetRegionOuts;
using kvrail::c_api::SpecWithIds;
using kvrail::client::Client;
using kvrail::client::HostBuffer;
namespace v1 = kvrail::v1;

extern "C" {

uint32_t kvrail_abi_version(void) { return KVRAIL_ABI_VERSION; }

const char* kvrail_last_error_message(void) { return kvrail::c_api::Last().message.c_str(); }

int kvrail_last_error_code(void) { return kvrail::c_api::Last().code; }

void kvrail_free(void* bytes) { std::free(bytes); }

int kvrail_connect(const char* target, int64_t probe_timeout_ms, kvrail_client** out) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(out, "out"));
    *out = nullptr;
    const std::string where =
        (target == nullptr || target[0] == '\0') ? kvrail::client::DefaultTarget() : target;
    const absl::Duration probe =
        probe_timeout_ms > 0 ? absl::Milliseconds(probe_timeout_ms) : absl::Seconds(3);
    KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(where, probe));
    *out = HandleFrom<kvrail_client>(Clients().Add(std::move(client)));
    return absl::OkStatus();
  });
}

void kvrail_close(kvrail_client* client) {
  Guard([&]() -> absl::Status {
    if (client != nullptr) Clients().Remove(HandleOf(client));  // dropped here, outside the lock
    return absl::OkStatus();
  });
}

int kvrail_session_id(kvrail_client* handle, uint64_t* out) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(out, "out"));
    *out = 0;
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    KVRAIL_ASSIGN_OR_RETURN(*out, client->SessionId());
    return absl::OkStatus();
  });
}

int kvrail_host_buffer_create(uint64_t bytes, const char* name, kvrail_host_buffer** out) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(out, "out"));
    *out = nullptr;
    if (bytes == 0) return absl::InvalidArgumentError("bytes: must be > 0");
    const std::string label = name != nullptr && name[0] != '\0' ? name : "kvrail-host-buffer";
    KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<HostBuffer> buffer, HostBuffer::Create(bytes, label));
    *out = HandleFrom<kvrail_host_buffer>(Buffers().Add(std::move(buffer)));
    return absl::OkStatus();
  });
}

void kvrail_host_buffer_free(kvrail_host_buffer* buffer) {
  Guard([&]() -> absl::Status {
    if (buffer != nullptr) Buffers().Remove(HandleOf(buffer));
    return absl::OkStatus();
  });
}

void* kvrail_host_buffer_data(kvrail_host_buffer* handle) {
  void* data = nullptr;
  Guard([&]() -> absl::Status {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> buffer, FindBuffer(handle));
    data = buffer->data();
    return absl::OkStatus();
  });
  return data;
}

uint64_t kvrail_host_buffer_size(kvrail_host_buffer* handle) {
  uint64_t size = 0;
  Guard([&]() -> absl::Status {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> buffer, FindBuffer(handle));
    size = buffer->size();
    return absl::OkStatus();
  });
  return size;
}

int kvrail_register_host_buffer(kvrail_client* handle, kvrail_host_buffer* buffer_handle,
                                const uint8_t* spec, size_t spec_len, uint64_t* region_id,
                                uint8_t** info, size_t* info_len) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(ResetRegionOuts(region_id, info, info_len));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> buffer, FindBuffer(buffer_handle));
    KVRAIL_ASSIGN_OR_RETURN(v1::RegionSpec parsed, Parse<v1::RegionSpec>(spec, spec_len, "spec"));
    KVRAIL_ASSIGN_OR_RETURN(v1::RegionInfo result,
                            client->RegisterHostBuffer(*buffer, std::move(parsed)));
    return PutRegion(result, region_id, info, info_len);
  });
}

int kvrail_register_host_fd(kvrail_client* handle, int fd, uint64_t offset, uint64_t bytes,
                            const uint8_t* spec, size_t spec_len, uint64_t* region_id,
                            uint8_t** info, size_t* info_len) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(ResetRegionOuts(region_id, info, info_len));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    KVRAIL_ASSIGN_OR_RETURN(v1::RegionSpec parsed, Parse<v1::RegionSpec>(spec, spec_len, "spec"));
    KVRAIL_ASSIGN_OR_RETURN(v1::RegionInfo result,
                            client->RegisterHostFd(fd, offset, bytes, std::move(parsed)));
    return PutRegion(result, region_id, info, info_len);
  });
}

int kvrail_register_region(kvrail_client* handle, const uint8_t* spec, size_t spec_len,
                           uint64_t* region_id, uint8_t** info, size_t* info_len) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(ResetRegionOuts(region_id, info, info_len));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    KVRAIL_ASSIGN_OR_RETURN(v1::RegionSpec parsed, Parse<v1::RegionSpec>(spec, spec_len, "spec"));
    KVRAIL_ASSIGN_OR_RETURN(const uint64_t session, client->SessionId());
    KVRAIL_ASSIGN_OR_RETURN(v1::RegionInfo result,
                            client->RegisterRegion(std::move(parsed), session));
    return PutRegion(result, region_id, info, info_len);
  });
}

int kvrail_unregister_region(kvrail_client* handle, uint64_t region_id) {
  return Guard([&]() -> absl::Status {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    return client->UnregisterRegion(region_id);
  });
}

int kvrail_paged_layout_bytes(const kvrail_paged_layout* layout, uint64_t* bytes) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(bytes, "bytes"));
    return kvrail::c_api::CheckLayout(layout, 0, 0, bytes);
  });
}

int kvrail_paged_layout_check(const kvrail_paged_layout* layout, uint64_t region_bytes,
                              uint32_t flags, uint64_t* bytes) {
  return Guard([&]() -> absl::Status {
    return kvrail::c_api::CheckLayout(layout, region_bytes, flags, bytes);
  });
}

int kvrail_register_paged_host(kvrail_client* handle, kvrail_host_buffer* buffer_handle,
                               const kvrail_paged_layout* layout, int writable, const char* name,
                               uint64_t* region_id) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(region_id, "region_id"));
    *region_id = 0;
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> buffer, FindBuffer(buffer_handle));
    v1::RegionSpec spec;
    KVRAIL_ASSIGN_OR_RETURN(*spec.mutable_paged_kv(), kvrail::c_api::ToLayout(layout));
    if (name != nullptr) spec.set_name(name);
    spec.set_writable(writable != 0);
    KVRAIL_ASSIGN_OR_RETURN(v1::RegionInfo result,
                            client->RegisterHostBuffer(*buffer, std::move(spec)));
    *region_id = result.region_id();
    return absl::OkStatus();
  });
}

int kvrail_register_cuda(kvrail_client* handle, const void* device_ptr, uint64_t bytes,
                         const uint8_t* spec, size_t spec_len, uint64_t* region_id, uint8_t** info,
                         size_t* info_len) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(ResetRegionOuts(region_id, info, info_len));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    if (device_ptr == nullptr) return absl::InvalidArgumentError("device_ptr: NULL");
    KVRAIL_ASSIGN_OR_RETURN(v1::RegionSpec parsed, Parse<v1::RegionSpec>(spec, spec_len, "spec"));
    KVRAIL_ASSIGN_OR_RETURN(
        v1::RegionInfo result,
        kvrail::client::RegisterCudaRegion(*client, device_ptr, bytes, std::move(parsed)));
    return PutRegion(result, region_id, info, info_len);
  });
}

int kvrail_register_cuda_layers(kvrail_client* handle, const void* const* layer_ptrs,
                                size_t num_layers, uint64_t layer_bytes, const uint8_t* spec,
                                size_t spec_len, uint64_t* region_id, uint8_t** info,
                                size_t* info_len) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(ResetRegionOuts(region_id, info, info_len));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    if (layer_ptrs == nullptr || num_layers == 0) {
      return absl::InvalidArgumentError("layer_ptrs: NULL or num_layers 0");
    }
    std::vector<const void*> ptrs(layer_ptrs, layer_ptrs + num_layers);
    for (size_t i = 0; i < ptrs.size(); ++i) {
      if (ptrs[i] == nullptr)
        return absl::InvalidArgumentError(absl::StrCat("layer_ptrs[", i, "]: NULL"));
    }
    KVRAIL_ASSIGN_OR_RETURN(v1::RegionSpec parsed, Parse<v1::RegionSpec>(spec, spec_len, "spec"));
    KVRAIL_ASSIGN_OR_RETURN(
        v1::RegionInfo result,
        kvrail::client::RegisterCudaLayers(*client, ptrs, layer_bytes, std::move(parsed)));
    return PutRegion(result, region_id, info, info_len);
  });
}

int kvrail_register_host_layers(kvrail_client* handle, kvrail_host_buffer* const* buffers,
                                const uint64_t* offsets, size_t num_layers, const uint8_t* spec,
                                size_t spec_len, uint64_t* region_id, uint8_t** info,
                                size_t* info_len) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(ResetRegionOuts(region_id, info, info_len));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    if (buffers == nullptr || num_layers == 0) {
      return absl::InvalidArgumentError("buffers: NULL or num_layers 0");
    }
    // Held for the call: a buffer freed by another thread meanwhile stays mapped until we return.
    std::vector<std::shared_ptr<HostBuffer>> held;
    std::vector<Client::HostLayer> layers;
    for (size_t i = 0; i < num_layers; ++i) {
      absl::StatusOr<std::shared_ptr<HostBuffer>> buffer = FindBuffer(buffers[i]);
      if (!buffer.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("buffers[", i, "]: ", buffer.status().message()));
      }
      layers.push_back({buffer->get(), offsets != nullptr ? offsets[i] : 0});
      held.push_back(*std::move(buffer));
    }
    KVRAIL_ASSIGN_OR_RETURN(v1::RegionSpec parsed, Parse<v1::RegionSpec>(spec, spec_len, "spec"));
    KVRAIL_ASSIGN_OR_RETURN(v1::RegionInfo result,
                            client->RegisterHostLayers(layers, std::move(parsed)));
    return PutRegion(result, region_id, info, info_len);
  });
}

int kvrail_submit(kvrail_client* handle, const uint8_t* spec, size_t spec_len,
                  uint64_t* transfer_id, uint8_t** response, size_t* response_len) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(transfer_id, "transfer_id"));
    *transfer_id = 0;
    KVRAIL_RETURN_IF_ERROR(ResetBytes(response, response_len, "response"));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    KVRAIL_ASSIGN_OR_RETURN(v1::TransferSpec parsed,
                            Parse<v1::TransferSpec>(spec, spec_len, "spec"));
    KVRAIL_ASSIGN_OR_RETURN(v1::SubmitTransferResponse result, client->Submit(parsed));
    *transfer_id = result.transfer_id();
    return PutBytes(result, response, response_len);
  });
}

int kvrail_submit_batch(kvrail_client* handle, const uint8_t* const* specs, const size_t* spec_lens,
                        size_t count, uint64_t* transfer_ids, int32_t* codes) {
  return Guard([&]() -> absl::Status {
    if (count > 0) {
      if (specs == nullptr) return absl::InvalidArgumentError("specs: NULL with count > 0");
      if (spec_lens == nullptr) {
        return absl::InvalidArgumentError("spec_lens: NULL with count > 0");
      }
      KVRAIL_RETURN_IF_ERROR(RequireOut(transfer_ids, "transfer_ids"));
    }
    for (size_t i = 0; i < count; ++i) {
      transfer_ids[i] = 0;
      if (codes != nullptr) codes[i] = KVRAIL_OK;
    }
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    // Every spec is parsed before anything is submitted: a malformed one submits nothing.
    std::vector<v1::TransferSpec> parsed(count);
    for (size_t i = 0; i < count; ++i) {
      absl::StatusOr<v1::TransferSpec> spec =
          Parse<v1::TransferSpec>(specs[i], spec_lens[i], absl::StrCat("specs[", i, "]").c_str());
      if (!spec.ok()) {
        if (codes != nullptr) codes[i] = static_cast<int32_t>(spec.status().code());
        return spec.status();
      }
      parsed[i] = *std::move(spec);
    }
    std::vector<absl::StatusOr<v1::SubmitTransferResponse>> results = client->SubmitBatch(parsed);
    absl::Status first = absl::OkStatus();
    for (size_t i = 0; i < count; ++i) {
      if (results[i].ok()) {
        transfer_ids[i] = results[i]->transfer_id();
        continue;
      }
      if (codes != nullptr) codes[i] = static_cast<int32_t>(results[i].status().code());
      if (first.ok()) {
        first = absl::Status(results[i].status().code(),
                             absl::StrCat("specs[", i, "]: ", results[i].status().message()));
      }
    }
    return first;
  });
}

int kvrail_submit_blocks(kvrail_client* handle, const uint8_t* spec, size_t spec_len,
                         const uint32_t* src_ids, size_t src_count, const uint32_t* dst_ids,
                         size_t dst_count, uint64_t* transfer_id, uint8_t** response,
                         size_t* response_len) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(transfer_id, "transfer_id"));
    *transfer_id = 0;
    KVRAIL_RETURN_IF_ERROR(ResetBytes(response, response_len, "response"));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    KVRAIL_ASSIGN_OR_RETURN(v1::TransferSpec parsed,
                            SpecWithIds(spec, spec_len, src_ids, src_count, dst_ids, dst_count));
    KVRAIL_ASSIGN_OR_RETURN(v1::SubmitTransferResponse result, client->Submit(parsed));
    *transfer_id = result.transfer_id();
    return PutBytes(result, response, response_len);
  });
}

int kvrail_wait(kvrail_client* handle, uint64_t transfer_id, int64_t timeout_ms, int32_t* state,
                uint8_t** status, size_t* status_len) {
  return kvrail::c_api::StatusCall(handle, state, status, status_len, [&](Client& client) {
    if (timeout_ms == 0) {
      // An end the completion queue holds is read from it (no call).
      int32_t local = 0;
      client.LocalStates(&transfer_id, 1, &local);
      if (!kvrail::client::IsFinal(static_cast<v1::TransferState>(local))) {
        return client.Get(transfer_id);
      }
    }
    // The C++ client waits without limit for a zero or infinite timeout.
    return client.Wait(transfer_id,
                       timeout_ms < 0 ? absl::InfiniteDuration() : absl::Milliseconds(timeout_ms));
  });
}

int kvrail_wait_end(kvrail_client* handle, uint64_t transfer_id, int64_t timeout_ms, int32_t* state,
                    uint8_t** status, size_t* status_len) {
  return kvrail::c_api::StatusCall(handle, state, status, status_len, [&](Client& client) {
    return kvrail::c_api::WaitEnd(client, transfer_id, timeout_ms);
  });
}

int kvrail_get(kvrail_client* handle, uint64_t transfer_id, int32_t* state, uint8_t** status,
               size_t* status_len) {
  return kvrail::c_api::StatusCall(handle, state, status, status_len,
                                   [&](Client& client) { return client.Get(transfer_id); });
}

int kvrail_cancel(kvrail_client* handle, uint64_t transfer_id, int32_t* state, uint8_t** status,
                  size_t* status_len) {
  return kvrail::c_api::StatusCall(handle, state, status, status_len,
                                   [&](Client& client) { return client.Cancel(transfer_id); });
}

int kvrail_mark_ready(kvrail_client* handle, uint64_t transfer_id, uint32_t layer_begin,
                      uint32_t layer_count) {
  return Guard([&]() -> absl::Status {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    return client->MarkReady(transfer_id, layer_begin, layer_count);
  });
}

int kvrail_poll(kvrail_client* handle, const uint64_t* ids, size_t count, int32_t* states,
                int32_t* codes) {
  return Guard([&]() -> absl::Status {
    if (count > 0) {
      if (ids == nullptr) return absl::InvalidArgumentError("ids: NULL with count > 0");
      KVRAIL_RETURN_IF_ERROR(RequireOut(states, "states"));
    }
    for (size_t i = 0; i < count; ++i) {
      states[i] = KVRAIL_STATE_UNSPECIFIED;
      if (codes != nullptr) codes[i] = KVRAIL_OK;
    }
    // Checked with nothing to poll too: a closed handle is never answered OK.
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    if (count == 0) return absl::OkStatus();
    // What the completion queue knows is read without a call; one GetTransfer for each of the
    // rest (the daemon has no batch read yet).
    client->LocalStates(ids, count, states);
    absl::Status first = absl::OkStatus();
    for (size_t i = 0; i < count; ++i) {
      if (states[i] != KVRAIL_STATE_UNSPECIFIED) continue;
      absl::StatusOr<v1::TransferStatus> status = client->Get(ids[i]);
      if (status.ok()) {
        states[i] = static_cast<int32_t>(status->state());
        continue;
      }
      if (codes != nullptr) codes[i] = static_cast<int32_t>(status.status().code());
      if (first.ok()) {
        first = absl::Status(status.status().code(),
                             absl::StrCat("ids[", i, "]: ", status.status().message()));
      }
    }
    return first;
  });
}

int kvrail_completion_fd(kvrail_client* handle, int* fd) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(fd, "fd"));
    *fd = -1;
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    *fd = client->CompletionFd();
    return absl::OkStatus();
  });
}

int kvrail_completion_follows(kvrail_client* handle, uint64_t transfer_id, int* follows) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(follows, "follows"));
    *follows = 0;
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    *follows = client->FollowsCompletion(transfer_id) ? 1 : 0;
    return absl::OkStatus();
  });
}

int kvrail_take_completions(kvrail_client* handle, uint64_t* ids, size_t max, size_t* count) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(count, "count"));
    *count = 0;
    if (max > 0 && ids == nullptr) return absl::InvalidArgumentError("ids: NULL with max > 0");
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    *count = client->TakeCompletions(ids, max);
    return absl::OkStatus();
  });
}

int kvrail_arm_completions(kvrail_client* handle, int armed) {
  return Guard([&]() -> absl::Status {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    client->ArmCompletions(armed != 0);
    return absl::OkStatus();
  });
}

int kvrail_list_regions(kvrail_client* handle, uint8_t** out, size_t* out_len) {
  return kvrail::c_api::MessageCall(handle, out, out_len,
                                    [](Client& client) { return client.ListRegions(); });
}

int kvrail_list_transfers(kvrail_client* handle, const int32_t* states, size_t num_states,
                          uint32_t limit, uint8_t** out, size_t* out_len) {
  return kvrail::c_api::MessageCall(
      handle, out, out_len, [&](Client& client) -> absl::StatusOr<v1::ListTransfersResponse> {
        if (num_states > 0 && states == nullptr) {
          return absl::InvalidArgumentError("states: NULL with num_states > 0");
        }
        std::vector<v1::TransferState> wanted;
        for (size_t i = 0; i < num_states; ++i) {
          if (!v1::TransferState_IsValid(states[i])) {
            return absl::InvalidArgumentError(
                absl::StrCat("states[", i, "]: ", states[i], " is not a kvrail.v1.TransferState"));
          }
          wanted.push_back(static_cast<v1::TransferState>(states[i]));
        }
        return client.ListTransfers(wanted, limit);
      });
}

int kvrail_get_stats(kvrail_client* handle, uint8_t** out, size_t* out_len) {
  return kvrail::c_api::MessageCall(handle, out, out_len,
                                    [](Client& client) { return client.GetStats(); });
}

int kvrail_list_transfers_filtered(kvrail_client* handle, const uint8_t* request,
                                   size_t request_len, uint8_t** out, size_t* out_len) {
  return kvrail::c_api::MessageCall(
      handle, out, out_len, [&](Client& client) -> absl::StatusOr<v1::ListTransfersResponse> {
        KVRAIL_ASSIGN_OR_RETURN(const v1::ListTransfersRequest parsed,
                                Parse<v1::ListTransfersRequest>(request, request_len, "request"));
        return client.ListTransfers(parsed);
      });
}

int kvrail_create_grant(kvrail_client* handle, uint64_t region_id, int32_t access, uint64_t ttl_ms,
                        uint32_t layer_begin, uint32_t layer_end, uint8_t** out, size_t* out_len) {
  return kvrail::c_api::MessageCall(
      handle, out, out_len, [&](Client& client) -> absl::StatusOr<v1::Grant> {
        if (!v1::GrantAccess_IsValid(access) || access == v1::GRANT_ACCESS_UNSPECIFIED) {
          return absl::InvalidArgumentError(
              absl::StrCat("access: ", access, " is not GRANT_ACCESS_READ (1) or WRITE (2)"));
        }
        if (ttl_ms > 86400000) {
          return absl::InvalidArgumentError(absl::StrCat("ttl_ms: ", ttl_ms, " is above a day"));
        }
        return client.CreateGrant(region_id, static_cast<v1::GrantAccess>(access),
                                  absl::Milliseconds(ttl_ms), layer_begin, layer_end);
      });
}

int kvrail_revoke_grant(kvrail_client* handle, const char* token) {
  return Guard([&]() -> absl::Status {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    if (token == nullptr) return absl::InvalidArgumentError("token: NULL");
    return client->RevokeGrant(token);
  });
}

int kvrail_export_region(kvrail_client* handle, uint64_t region_id, const char* peer_node,
                         uint8_t** out, size_t* out_len) {
  return kvrail::c_api::MessageCall(handle, out, out_len,
                                    [&](Client& client) -> absl::StatusOr<v1::RegionLease> {
                                      if (peer_node == nullptr)
                                        return absl::InvalidArgumentError("peer_node: NULL");
                                      return client.ExportRegion(region_id, peer_node);
                                    });
}

int kvrail_poll_notifications(kvrail_client* handle, uint32_t max, int64_t timeout_ms,
                              uint8_t** out, size_t* out_len) {
  return kvrail::c_api::MessageCall(
      handle, out, out_len, [&](Client& client) -> absl::StatusOr<v1::NotificationPollResponse> {
        if (timeout_ms < 0 || timeout_ms > 60000) {
          return absl::InvalidArgumentError(
              absl::StrCat("timeout_ms: ", timeout_ms, " is outside [0, 60000]"));
        }
        KVRAIL_ASSIGN_OR_RETURN(std::vector<v1::Notification> taken,
                                client.PollNotifications(max, absl::Milliseconds(timeout_ms)));
        v1::NotificationPollResponse response;
        for (auto& n : taken) *response.add_notifications() = std::move(n);
        return response;
      });
}

int kvrail_session_lost(kvrail_client* handle, int* lost) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(lost, "lost"));
    *lost = 0;
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    *lost = client->session_lost() ? 1 : 0;
    return absl::OkStatus();
  });
}

int kvrail_reset_session(kvrail_client* handle) {
  return Guard([&]() -> absl::Status {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    return client->ResetSession();
  });
}

int kvrail_on_session_lost(kvrail_client* handle, kvrail_session_lost_fn fn, void* user) {
  return Guard([&]() -> absl::Status {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    if (fn == nullptr) {
      client->OnSessionLost(nullptr);
    } else {
      client->OnSessionLost([fn, user](const absl::Status& lost) {
        const std::string message(lost.message());
        fn(user, static_cast<int>(lost.code()), message.c_str());
      });
    }
    return absl::OkStatus();
  });
}

int kvrail_prepare(kvrail_client* handle, const uint8_t* spec, size_t spec_len,
                   uint32_t src_block_count, uint32_t dst_block_count, kvrail_prepared** prepared,
                   uint8_t** response, size_t* response_len) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(prepared, "prepared"));
    *prepared = nullptr;
    KVRAIL_RETURN_IF_ERROR(ResetBytes(response, response_len, "response"));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, FindClient(handle));
    v1::PrepareTransferRequest request;
    KVRAIL_ASSIGN_OR_RETURN(*request.mutable_spec(),
                            Parse<v1::TransferSpec>(spec, spec_len, "spec"));
    request.set_src_block_count(src_block_count);
    request.set_dst_block_count(dst_block_count);
    KVRAIL_ASSIGN_OR_RETURN(v1::PrepareTransferResponse info, client->PrepareRequest(request));
    auto held = std::make_shared<kvrail::c_api::Prepared>();
    held->client = client;
    held->id = info.prepared_id();
    const absl::Status put = PutBytes(info, response, response_len);
    if (!put.ok()) {
      (void)client->ReleasePrepared(held->id);
      return put;
    }
    *prepared = HandleFrom<kvrail_prepared>(PreparedTable().Add(std::move(held)));
    return absl::OkStatus();
  });
}

int kvrail_post(kvrail_prepared* handle, const uint32_t* src_ids, size_t src_count,
                const uint32_t* dst_ids, size_t dst_count, uint64_t* transfer_id,
                uint8_t** response, size_t* response_len) {
  return Guard([&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(RequireOut(transfer_id, "transfer_id"));
    *transfer_id = 0;
    KVRAIL_RETURN_IF_ERROR(ResetBytes(response, response_len, "response"));
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<kvrail::c_api::Prepared> prepared,
                            FindPrepared(handle));
    if (src_count > 0 && src_ids == nullptr) {
      return absl::InvalidArgumentError("src_ids: NULL with src_count > 0");
    }
    if (dst_count > 0 && dst_ids == nullptr) {
      return absl::InvalidArgumentError("dst_ids: NULL with dst_count > 0");
    }
    if (src_count > INT32_MAX || dst_count > INT32_MAX) {
      return absl::InvalidArgumentError("src_count / dst_count: more than 2^31 - 1 ids");
    }
    std::shared_ptr<Client> client = prepared->client.lock();
    if (client == nullptr) {
      return absl::FailedPreconditionError(
          "prepared: its client was closed (its session, and the prepared transfer, are gone)");
    }
    KVRAIL_ASSIGN_OR_RETURN(v1::SubmitTransferResponse result,
                            client->PostPrepared(kvrail::client::MakePostRequest(
                                prepared->id, src_ids, src_count, dst_ids, dst_count)));
    *transfer_id = result.transfer_id();
    return PutBytes(result, response, response_len);
  });
}

int kvrail_prepared_release(kvrail_prepared* handle) {
  return Guard([&]() -> absl::Status {
    if (handle == nullptr) return absl::OkStatus();
    std::shared_ptr<kvrail::c_api::Prepared> prepared = PreparedTable().Remove(HandleOf(handle));
    if (prepared == nullptr) {
      return absl::InvalidArgumentError(
          "prepared: not a live kvrail_prepared handle (released, or never issued)");
    }
    std::shared_ptr<Client> client = prepared->client.lock();
    if (client == nullptr) return absl::OkStatus();  // the session ended: the daemon freed it
    const absl::Status released = client->ReleasePrepared(prepared->id);
    // NOT_FOUND: it ended already (with a region or the session); released either way.
    return absl::IsNotFound(released) ? absl::OkStatus() : released;
  });
}

}  // extern "C"

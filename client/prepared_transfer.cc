// PreparedTransfer: the RAII handle of a prepared transfer over the Client's calls.
#include <utility>

#include "client/kvrail_client.h"

namespace kvrail::client {

v1::PostTransferRequest MakePostRequest(uint64_t prepared_id, const uint32_t* src_ids,
                                        size_t src_count, const uint32_t* dst_ids,
                                        size_t dst_count) {
  v1::PostTransferRequest request;
  request.set_prepared_id(prepared_id);
  // x86-64 and aarch64 are little-endian: the le32 bytes are the array's.
  if (src_count >= kPostLe32From) {
    request.set_src_block_ids_le32(reinterpret_cast<const char*>(src_ids), 4 * src_count);
  } else if (src_count > 0) {
    request.mutable_src_block_ids()->Add(src_ids, src_ids + src_count);
  }
  if (dst_count >= kPostLe32From) {
    request.set_dst_block_ids_le32(reinterpret_cast<const char*>(dst_ids), 4 * dst_count);
  } else if (dst_count > 0) {
    request.mutable_dst_block_ids()->Add(dst_ids, dst_ids + dst_count);
  }
  return request;
}

PreparedTransfer::PreparedTransfer(PreparedTransfer&& other) noexcept
    : client_(std::exchange(other.client_, nullptr)),
      id_(std::exchange(other.id_, 0)),
      info_(std::move(other.info_)) {}

PreparedTransfer& PreparedTransfer::operator=(PreparedTransfer&& other) noexcept {
  if (this != &other) {
    (void)Release();
    client_ = std::exchange(other.client_, nullptr);
    id_ = std::exchange(other.id_, 0);
    info_ = std::move(other.info_);
  }
  return *this;
}

PreparedTransfer::~PreparedTransfer() { (void)Release(); }

absl::StatusOr<v1::SubmitTransferResponse> PreparedTransfer::Post(
    const std::vector<uint32_t>& src_block_ids, const std::vector<uint32_t>& dst_block_ids) {
  return Post(src_block_ids.data(), src_block_ids.size(), dst_block_ids.data(),
              dst_block_ids.size());
}

absl::StatusOr<v1::SubmitTransferResponse> PreparedTransfer::Post(const uint32_t* src_block_ids,
                                                                  size_t src_count,
                                                                  const uint32_t* dst_block_ids,
                                                                  size_t dst_count) {
  if (client_ == nullptr || id_ == 0) {
    return absl::FailedPreconditionError("prepared_id: this prepared transfer was released");
  }
  return client_->PostPrepared(
      MakePostRequest(id_, src_block_ids, src_count, dst_block_ids, dst_count));
}

absl::Status PreparedTransfer::Release() {
  if (client_ == nullptr || id_ == 0) return absl::OkStatus();
  const uint64_t id = std::exchange(id_, 0);
  const absl::Status released = client_->ReleasePrepared(id);
  // NOT_FOUND: it ended already (with a region or the session); released either way.
  return absl::IsNotFound(released) ? absl::OkStatus() : released;
}

}  // namespace kvrail::client

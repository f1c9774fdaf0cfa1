#include "wire/submission_queue.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "wire/shm_bytes.h"

namespace kvrail::wire {

using internal::Load;
using internal::Store;

uint32_t SubmissionSlots(size_t payload_bytes) {
  if (payload_bytes > kMaxSubmissionPayload) return 0;
  return static_cast<uint32_t>((kSubmissionHeaderBytes + payload_bytes + kSubmissionSlotBytes - 1) /
                               kSubmissionSlotBytes);
}

uint8_t* AppendSubmissionHeader(uint64_t tag, size_t payload_bytes, std::string* out,
                                uint16_t kind) {
  const uint32_t slots = SubmissionSlots(payload_bytes);
  if (slots == 0) return nullptr;
  const size_t at = out->size();
  out->resize(at + size_t{slots} * kSubmissionSlotBytes, '\0');
  auto* entry = reinterpret_cast<uint8_t*>(out->data() + at);
  Store<uint16_t>(entry, kind);
  Store<uint16_t>(entry + 2, static_cast<uint16_t>(slots));
  Store<uint32_t>(entry + 4, static_cast<uint32_t>(payload_bytes));
  Store<uint64_t>(entry + 8, tag);
  return entry + kSubmissionHeaderBytes;
}

absl::Status AppendSubmission(uint64_t tag, absl::string_view payload, std::string* out,
                              uint16_t kind) {
  uint8_t* at = AppendSubmissionHeader(tag, payload.size(), out, kind);
  if (at == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("sq.entry.payload_bytes: ", payload.size(),
                                                   ", an entry holds at most ",
                                                   kMaxSubmissionPayload));
  }
  if (!payload.empty()) std::memcpy(at, payload.data(), payload.size());
  return absl::OkStatus();
}

SubmissionHeader ReadSubmissionHeader(const uint8_t slot[kSubmissionSlotBytes]) {
  uint8_t copy[kSubmissionHeaderBytes];
  std::memcpy(copy, slot, sizeof(copy));
  SubmissionHeader h;
  h.kind = Load<uint16_t>(copy);
  h.slots = Load<uint16_t>(copy + 2);
  h.payload_bytes = Load<uint32_t>(copy + 4);
  h.tag = Load<uint64_t>(copy + 8);
  return h;
}

uint32_t SubmissionSpan(const SubmissionHeader& header, uint64_t published) {
  const bool known = header.kind == kSubmissionKind || header.kind == kPostKind;
  if (!known || header.slots == 0 || header.slots > kMaxSubmissionSlots ||
      header.slots > published) {
    return 1;
  }
  return header.slots;
}

absl::StatusOr<absl::string_view> SubmissionPayload(const uint8_t* entry, size_t size) {
  if (size < kSubmissionSlotBytes || size % kSubmissionSlotBytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sq.entry: ", size, " bytes, not whole slots of ", kSubmissionSlotBytes));
  }
  const SubmissionHeader h = ReadSubmissionHeader(entry);
  if (h.kind != kSubmissionKind && h.kind != kPostKind) {
    return absl::InvalidArgumentError(
        absl::StrCat("sq.entry.kind: ", h.kind, ", expected ", kSubmissionKind, " or ", kPostKind));
  }
  const size_t span = size / kSubmissionSlotBytes;
  if (h.slots == 0 || h.slots > kMaxSubmissionSlots || h.slots != span) {
    return absl::InvalidArgumentError(
        absl::StrCat("sq.entry.slots: ", h.slots, " (1 to ", kMaxSubmissionSlots,
                     ", all of them published in one write; ", span, " taken)"));
  }
  if (SubmissionSlots(h.payload_bytes) != h.slots) {
    return absl::InvalidArgumentError(absl::StrCat("sq.entry.payload_bytes: ", h.payload_bytes,
                                                   " does not fill an entry of ", h.slots,
                                                   " slots"));
  }
  return absl::string_view(reinterpret_cast<const char*>(entry) + kSubmissionHeaderBytes,
                           h.payload_bytes);
}

void EncodeSubmitAck(const SubmitAck& ack, uint8_t out[kSubmitAckBytes]) {
  std::memset(out, 0, kSubmitAckBytes);
  const size_t n = std::min(ack.message.size(), kSubmitAckMessageBytes);
  uint32_t flags = ack.flags & kSubmitAckDeduplicated;
  if (n < ack.message.size()) flags |= kSubmitAckTruncated;
  Store<uint16_t>(out, kSubmitAckKind);
  Store<uint16_t>(out + 2, static_cast<uint16_t>(kSubmitAckBytes));
  Store<uint32_t>(out + 4, flags);
  Store<uint64_t>(out + 8, ack.tag);
  Store<uint64_t>(out + 16, ack.transfer_id);
  Store<uint64_t>(out + 24, ack.bytes_total);
  Store<uint32_t>(out + 32, ack.tiles_total);
  Store<int32_t>(out + 36, ack.code);
  Store<uint16_t>(out + 40, static_cast<uint16_t>(n));
  if (n > 0) std::memcpy(out + 42, ack.message.data(), n);
}

absl::StatusOr<SubmitAck> ParseSubmitAck(const uint8_t* bytes, size_t size) {
  if (size < kSubmitAckBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("sq_ack: ", size, " bytes, an entry has ", kSubmitAckBytes));
  }
  uint8_t copy[kSubmitAckBytes];
  std::memcpy(copy, bytes, sizeof(copy));
  if (Load<uint16_t>(copy) != kSubmitAckKind) {
    return absl::InvalidArgumentError(
        absl::StrCat("sq_ack.kind: ", Load<uint16_t>(copy), ", expected ", kSubmitAckKind));
  }
  if (Load<uint16_t>(copy + 2) != kSubmitAckBytes) {
    return absl::InvalidArgumentError(absl::StrCat("sq_ack.entry_bytes: ", Load<uint16_t>(copy + 2),
                                                   ", expected ", kSubmitAckBytes));
  }
  SubmitAck ack;
  ack.flags = Load<uint32_t>(copy + 4);
  ack.tag = Load<uint64_t>(copy + 8);
  ack.transfer_id = Load<uint64_t>(copy + 16);
  ack.bytes_total = Load<uint64_t>(copy + 24);
  ack.tiles_total = Load<uint32_t>(copy + 32);
  ack.code = Load<int32_t>(copy + 36);
  const uint16_t n = Load<uint16_t>(copy + 40);
  if (ack.code < 0 || ack.code > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("sq_ack.code: ", ack.code, " is not a gRPC code"));
  }
  if ((ack.code == 0) != (ack.transfer_id != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("sq_ack.transfer_id: ", ack.transfer_id,
                                                   " with code ", ack.code,
                                                   " (an id exactly when accepted)"));
  }
  if (n > kSubmitAckMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("sq_ack.message_bytes: ", n, ", at most ", kSubmitAckMessageBytes));
  }
  ack.message.assign(reinterpret_cast<const char*>(copy + 42), n);
  return ack;
}

absl::Status SubmitAckStatus(const SubmitAck& ack) {
  if (ack.code == 0) return absl::OkStatus();
  std::string message = ack.message;
  if ((ack.flags & kSubmitAckTruncated) != 0) message += "...";
  return absl::Status(static_cast<absl::StatusCode>(ack.code), message);
}

}  // namespace kvrail::wire

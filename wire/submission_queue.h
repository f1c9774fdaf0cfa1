// The session's submission queue in shared memory (io_uring / NVMe style): the client writes
// transfer requests into a ring that kvraild reads, and kvraild answers each with an
// acknowledgement in a second ring that the client reads - the transfer's id, or the refusal -
// so that a submit costs no socket round trip. Both rings are wire/shm_ring.h rings in sealed
// memfds, each with its eventfd; the client creates them and passes the four descriptors in one
// "SQ" packet (wire/session_wire.h). docs/architecture.md, "Submission queue", has the design.
//
// Submission ring: slots of kSubmissionSlotBytes. One request is one entry of 1 to
// kMaxSubmissionSlots consecutive slots (a request is bigger than a slot); its first slot begins
//     kind u16 @0 (kSubmissionKind), slots u16 @2, payload_bytes u32 @4, tag u64 @8,
// and the payload (a serialized v1::SubmitTransferRequest; with kind kPostKind a serialized
// v1::PostTransferRequest, a prepared transfer's post) follows from byte 16 on, through the
// entry's later slots. slots is SubmissionSlots(payload_bytes) exactly. The client writes any
// number of entries and publishes them with one store of tail (a batch); a request too big for
// an entry, or for the room left, goes by the SUBMIT packet instead.
//
// Acknowledgement ring: slots of kSubmitAckBytes, one per entry the daemon took, in the order it
// admitted them:
//     kind u16 @0 (kSubmitAckKind), entry_bytes u16 @2, flags u32 @4, tag u64 @8,
//     transfer_id u64 @16 (0 when refused), bytes_total u64 @24, tiles_total u32 @32,
//     code i32 @36 (an absl / gRPC code, 0 when accepted), message_bytes u16 @40, message @42.
// The message is the start of the refusal's (error messages lead with the field they name);
// kSubmitAckTruncated says it was cut. The client keeps no more entries in flight than the
// acknowledgement ring holds, so an honest client's acknowledgements always fit.
//
// Everything either side reads here came from the other process: parsing copies the bytes out
// of shared memory once and checks every field; a bad entry is refused naming it.
//
// Thread contract: free functions, pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::wire {

inline constexpr uint32_t kSubmissionSlotBytes = 64;
inline constexpr uint16_t kSubmissionKind = 2;
// An entry whose payload is a PostTransferRequest (Transfer.PostTransfer): admitted and
// acknowledged as a submit's.
inline constexpr uint16_t kPostKind = 4;
inline constexpr size_t kSubmissionHeaderBytes = 16;
// The largest entry: 64 slots (4 KiB), so a request of up to 4080 bytes.
inline constexpr uint32_t kMaxSubmissionSlots = 64;
inline constexpr size_t kMaxSubmissionPayload =
    kMaxSubmissionSlots * kSubmissionSlotBytes - kSubmissionHeaderBytes;

inline constexpr uint16_t kSubmitAckKind = 3;
inline constexpr uint32_t kSubmitAckBytes = 512;
inline constexpr size_t kSubmitAckMessageBytes = kSubmitAckBytes - 42;
inline constexpr uint32_t kSubmitAckDeduplicated = 1;  // SubmitTransferResponse.deduplicated
inline constexpr uint32_t kSubmitAckTruncated = 2;     // the message was cut

// Slots an entry of `payload_bytes` takes (0 when it cannot be one entry).
uint32_t SubmissionSlots(size_t payload_bytes);

// Appends the entry for `payload` with `tag` to `out` (SubmissionSlots(payload.size()) slots,
// zero-padded). INVALID_ARGUMENT when the payload is larger than kMaxSubmissionPayload.
absl::Status AppendSubmission(uint64_t tag, absl::string_view payload, std::string* out,
                              uint16_t kind = kSubmissionKind);
// The same with the payload written by the caller: appends the entry's header and zeroed slots
// for `payload_bytes` and returns where its payload_bytes go (inside `out`, valid until `out`
// changes); nullptr when the payload is larger than kMaxSubmissionPayload (nothing appended).
uint8_t* AppendSubmissionHeader(uint64_t tag, size_t payload_bytes, std::string* out,
                                uint16_t kind = kSubmissionKind);

// The header of an entry as read from its first slot.
struct SubmissionHeader {
  uint16_t kind = 0;
  uint16_t slots = 0;
  uint32_t payload_bytes = 0;
  uint64_t tag = 0;
};
SubmissionHeader ReadSubmissionHeader(const uint8_t slot[kSubmissionSlotBytes]);
// How many slots the consumer takes for the entry that starts with `header` when `published`
// slots (>= 1) are readable: the entry's declared slots when that is a possible length and all
// of them are published, else 1 (a garbled header is refused alone and the next slot is read as
// an entry of its own).
uint32_t SubmissionSpan(const SubmissionHeader& header, uint64_t published);
// The payload of the entry in `entry` (`size` bytes: its whole span, copied out of shared memory
// by the caller), of either kind (kSubmissionKind, kPostKind: the header's). INVALID_ARGUMENT
// naming the field (sq.entry.kind, sq.entry.slots, sq.entry.payload_bytes) when the entry is not
// one.
absl::StatusOr<absl::string_view> SubmissionPayload(const uint8_t* entry, size_t size);

struct SubmitAck {
  uint32_t flags = 0;  // kSubmitAckDeduplicated, kSubmitAckTruncated
  uint64_t tag = 0;
  uint64_t transfer_id = 0;  // 0 when refused
  uint64_t bytes_total = 0;
  uint32_t tiles_total = 0;
  int32_t code = 0;     // absl::StatusCode; 0 when accepted
  std::string message;  // the refusal's message (its start), empty when accepted
};
// Encodes `ack` (the message cut to kSubmitAckMessageBytes, flagged kSubmitAckTruncated).
void EncodeSubmitAck(const SubmitAck& ack, uint8_t out[kSubmitAckBytes]);
// INVALID_ARGUMENT naming the field (sq_ack.kind, sq_ack.entry_bytes, sq_ack.code,
// sq_ack.transfer_id, sq_ack.message_bytes) for an entry that is not an acknowledgement.
absl::StatusOr<SubmitAck> ParseSubmitAck(const uint8_t* bytes, size_t size);
// The refusal an acknowledgement carries (OK when accepted).
absl::Status SubmitAckStatus(const SubmitAck& ack);

}  // namespace kvrail::wire

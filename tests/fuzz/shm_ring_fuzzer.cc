// libFuzzer target: the shared-memory ring (wire/shm_ring.h) as its consumer and producer see
// memory the other side wrote. The input is a ring's memory (header, indices, slots) followed by
// nothing else: the fuzzer opens it, pops and parses every entry, then pushes into it. Neither
// side may read or write outside the memory, crash, or take an entry past an impossible index;
// every entry it takes either parses or is refused with INVALID_ARGUMENT. The same memory is then
// read as a submission queue (wire/submission_queue.h) the way kvraild reads a client's: each
// entry's span stays within what was published, and each is taken or refused naming a field;
// and the input's bytes as one acknowledgement, as the client reads them.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "wire/shm_ring.h"
#include "wire/submission_queue.h"

namespace wire = kvrail::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Any single completion entry's bytes.
  absl::StatusOr<wire::Completion> direct = wire::ParseCompletion(data, size);
  if (!direct.ok() && !absl::IsInvalidArgument(direct.status())) std::abort();
  absl::StatusOr<wire::SubmitAck> ack = wire::ParseSubmitAck(data, size);
  if (!ack.ok() && !absl::IsInvalidArgument(ack.status())) std::abort();
  if (size > (size_t{1} << 20)) return 0;
  {
    std::vector<uint8_t> memory(data, data + size);
    absl::StatusOr<wire::RingView> sq =
        wire::RingView::Open(memory.data(), memory.size(), wire::kSubmissionSlotBytes);
    uint64_t entries = 0;
    while (sq.ok()) {
      absl::StatusOr<uint64_t> published = sq->Published();
      if (!published.ok() || *published == 0) break;
      if (*published > sq->capacity()) std::abort();
      std::vector<uint8_t> entry;
      wire::SubmissionHeader header;
      auto copy = [&](const uint8_t* slot, size_t n) {
        if (n != wire::kSubmissionSlotBytes) std::abort();
        if (entry.empty()) header = wire::ReadSubmissionHeader(slot);
        entry.insert(entry.end(), slot, slot + n);
      };
      if (!sq->Pop(1, copy).ok()) std::abort();
      const uint32_t span = wire::SubmissionSpan(header, *published);
      if (span == 0 || span > *published) std::abort();
      absl::StatusOr<size_t> rest = sq->Pop(span - 1, copy);
      if (!rest.ok() || *rest != span - 1) std::abort();
      absl::StatusOr<absl::string_view> payload =
          wire::SubmissionPayload(entry.data(), entry.size());
      if (payload.ok()) {
        if (payload->size() > entry.size() - wire::kSubmissionHeaderBytes) std::abort();
      } else if (!absl::IsInvalidArgument(payload.status())) {
        std::abort();
      }
      if (++entries > sq->capacity()) std::abort();
    }
  }
  // The same bytes as a whole ring (an exact-size heap copy: ASan catches any stray access).
  std::vector<uint8_t> memory(data, data + size);
  absl::StatusOr<wire::RingView> consumer =
      wire::RingView::Open(memory.data(), memory.size(), wire::kCompletionEntryBytes);
  if (!consumer.ok()) return 0;
  size_t parsed = 0;
  absl::StatusOr<size_t> taken = consumer->Pop(~size_t{0}, [&](const uint8_t* bytes, size_t n) {
    if (n != wire::kCompletionEntryBytes) std::abort();
    absl::StatusOr<wire::Completion> c = wire::ParseCompletion(bytes, n);
    if (c.ok()) {
      ++parsed;
    } else if (!absl::IsInvalidArgument(c.status())) {
      std::abort();
    }
  });
  if (taken.ok() && *taken > consumer->capacity()) std::abort();
  // A producer over the same memory: pushes until the ring is full or refused.
  absl::StatusOr<wire::RingView> producer =
      wire::RingView::Open(memory.data(), memory.size(), wire::kCompletionEntryBytes);
  if (producer.ok()) {
    uint8_t entry[wire::kCompletionEntryBytes];
    wire::Completion c;
    c.transfer_id = 1;
    c.state = 4;
    wire::EncodeCompletion(c, entry);
    for (uint32_t i = 0; i <= producer->capacity(); ++i) {
      if (!producer->TryPush(entry, sizeof(entry)).ok()) break;
    }
  }
  return 0;
}

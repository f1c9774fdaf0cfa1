// ClientOptions::FromEnvironment: the client library's one reader of the environment.
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "client/kvrail_client.h"

namespace kvrail::client {
namespace {

// `value` in microseconds into `out`; an unset or unparsable value leaves it.
void ReadMicros(const char* value, absl::Duration* out) {
  uint32_t us = 0;
  if (value != nullptr && absl::SimpleAtoi(value, &us)) *out = absl::Microseconds(us);
}

}  // namespace

ClientOptions ClientOptions::FromEnvironment() {
  return FromEnvironment([](const char* name) -> const char* { return std::getenv(name); });
}

ClientOptions ClientOptions::FromEnvironment(
    const std::function<const char*(const char*)>& getenv) {
  ClientOptions options;
  if (const char* socket = getenv("KVRAIL_SOCKET"); socket != nullptr && socket[0] != '\0') {
    options.target = socket;
  }
  if (const char* via = getenv("KVRAIL_SUBMIT_VIA"); via != nullptr && std::string(via) == "grpc") {
    options.submit_via_session = false;
  }
  ReadMicros(getenv("KVRAIL_ANSWER_SPIN_US"), &options.answer_spin);
  if (const char* cq = getenv("KVRAIL_COMPLETION_QUEUE"); cq != nullptr) {
    options.completion_queue = std::string(cq) != "0";
  }
  ReadMicros(getenv("KVRAIL_COMPLETION_SPIN_US"), &options.completion_spin);
  if (const char* word = getenv("KVRAIL_GPU_DONE_WORD"); word != nullptr) {
    options.gpu_done_word = std::string(word) != "0";
  }
  if (const char* entries = getenv("KVRAIL_COMPLETION_QUEUE_ENTRIES"); entries != nullptr) {
    uint32_t n = 0;
    if (absl::SimpleAtoi(entries, &n)) options.completion_queue_entries = n;
  }
  if (const char* sq = getenv("KVRAIL_SUBMISSION_QUEUE"); sq != nullptr) {
    options.submission_queue = std::string(sq) != "0";
  }
  ReadMicros(getenv("KVRAIL_SUBMISSION_SPIN_US"), &options.submission_spin);
  if (const char* slots = getenv("KVRAIL_SUBMISSION_QUEUE_SLOTS"); slots != nullptr) {
    uint32_t n = 0;
    if (absl::SimpleAtoi(slots, &n)) options.submission_queue_slots = n;
  }
  if (const char* tables = getenv("KVRAIL_BLOCK_TABLE_BUFFER");
      tables != nullptr && std::string(tables) == "lazy") {
    options.eager_block_table = false;
  }
  return options;
}

std::string DefaultTarget() { return ClientOptions::FromEnvironment().target; }

}  // namespace kvrail::client

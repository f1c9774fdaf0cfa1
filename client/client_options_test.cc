// ClientOptions::FromEnvironment over a replayable environment: defaults, each variable's
// override, and values that do not parse keeping the default.
#include <map>
#include <string>

#include "catch2/catch.hpp"
#include "client/kvrail_client.h"

namespace kvrail::client {
namespace {

ClientOptions From(const std::map<std::string, std::string>& env) {
  return ClientOptions::FromEnvironment([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST_CASE("an empty environment gives the defaults") {
  const ClientOptions o = From({});
  CHECK(o.target == kDefaultSocket);
  CHECK(o.submit_via_session);
  CHECK(o.answer_spin == absl::Microseconds(200));
  CHECK(o.completion_queue);
  CHECK(o.gpu_done_word);
  CHECK(o.completion_spin == absl::Microseconds(200));
  CHECK(o.completion_queue_entries == 4096);
  CHECK(o.eager_block_table);
}

TEST_CASE("each variable sets its field") {
  const ClientOptions o = From({{"KVRAIL_SOCKET", "/tmp/x.sock"},
                                {"KVRAIL_SUBMIT_VIA", "grpc"},
                                {"KVRAIL_ANSWER_SPIN_US", "0"},
                                {"KVRAIL_COMPLETION_QUEUE", "0"},
                                {"KVRAIL_GPU_DONE_WORD", "0"},
                                {"KVRAIL_COMPLETION_SPIN_US", "7"},
                                {"KVRAIL_COMPLETION_QUEUE_ENTRIES", "64"},
                                {"KVRAIL_BLOCK_TABLE_BUFFER", "lazy"}});
  CHECK(o.target == "/tmp/x.sock");
  CHECK_FALSE(o.submit_via_session);
  CHECK(o.answer_spin == absl::ZeroDuration());
  CHECK_FALSE(o.completion_queue);
  CHECK_FALSE(o.gpu_done_word);
  CHECK(o.completion_spin == absl::Microseconds(7));
  CHECK(o.completion_queue_entries == 64);
  CHECK_FALSE(o.eager_block_table);
}

TEST_CASE("empty, unknown and unparsable values keep the defaults") {
  const ClientOptions o = From({{"KVRAIL_SOCKET", ""},
                                {"KVRAIL_SUBMIT_VIA", "session"},
                                {"KVRAIL_ANSWER_SPIN_US", "soon"},
                                {"KVRAIL_COMPLETION_QUEUE", "1"},
                                {"KVRAIL_COMPLETION_SPIN_US", "-3"},
                                {"KVRAIL_COMPLETION_QUEUE_ENTRIES", "many"},
                                {"KVRAIL_BLOCK_TABLE_BUFFER", "eager"}});
  CHECK(o.target == kDefaultSocket);
  CHECK(o.submit_via_session);
  CHECK(o.answer_spin == absl::Microseconds(200));
  CHECK(o.completion_queue);
  CHECK(o.completion_spin == absl::Microseconds(200));
  CHECK(o.completion_queue_entries == 4096);
  CHECK(o.eager_block_table);
}

}  // namespace
}  // namespace kvrail::client

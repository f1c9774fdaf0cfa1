#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "daemon/config/config.h"

namespace kvrail::config {
namespace {

TEST_CASE("a config file parses, and flags override it key by key") {
  auto parsed = ParseConfig(R"(
    node_id: "prefill-0"
    unix_socket: "/tmp/k.sock"
    host_engine_threads: 8
    peers { key: "decode-0" value: "10.0.0.2:7070" }
  )", "test.textproto");
  REQUIRE(parsed.ok());
  v1::DaemonConfig overrides;
  overrides.set_host_engine_threads(2);
  MergeOverrides(overrides, &*parsed);
  REQUIRE(FinalizeConfig(&*parsed).ok());
  CHECK(parsed->node_id() == "prefill-0");
  CHECK(parsed->unix_socket() == "/tmp/k.sock");
  CHECK(parsed->host_engine_threads() == 2);
  CHECK(parsed->peers().at("decode-0") == "10.0.0.2:7070");
  CHECK(parsed->socket_mode() == 0660);
  CHECK(parsed->tile_bytes() == (1u << 20));
  CHECK(parsed->defer_id_checks_from() == 32768);
}

TEST_CASE("defer_id_checks_from: unset is 32768, an explicit 0 (check all at submit) stays") {
  auto parsed = ParseConfig("defer_id_checks_from: 0\n", "t");
  REQUIRE(parsed.ok());
  REQUIRE(FinalizeConfig(&*parsed).ok());
  CHECK(parsed->defer_id_checks_from() == 0);
  v1::DaemonConfig overrides;
  overrides.set_defer_id_checks_from(100);
  MergeOverrides(overrides, &*parsed);
  CHECK(parsed->defer_id_checks_from() == 100);
}

TEST_CASE("syntax errors name the origin and the line") {
  auto parsed = ParseConfig("node_id: \"a\"\nno_such_key: 3\n", "bad.textproto");
  REQUIRE(!parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(parsed.status().message()).find("bad.textproto: line 2") != std::string::npos);
}

TEST_CASE("bad values are rejected naming the key") {
  auto check = [](const char* text, const char* key) {
    auto parsed = ParseConfig(text, "t");
    REQUIRE(parsed.ok());
    absl::Status status = FinalizeConfig(&*parsed);
    REQUIRE(!status.ok());
    INFO(status.message());
    CHECK(std::string(status.message()).rfind(key, 0) == 0);
  };
  check("socket_mode: 0x1ff", "socket_mode:");
  check("tile_bytes: 100", "tile_bytes:");
  check("log_format: \"xml\"", "log_format:");
  check("host_engine_threads: 1000", "host_engine_threads:");
  check("cuda_run_on: \"peer\"", "cuda_run_on:");
  check("cuda_batch_bytes: 4096", "cuda_batch_bytes:");
  check("peers { key: \"x\" value: \"nocolon\" }", "peers[x]:");
}

TEST_CASE("a missing file is NOT_FOUND naming the path") {
  auto parsed = LoadConfigFile("/nonexistent/kvraild.textproto");
  REQUIRE(!parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(parsed.status().message()).find("/nonexistent/kvraild.textproto") != std::string::npos);
}

}  // namespace
}  // namespace kvrail::config

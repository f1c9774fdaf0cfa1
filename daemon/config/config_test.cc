#include "daemon/config/config.h"

#include <catch2/catch.hpp>
#include <map>

namespace kvrail::config {
namespace {

TEST_CASE("a config file parses, and flags override it key by key") {
  auto parsed = ParseConfig(R"(
    node_id: "prefill-0"
    unix_socket: "/tmp/k.sock"
    host_engine_threads: 8
    peers { key: "decode-0" value: "10.0.0.2:7070" }
    insecure_peers: true
    fabric { nics: "10.0.0.1" }
  )",
                            "test.textproto");
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

TEST_CASE("cuda_stream_wait is accepted (the transfer layer hands gated layers over)") {
  auto parsed = ParseConfig("cuda_stream_wait: true\ncuda_stream_wait_jobs: 16\n", "t");
  REQUIRE(parsed.ok());
  REQUIRE(FinalizeConfig(&*parsed).ok());
  CHECK(parsed->cuda_stream_wait());
  CHECK(parsed->cuda_stream_wait_jobs() == 16);
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
  check("cuda_stream_wait_jobs: 257", "cuda_stream_wait_jobs:");
  check("session_admission_workers: 65", "session_admission_workers:");
  check("session_admission_bulk_workers: 65", "session_admission_bulk_workers:");
  check("session_admission_bulk_deadline_ms: 60001", "session_admission_bulk_deadline_ms: 60001");
  check("session_spin_budget_percent: 101", "session_spin_budget_percent:");
  check("session_submission_spin_us: 10001", "session_submission_spin_us:");
  check("cuda_dispatcher_spin_us: 10001", "cuda_dispatcher_spin_us:");
  check("cuda_dispatcher_spin_budget_percent: 101", "cuda_dispatcher_spin_budget_percent:");
  check("host_inline_max_bytes: 1048577", "host_inline_max_bytes:");
  check("session_spin_free_us: 10001", "session_spin_free_us:");
  check("predictive_wake_margin_us: 10001", "predictive_wake_margin_us:");
  check("predictive_wake_tolerance_us: 10001", "predictive_wake_tolerance_us:");
  check("predictive_wake_max_gap_us: 999", "predictive_wake_max_gap_us:");
  check("predictive_wake_max_gap_us: 1000001", "predictive_wake_max_gap_us:");
  check("cuda_critical_ctas: 5000", "cuda_critical_ctas:");
  check("peers { key: \"x\" value: \"nocolon\" }", "peers[x]:");
}

TEST_CASE("hot restart: handover_timeout_ms defaults, take_over and the handover path checked") {
  auto parsed = ParseConfig("take_over: 'auto'", "t");
  REQUIRE(parsed.ok());
  REQUIRE(FinalizeConfig(&*parsed).ok());
  CHECK(parsed->handover_timeout_ms() == 30000);
  CHECK(parsed->take_over() == "auto");
  auto path = ParseConfig("take_over: '/run/old/kvrail.sock.handover'", "t");
  REQUIRE(path.ok());
  CHECK(FinalizeConfig(&*path).ok());
  auto check = [](const std::string& text, const std::string& key) {
    auto bad = ParseConfig(text, "t");
    REQUIRE(bad.ok());
    const absl::Status status = FinalizeConfig(&*bad);
    INFO(text << ": " << status.message());
    REQUIRE(!status.ok());
    CHECK(std::string(status.message()).rfind(key, 0) == 0);
  };
  check("take_over: 'yes'", "take_over:");
  check("take_over: 'relative/kvrail.sock.handover'", "take_over:");
  check("take_over: '/" + std::string(107, 'a') + "'", "take_over:");
  check("handover_timeout_ms: 999", "handover_timeout_ms:");
  check("handover_timeout_ms: 600001", "handover_timeout_ms:");
  // 99 bytes pass the socket's own limit; its ".handover" (108 bytes) does not fit.
  check("unix_socket: '/" + std::string(98, 's') + "'", "unix_socket:");
  auto longest = ParseConfig("unix_socket: '/" + std::string(97, 's') + "'", "t");
  REQUIRE(longest.ok());
  CHECK(FinalizeConfig(&*longest).ok());
}

TEST_CASE("peers and TCP need mTLS unless insecure_peers says so explicitly") {
  auto finalize = [](const char* text) {
    auto parsed = ParseConfig(text, "t");
    REQUIRE(parsed.ok());
    return FinalizeConfig(&*parsed);
  };
  auto refused = [&](const char* text, const char* key) {
    const absl::Status status = finalize(text);
    INFO(text << " -> " << status.ToString());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(status.message()).rfind(key, 0) == 0);
  };
  // Neither TCP nor peers: nothing to authenticate.
  CHECK(finalize("").ok());
  // TCP or peers without certificates and without the explicit flag: refused, naming the fields.
  refused("tcp_listen: \"127.0.0.1:7070\"", "tcp_listen: set, but peer_tls");
  refused("peers { key: \"b\" value: \"10.0.0.2:7070\" }", "peers: set, but peer_tls");
  CHECK(finalize("tcp_listen: \"127.0.0.1:7070\" insecure_peers: true").ok());
  const char* full = R"(tcp_listen: "127.0.0.1:7070"
    peer_tls { ca_file: "/ca.pem" cert_file: "/a.pem" key_file: "/a.key" })";
  CHECK(finalize(full).ok());
  // Half a certificate is no certificate.
  refused(R"(tcp_listen: "127.0.0.1:7070" peer_tls { ca_file: "/ca.pem" cert_file: "/a.pem" })",
          "peer_tls.key_file: not set");
  refused(R"(peer_tls { cert_file: "/a.pem" key_file: "/a.key" })", "peer_tls.ca_file: not set");
  refused(R"(peer_tls { ca_file: "/ca.pem" key_file: "/a.key" })", "peer_tls.cert_file: not set");
  // Both at once is ambiguous.
  refused(R"(insecure_peers: true
    peer_tls { ca_file: "/ca.pem" cert_file: "/a.pem" key_file: "/a.key" })",
          "insecure_peers:");
  // Transfer and Admin over TCP only for callers with a certificate.
  refused("tcp_listen: \"127.0.0.1:7070\" insecure_peers: true tcp_serves_api: true",
          "tcp_serves_api:");
  CHECK(finalize(R"(tcp_listen: "127.0.0.1:7070" tcp_serves_api: true
    peer_tls { ca_file: "/ca.pem" cert_file: "/a.pem" key_file: "/a.key" })")
            .ok());
}

TEST_CASE("a missing file is NOT_FOUND naming the path") {
  auto parsed = LoadConfigFile("/nonexistent/kvraild.textproto");
  REQUIRE(!parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(parsed.status().message()).find("/nonexistent/kvraild.textproto") !=
        std::string::npos);
}

}  // namespace
}  // namespace kvrail::config

namespace kvrail::config {
namespace {

TEST_CASE("region caps: defaults, derived zeros, bounds naming the key") {
  auto parsed = ParseConfig("", "t");
  REQUIRE(parsed.ok());
  REQUIRE(FinalizeConfig(&*parsed).ok());
  CHECK(parsed->max_regions_per_session() == 4096);
  CHECK(parsed->max_regions_per_uid() == 16384);
  CHECK(parsed->max_mapped_bytes_per_uid() == 0);  // kvraild: the node's physical memory
  CHECK(parsed->max_region_mappings() == 0);       // kvraild: half of vm.max_map_count
  for (const char* key :
       {"max_regions_per_session", "max_regions_per_uid", "max_region_mappings"}) {
    auto big = ParseConfig(std::string(key) + ": 2000000", "t");
    REQUIRE(big.ok());
    const absl::Status status = FinalizeConfig(&*big);
    INFO(status.message());
    REQUIRE(!status.ok());
    CHECK(std::string(status.message()).rfind(std::string(key) + ":", 0) == 0);
  }
}

}  // namespace
}  // namespace kvrail::config

namespace kvrail::config {
namespace {

absl::Status FinalizeText(const std::string& text, v1::DaemonConfig* out = nullptr) {
  auto parsed = ParseConfig(text, "t");
  if (!parsed.ok()) return parsed.status();
  absl::Status status = FinalizeConfig(&*parsed);
  if (out != nullptr) *out = *parsed;
  return status;
}

TEST_CASE("etcd directory: defaults, and each bad value refused naming its key") {
  const std::string base = "node_id: \"n1\" tcp_listen: \"10.0.0.1:7070\" insecure_peers: true ";
  v1::DaemonConfig config;
  REQUIRE(FinalizeText(base + "etcd { endpoints: \"10.0.0.5:2379\" }", &config).ok());
  CHECK(config.etcd().prefix() == "/kvrail/v1/nodes/");
  CHECK(config.etcd().ttl_s() == 10);
  CHECK(config.etcd().advertise_address() == "10.0.0.1:7070");
  // No endpoints and nothing else: static only (the block is dropped).
  REQUIRE(FinalizeText(base + "etcd { }", &config).ok());
  CHECK(!config.has_etcd());

  const std::pair<std::string, std::string> bad[] = {
      {"etcd { prefix: \"/x/\" }", "etcd.endpoints:"},
      {"etcd { endpoints: \"http://10.0.0.5:2379\" }", "etcd.endpoints[0]:"},
      {"etcd { endpoints: \"10.0.0.5:2379\" endpoints: \"10.0.0.6\" }", "etcd.endpoints[1]:"},
      {"etcd { endpoints: \"10.0.0.5:0\" }", "etcd.endpoints[0]:"},
      {"etcd { endpoints: \"e:2379\" prefix: \"/kvrail\" }", "etcd.prefix:"},
      {"etcd { endpoints: \"e:2379\" ttl_s: 1 }", "etcd.ttl_s:"},
      {"etcd { endpoints: \"e:2379\" ttl_s: 4000 }", "etcd.ttl_s:"},
      {"etcd { endpoints: \"e:2379\" cert_file: \"c.pem\" }", "etcd.key_file:"},
      {"etcd { endpoints: \"e:2379\" key_file: \"k.pem\" }", "etcd.cert_file:"},
      {"etcd { endpoints: \"e:2379\" username: \"kvrail\" }", "etcd.password_file:"},
      {"etcd { endpoints: \"e:2379\" password_file: \"/etc/kvrail/etcd.pw\" }", "etcd.username:"},
      {"etcd { endpoints: \"e:2379\" advertise_address: \"0.0.0.0:7070\" }",
       "etcd.advertise_address:"},
      {"etcd { endpoints: \"e:2379\" advertise_address: \"10.0.0.1:0\" }",
       "etcd.advertise_address:"},
  };
  for (const auto& [text, key] : bad) {
    const absl::Status status = FinalizeText(base + text);
    INFO(text << " -> " << status.ToString());
    REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(status.message()).rfind(key, 0) == 0);
  }
  // Port 0 in tcp_listen cannot be advertised; an explicit advertise_address can.
  const std::string zero = "node_id: \"n1\" tcp_listen: \"10.0.0.1:0\" insecure_peers: true ";
  CHECK(std::string(FinalizeText(zero + "etcd { endpoints: \"e:2379\" }").message())
            .rfind("etcd.advertise_address:", 0) == 0);
  CHECK(FinalizeText(zero + "etcd { endpoints: \"e:2379\" advertise_address: \"10.0.0.1:7070\" }")
            .ok());
  // The directory needs the Peer service, and node ids are key segments.
  CHECK(std::string(FinalizeText("node_id: \"n1\" etcd { endpoints: \"e:2379\" }").message())
            .rfind("tcp_listen:", 0) == 0);
  CHECK(std::string(FinalizeText("node_id: \"a/b\" tcp_listen: \"h:1\" insecure_peers: true "
                                 "etcd { endpoints: \"e:2379\" }")
                        .message())
            .rfind("node_id:", 0) == 0);
}

}  // namespace
}  // namespace kvrail::config

namespace kvrail::config {
namespace {

// An environment of `vars` (a test never reads or changes the process's own).
Getenv EnvOf(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST_CASE("environment: each variable overrides its key; unset and empty change nothing") {
  v1::DaemonConfig config;
  config.set_low_latency(true);
  config.mutable_fabric()->set_relay("off");
  config.mutable_fabric()->set_gpu_pack("kernel");
  REQUIRE(ApplyEnvironment(EnvOf({}), &config).ok());
  CHECK(config.low_latency());
  CHECK(config.fabric().relay() == "off");
  REQUIRE(ApplyEnvironment(EnvOf({{"KVRAIL_FABRIC_RELAY", ""}}), &config).ok());
  CHECK(config.fabric().relay() == "off");
  REQUIRE(ApplyEnvironment(EnvOf({{"KVRAILD_LOW_LATENCY", "off"},
                                  {"KVRAIL_FABRIC_RELAY", "gpu:3"},
                                  {"KVRAIL_FABRIC_GPU_PACK", "copy"}}),
                           &config)
              .ok());
  CHECK_FALSE(config.low_latency());
  CHECK(config.fabric().relay() == "gpu:3");
  CHECK(config.fabric().gpu_pack() == "copy");
  REQUIRE(ApplyEnvironment(EnvOf({{"KVRAILD_LOW_LATENCY", "on"}}), &config).ok());
  CHECK(config.low_latency());
}

TEST_CASE("environment: CUDA_MPS_PIPE_DIRECTORY fills an empty key; the config's value wins") {
  v1::DaemonConfig config;
  REQUIRE(ApplyEnvironment(EnvOf({{"CUDA_MPS_PIPE_DIRECTORY", "/run/env-mps"}}), &config).ok());
  CHECK(config.cuda_mps_pipe_directory() == "/run/env-mps");
  config.set_cuda_mps_pipe_directory("/run/config-mps");
  REQUIRE(ApplyEnvironment(EnvOf({{"CUDA_MPS_PIPE_DIRECTORY", "/run/env-mps"}}), &config).ok());
  CHECK(config.cuda_mps_pipe_directory() == "/run/config-mps");
  v1::DaemonConfig unset;
  REQUIRE(FinalizeConfig(&unset).ok());
  CHECK(unset.cuda_mps_pipe_directory() == "/tmp/nvidia-mps");
}

TEST_CASE("environment: a value not understood is refused naming the variable") {
  const std::pair<const char*, const char*> bad[] = {{"KVRAILD_LOW_LATENCY", "of"},
                                                     {"KVRAIL_FABRIC_RELAY", "gpu:"},
                                                     {"KVRAIL_FABRIC_RELAY", "nvlink"},
                                                     {"KVRAIL_FABRIC_GPU_PACK", "kernels"}};
  for (const auto& [name, value] : bad) {
    v1::DaemonConfig config;
    absl::Status status = ApplyEnvironment(EnvOf({{name, value}}), &config);
    INFO(name << "=" << value);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(status.message()).rfind(std::string(name) + ": '", 0) == 0);
  }
}

TEST_CASE("fabric: defaults, nics from tcp_listen's host, bad keys named") {
  auto parsed = ParseConfig("tcp_listen: '10.1.2.3:7070' insecure_peers: true", "t");
  REQUIRE(parsed.ok());
  REQUIRE(FinalizeConfig(&*parsed).ok());
  const v1::FabricConfig& f = parsed->fabric();
  CHECK(f.provider() == "tcp;ofi_rxm");
  CHECK(f.slots() == 16);
  CHECK(f.slot_bytes() == 4u << 20);
  CHECK(f.liveness_timeout_ms() == 3000);
  CHECK(f.heartbeat_interval_ms() == 300);
  CHECK(f.lane_timeout_ms() == 500);
  CHECK(f.lane_cooldown_ms() == 2000);
  CHECK(f.relay() == "auto");
  CHECK(f.gpu_pack() == "kernel");
  REQUIRE(f.nics_size() == 1);
  CHECK(f.nics(0) == "10.1.2.3");
  CHECK(parsed->low_latency());
  CHECK(parsed->cuda_warm_up());
  CHECK(parsed->cuda_wake_on_submit());
  CHECK(parsed->cuda_done_words());
  CHECK(parsed->cuda_warm_plans());
  CHECK(parsed->cuda_stream_wait_jobs() == 8);

  auto refused = [](const char* text) {
    auto config = ParseConfig(text, "t");
    REQUIRE(config.ok());
    return std::string(FinalizeConfig(&*config).message());
  };
  CHECK(refused("fabric { relay: 'gpu:x' }").rfind("fabric.relay: 'gpu:x'", 0) == 0);
  CHECK(refused("fabric { gpu_pack: 'dma' }").rfind("fabric.gpu_pack: 'dma'", 0) == 0);
  // Peers need a NIC address: none given, and tcp_listen's host is the wildcard.
  CHECK(refused("tcp_listen: '0.0.0.0:7070' insecure_peers: true "
                "peers { key: 'b' value: '10.0.0.2:7070' }")
            .rfind("fabric.nics: ", 0) == 0);
}

}  // namespace
}  // namespace kvrail::config

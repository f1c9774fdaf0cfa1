// Each module's options from a finalized config: the values kvraild starts with, without
// starting it.
#include "daemon/options.h"

#include <catch2/catch.hpp>

#include "daemon/config/config.h"

namespace kvrail::daemon {
namespace {

v1::DaemonConfig Finalized(const std::string& text) {
  absl::StatusOr<v1::DaemonConfig> config = config::ParseConfig(text, "test");
  REQUIRE(config.ok());
  REQUIRE(config::FinalizeConfig(&*config).ok());
  return *config;
}

v1::GetTopologyResponse TwoGpus() {
  v1::GetTopologyResponse topology;
  topology.mutable_desc()->add_gpus()->set_uuid("GPU-a");
  topology.mutable_desc()->add_gpus()->set_uuid("GPU-b");
  topology.mutable_desc()->add_nics()->set_name("mlx5_0");
  return topology;
}

TEST_CASE("CUDA engine: the config's defaults, critical_ctas unset is -1, low_latency off") {
  engine::CudaEngineOptions o = CudaEngineOptionsFrom(Finalized(""));
  CHECK(o.max_ctas == 32);
  CHECK(o.batch_bytes == uint64_t{64} << 20);
  CHECK(o.copy_only_kernel_ctas == 4);
  CHECK(o.copy_split_max_percent == 40);
  CHECK(o.warm_up);
  CHECK(o.wake_on_submit);
  CHECK_FALSE(o.stream_wait);
  CHECK(o.stream_wait_jobs == 8);
  CHECK(o.critical_ctas == -1);
  CHECK_FALSE(o.run_on_destination);
  CHECK(o.dispatcher_spin_us == 100);
  CHECK(o.staged_plan_upload);
  CHECK(o.done_words);
  CHECK(o.warm_plans);

  o = CudaEngineOptionsFrom(
      Finalized("cuda_warm_plans: false cuda_done_words: false cuda_critical_ctas: 0 cuda_warm_up: "
                "false cuda_run_on: "
                "'destination' low_latency: false "
                "cuda_stream_wait: true cuda_stream_wait_jobs: 3 critical_limits { max_ctas: 7 }"));
  CHECK(o.critical_ctas == 0);
  CHECK_FALSE(o.warm_up);
  CHECK(o.run_on_destination);
  CHECK(o.stream_wait);
  CHECK(o.stream_wait_jobs == 3);
  CHECK(o.dispatcher_spin_us == 0);
  CHECK_FALSE(o.staged_plan_upload);
  CHECK_FALSE(o.done_words);
  CHECK_FALSE(o.warm_plans);
  CHECK(o.limits[0].max_ctas == 7);
  CHECK(o.limits[1].max_ctas == 0);
}

TEST_CASE("CUDA engine: the dispatcher's idle spin and its budget from the config") {
  engine::CudaEngineOptions o = CudaEngineOptionsFrom(Finalized(""));
  CHECK(o.dispatcher_spin_us == 100);      // unset, low_latency: today's 100 us
  CHECK(o.dispatcher_spin_budget == 1.0);  // unset: no cap
  o = CudaEngineOptionsFrom(
      Finalized("cuda_dispatcher_spin_us: 3000 cuda_dispatcher_spin_budget_percent: 50"));
  CHECK(o.dispatcher_spin_us == 3000);
  CHECK(o.dispatcher_spin_budget == 0.5);
  CHECK(CudaEngineOptionsFrom(Finalized("cuda_dispatcher_spin_us: 10000")).dispatcher_spin_us ==
        10000);
  CHECK(CudaEngineOptionsFrom(Finalized("cuda_dispatcher_spin_budget_percent: 0"))
            .dispatcher_spin_budget == 0.0);
  // low_latency off: no spin unless one is asked for.
  CHECK(CudaEngineOptionsFrom(Finalized("low_latency: false")).dispatcher_spin_us == 0);
  CHECK(CudaEngineOptionsFrom(Finalized("low_latency: false cuda_dispatcher_spin_us: 2500"))
            .dispatcher_spin_us == 2500);
}

TEST_CASE("predictive wake: the switch and its sizes, for the poll thread and the dispatchers") {
  const session::SessionServerOptions s = SessionOptionsFrom(Finalized(""), 1024);
  const engine::CudaEngineOptions c = CudaEngineOptionsFrom(Finalized(""));
  CHECK(s.predictive_wake);  // unset, low_latency: the documented default (on)
  CHECK(c.predictive_wake);
  CHECK(s.wake.margin == absl::Microseconds(50));
  CHECK(s.wake.tolerance == absl::Microseconds(100));
  CHECK(s.wake.max_gap == absl::Milliseconds(50));
  CHECK(c.wake.margin == absl::Microseconds(50));
  CHECK(c.wake.tolerance == absl::Microseconds(100));
  CHECK_FALSE(SessionOptionsFrom(Finalized("low_latency: false"), 1024).predictive_wake);
  CHECK_FALSE(CudaEngineOptionsFrom(Finalized("predictive_wake: false")).predictive_wake);
  const v1::DaemonConfig on = Finalized(
      "low_latency: false predictive_wake: true predictive_wake_margin_us: 20 "
      "predictive_wake_tolerance_us: 300 predictive_wake_max_gap_us: 200000");
  for (const PredictiveWakeOptions& w :
       {SessionOptionsFrom(on, 1024).wake, CudaEngineOptionsFrom(on).wake}) {
    CHECK(w.margin == absl::Microseconds(20));
    CHECK(w.tolerance == absl::Microseconds(300));
    CHECK(w.max_gap == absl::Milliseconds(200));
  }
  CHECK(SessionOptionsFrom(on, 1024).predictive_wake);
  CHECK(CudaEngineOptionsFrom(on).predictive_wake);
}

TEST_CASE("fabric: defaults from the config, nics from tcp_listen's host, relay and gpu_pack") {
  fabric::FabricOptions o = FabricOptionsFrom(
      Finalized("tcp_listen: '10.0.0.5:7070' insecure_peers: true peers { key: 'b' value: "
                "'10.0.0.6:7070' } fabric { relay: 'gpu:1' gpu_pack: 'copy' }"),
      TwoGpus());
  CHECK(o.node_id != "");
  CHECK(o.provider == "tcp;ofi_rxm");
  CHECK(o.nic_addresses == std::vector<std::string>{"10.0.0.5"});
  CHECK(o.slots == 16);
  CHECK(o.slot_bytes == uint64_t{4} << 20);
  CHECK(o.liveness_timeout == absl::Seconds(3));
  CHECK(o.heartbeat_interval == absl::Milliseconds(300));
  CHECK(o.lane_timeout == absl::Milliseconds(500));
  CHECK(o.lane_cooldown == absl::Seconds(2));
  CHECK(o.relay == "gpu:1");
  CHECK_FALSE(o.gpu_pack_kernels);
  CHECK(o.topology_summary == "2 GPUs, 1 NICs");
  REQUIRE(o.topology != nullptr);
  CHECK(o.topology->gpus_size() == 2);
}

TEST_CASE("sessions: max_sessions from the fd limit when 0; spin follows low_latency") {
  const v1::DaemonConfig config = Finalized("unix_socket: '/tmp/k.sock'");
  CHECK(MaxSessionsFrom(config, 1024) == 256);
  CHECK(MaxSessionsFrom(config, 40) == 16);          // at least 16
  CHECK(MaxSessionsFrom(config, 1 << 30) == 65536);  // at most 65536
  CHECK(MaxSessionsFrom(config, 0) == 65536);        // unlimited
  CHECK(MaxSessionsFrom(Finalized("max_sessions: 9"), 1024) == 9);
  session::SessionServerOptions o = SessionOptionsFrom(config, 1024);
  CHECK(o.path == "/tmp/k.sock.session");
  CHECK(o.mode == 0660u);
  // One uid cannot take every session: a quarter of them per uid unless configured.
  CHECK(o.max_sessions == 256);
  CHECK(o.max_sessions_per_uid == 64);
  CHECK(MaxSessionsPerUidFrom(config, 16) == 4);
  CHECK(MaxSessionsPerUidFrom(config, 3) == 1);
  CHECK(MaxSessionsPerUidFrom(config, 65536) == 256);
  CHECK(MaxSessionsPerUidFrom(Finalized("max_sessions_per_uid: 300"), 256) == 300);
  CHECK(o.spin == absl::Microseconds(100));
  CHECK(SessionOptionsFrom(Finalized("low_latency: false"), 1024).spin == absl::ZeroDuration());
  CHECK(o.admission_workers == 4);  // unset: the documented default
  CHECK(SessionOptionsFrom(Finalized("session_admission_workers: 0"), 1024).admission_workers == 0);
  CHECK(SessionOptionsFrom(Finalized("session_admission_workers: 9"), 1024).admission_workers == 9);
  CHECK(o.admission_bulk_workers == 1);  // unset: the documented default, guarded
  CHECK(o.admission_bulk_deadline == absl::Milliseconds(100));
  CHECK(SessionOptionsFrom(Finalized("session_admission_bulk_deadline_ms: 0"), 1024)
            .admission_bulk_deadline == absl::ZeroDuration());
  CHECK(SessionOptionsFrom(Finalized("session_admission_bulk_workers: 0"), 1024)
            .admission_bulk_workers == 0);
  CHECK(SessionOptionsFrom(Finalized("session_admission_bulk_workers: 3"), 1024)
            .admission_bulk_workers == 3);
  CHECK(o.spin_budget == 0.10);  // unset: the documented 10 percent of a core
  CHECK(SessionOptionsFrom(Finalized("session_spin_budget_percent: 100"), 1024).spin_budget == 1.0);
  CHECK(SessionOptionsFrom(Finalized("session_spin_budget_percent: 0"), 1024).spin_budget == 0.0);
  CHECK(SessionOptionsFrom(Finalized("session_spin_budget_percent: 35"), 1024).spin_budget == 0.35);
  CHECK(o.spin_free == absl::Microseconds(100));  // unset: the documented default
  CHECK(SessionOptionsFrom(Finalized("low_latency: false"), 1024).spin_free ==
        absl::ZeroDuration());
  CHECK(SessionOptionsFrom(Finalized("session_spin_free_us: 2000"), 1024).spin_free ==
        absl::Milliseconds(2));
  // A spin across a decode step's gap (up to 10 ms).
  CHECK(o.submission_spin == absl::Microseconds(50));
  CHECK(SessionOptionsFrom(Finalized("session_submission_spin_us: 5000"), 1024).submission_spin ==
        absl::Microseconds(5000));
  CHECK(SessionOptionsFrom(Finalized("session_submission_spin_us: 10000"), 1024).submission_spin ==
        absl::Microseconds(10000));
}

TEST_CASE("host engine: threads, class limits, the inline byte limit and low_latency off") {
  const HostEngineOptions o = HostEngineOptionsFrom(Finalized(""));
  CHECK(o.threads == 4);
  CHECK(o.inline_max_bytes == 65536);  // unset: the documented default with low_latency
  CHECK(HostEngineOptionsFrom(Finalized("low_latency: false")).inline_max_bytes == 0);
  CHECK(HostEngineOptionsFrom(Finalized("low_latency: false host_inline_max_bytes: 4096"))
            .inline_max_bytes == 4096);
  CHECK(HostEngineOptionsFrom(Finalized("host_inline_max_bytes: 0")).inline_max_bytes == 0);
  const HostEngineOptions limited = HostEngineOptionsFrom(
      Finalized("host_engine_threads: 2 background_limits { max_inflight_bytes: 4096 }"));
  CHECK(limited.threads == 2);
  CHECK(limited.limits[static_cast<int>(engine::PriorityClass::kBackground)].max_inflight_bytes ==
        4096);
}

TEST_CASE("server, transfers, regions, metrics, MPS: copied from the config") {
  const v1::DaemonConfig config = Finalized(
      "node_id: 'n1' tcp_listen: '127.0.0.1:0' insecure_peers: true tile_bytes: 65536 "
      "peers { key: 'n2' value: '127.0.0.2:1' } metrics_listen: '127.0.0.1:0' "
      "max_regions_per_session: 5 cuda_mps_pipe_directory: '/run/mps'");
  server::ServerOptions s = ServerOptionsFrom(config);
  CHECK(s.node_id == "n1");
  CHECK(s.listen == std::vector<std::string>{"127.0.0.1:0"});
  REQUIRE(s.peers.size() == 1);
  CHECK(s.peers[0].node_id() == "n2");
  CHECK(s.peers[0].state() == v1::PEER_STATE_UNKNOWN);
  CHECK(s.max_watchers_per_session == 64);
  transfers::Options t = TransferOptionsFrom(config, TwoGpus());
  CHECK(t.node_id == "n1");
  CHECK(t.tile_bytes == 65536);
  CHECK(t.defer_id_checks_from == 32768);
  CHECK(t.history == 10000);
  CHECK(t.max_prepared_per_session == 1024);  // unset: the documented default
  CHECK(TransferOptionsFrom(Finalized("max_prepared_per_session: 7"), TwoGpus())
            .max_prepared_per_session == 7);
  CHECK(t.topology.gpus_size() == 2);
  CHECK(RegionLimitsFrom(config).max_regions_per_session == 5);
  CHECK(RegionLimitsFrom(config).max_regions_per_uid == 16384);
  metrics::MetricsOptions m = MetricsOptionsFrom(config, 2, 1);
  CHECK(m.listen == "127.0.0.1:0");
  CHECK(m.cuda_mode == "auto");
  CHECK(m.gpus == 2);
  CHECK(m.cuda_gpus == 1);
  CHECK(MpsProbeOptionsFrom(config, 42).pipe_directory == "/run/mps");
  CHECK(MpsProbeOptionsFrom(config, 42).daemon_uid == 42u);
  CHECK(DiscoverOptionsFrom(config).mps_pipe_directory == "/run/mps");
  CHECK(MpsProbeOptionsFrom(Finalized(""), 0).pipe_directory == "/tmp/nvidia-mps");
}

TEST_CASE("etcd: client, record and directory options") {
  const v1::DaemonConfig config = Finalized(
      "node_id: 'n1' tcp_listen: '10.0.0.5:7070' insecure_peers: true "
      "etcd { endpoints: '10.0.0.9:2379' username: 'kv' password_file: '/p' }");
  directory::EtcdClientOptions c = EtcdClientOptionsFrom(config);
  CHECK(c.endpoints == std::vector<std::string>{"10.0.0.9:2379"});
  CHECK(c.username == "kv");
  CHECK(c.password.empty());  // read from the file at start, not here
  directory::NodeRecordInputs r = NodeRecordInputsFrom(config, TwoGpus(), "inst", "build");
  CHECK(r.address == "10.0.0.5:7070");
  CHECK(r.fabric_addresses == std::vector<std::string>{"10.0.0.5"});
  CHECK(r.instance_id == "inst");
  directory::EtcdDirectoryOptions d = EtcdDirectoryOptionsFrom(config, r);
  CHECK(d.self == "n1");
  CHECK(d.prefix == "/kvrail/v1/nodes/");
  CHECK(d.ttl_s == 10);
  CHECK(d.endpoints == c.endpoints);
}

TEST_CASE("hot restart: the handover socket, whom to take over from, and the waits") {
  handover::HotRestartOptions cold = HotRestartOptionsFrom(Finalized("unix_socket: '/r/k.sock'"));
  CHECK(cold.listen_path == "/r/k.sock.handover");
  CHECK(cold.take_over_path.empty());
  CHECK_FALSE(cold.cold_when_nobody_answers);
  CHECK(cold.commit_timeout == absl::Seconds(30));
  CHECK(cold.bundle_timeout == absl::Seconds(40));  // drain_timeout_ms (10 s) + 30 s
  CHECK_FALSE(cold.linger_after_handover);

  handover::HotRestartOptions automatic = HotRestartOptionsFrom(
      Finalized("unix_socket: '/r/k.sock' take_over: 'auto' linger_after_handover: true "
                "handover_timeout_ms: 5000 drain_timeout_ms: 2000"));
  CHECK(automatic.take_over_path == "/r/k.sock.handover");
  CHECK(automatic.cold_when_nobody_answers);
  CHECK(automatic.commit_timeout == absl::Seconds(5));
  CHECK(automatic.bundle_timeout == absl::Seconds(7));
  CHECK(automatic.linger_after_handover);

  handover::HotRestartOptions named = HotRestartOptionsFrom(
      Finalized("unix_socket: '/r/k.sock' take_over: '/old/k.sock.handover'"));
  CHECK(named.take_over_path == "/old/k.sock.handover");
  CHECK_FALSE(named.cold_when_nobody_answers);
  CHECK(named.listen_path == "/r/k.sock.handover");
}

}  // namespace
}  // namespace kvrail::daemon

#include "tests/fuzz/fuzz_daemon.h"

#include <errno.h>
#include <google/protobuf/stubs/logging.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "base/clock.h"
#include "base/unique_fd.h"
#include "daemon/engine/host_engine.h"
#include "daemon/transfers/engine_registry.h"
#include "spdlog/spdlog.h"
#include "wire/session_wire.h"

namespace kvrail::fuzz {

void Check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "%s: %s\n", program_invocation_short_name, what);
    __builtin_trap();
  }
}

void CheckAnswered(const grpc::Status& s) {
  Check(s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
            s.error_code() != grpc::StatusCode::UNAVAILABLE,
        "a call was not answered");
  if (!s.ok()) Check(!s.error_message().empty(), "an error without a message");
}

FuzzDaemon::FuzzDaemon(const FuzzDaemonOptions& options) : name_(options.name) {
  spdlog::set_level(spdlog::level::off);
  google::protobuf::SetLogHandler(nullptr);  // fuzzed strings that are not UTF-8: no log spam
  std::string tmpl = "/tmp/kvrail-fuzz-" + name_ + ".XXXXXX";
  Check(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp");
  dir_ = tmpl;
  sessions_ = sessions::SessionTable::Create();
  regions_ = regions::RegionTable::Create(Clock::Real(), sessions_.get());
  grants_ = access::Grants::Create(Clock::Real(), sessions_.get(), regions_.get());
  if (options.fabric) {
    directory_ = directory::CreateStaticDirectory({{kPeerNode, "127.0.0.1:9"}}, "node-fuzz");
    fabric::FabricOptions fabric_options;
    fabric_options.node_id = "node-fuzz";
    fabric_options.nic_addresses = {"127.0.0.1"};
    fabric_options.slots = options.slots;
    fabric_options.slot_bytes = options.slot_bytes;
    fabric_options.pack_threads = 1;
    fabric_options.unpack_threads = 1;
    auto created =
        fabric::Fabric::Create(fabric_options, regions_.get(), grants_.get(), directory_.get());
    if (!created.ok()) fprintf(stderr, "%s\n", created.status().ToString().c_str());
    Check(created.ok(), "fabric");
    fabric_ = *std::move(created);
  }
  hub_ = transfers::NotificationHub::Create(
      [t = sessions_.get()](uint64_t s) { return t->SessionOpen(s); });
  sessions_->AddSessionEndHook([h = hub_.get()](uint64_t s) { h->EndSession(s); });
  engine_ = engine::CreateHostEngine(1);
  transfers::Options transfer_options;
  transfer_options.node_id = "node-fuzz";
  transfer_options.tile_bytes = 4096;
  transfer_options.notifications = hub_.get();
  transfer_options.history = 256;
  transfers::EngineRegistry engines;
  engines.Add(engine_.get());
  transfers_ = transfers::TransferManager::Create(regions_.get(), grants_.get(), engines,
                                                  Clock::Real(), transfer_options);
  sessions_->AddSessionEndHook([t = transfers_.get()](uint64_t s) { t->EndSession(s); });

  server::ServerOptions server_options;
  const std::string address = "unix:" + dir_ + "/kvrail.sock";
  server_options.listen = {address};
  server_options.node_id = "node-fuzz";
  server_options.notifications = hub_.get();
  server_options.max_watchers_per_session = options.max_watchers_per_session;
  server_options.max_watchers_per_uid = options.max_watchers_per_uid;
  if (fabric_ != nullptr) {
    server_options.extra_services.push_back(fabric_->peer_service());
    server_options.export_region = [f = fabric_.get()](uint64_t region_id,
                                                       const std::string& peer_node) {
      return f->ExportRegion(region_id, peer_node);
    };
  }
  auto started = server::Server::Start(server_options, sessions_.get(), regions_.get(),
                                       grants_.get(), transfers_.get());
  if (!started.ok()) fprintf(stderr, "%s\n", started.status().ToString().c_str());
  Check(started.ok(), "server");
  server_ = *std::move(started);
  channel_ = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

FuzzDaemon::~FuzzDaemon() {
  server_->Shutdown(absl::Seconds(1));
  server_.reset();
  channel_.reset();
  transfers_->Drain(absl::ZeroDuration());
  transfers_.reset();
  fabric_.reset();
  directory_.reset();
  engine_.reset();
  grants_.reset();
  regions_.reset();
  sessions_.reset();
}

uint64_t FuzzDaemon::OpenSession() { return sessions_->BeginSession(); }

std::string FuzzDaemon::Credential(uint64_t session) const {
  return wire::SessionMetadataValue(session, sessions_->SessionSecret(session));
}

uint64_t FuzzDaemon::RegisterHostRegion(uint64_t session, v1::RegionSpec spec) {
  UniqueFd fd(::memfd_create(name_.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  Check(fd.valid() && ::ftruncate(fd.get(), static_cast<off_t>(spec.size_bytes())) == 0, "memfd");
  auto token = sessions_->AddFd(session, std::move(fd));
  Check(token.ok(), "token");
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.mutable_share()->set_fd_token(*token);
  auto region = regions_->Register(spec, session);
  if (!region.ok()) fprintf(stderr, "%s\n", region.status().ToString().c_str());
  Check(region.ok(), "register");
  return (*region)->id();
}

v1::Grant FuzzDaemon::Grant(uint64_t session, uint64_t region, v1::GrantAccess access) {
  v1::CreateGrantRequest request;
  request.set_region_id(region);
  request.set_access(access);
  sessions::Caller owner;
  owner.session_id = session;
  auto granted = grants_->CreateGrant(request, owner);
  Check(granted.ok(), "grant");
  return *std::move(granted);
}

std::unique_ptr<grpc::ClientContext> FuzzDaemon::Context(const std::string& credential) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!credential.empty()) context->AddMetadata(wire::kSessionMetadataKey, credential);
  return context;
}

}  // namespace kvrail::fuzz

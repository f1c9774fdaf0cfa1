// libFuzzer target: the Transfer and Admin services' requests through the daemon's own server
// (daemon/server: caller check, authorization, the manager's validation) over a unix socket in
// this process, with a host engine moving bytes between two memfd regions of one session, the
// "owner". Each input is a sequence of calls:
//   op byte (low 4 bits: the RPC; bits 4-5: who calls - the owner, another session, an anonymous
//   caller, a garbled credential; bit 6: the message alone instead of merged over a valid
//   template), a 2-byte little-endian length, then that many bytes of serialized protobuf.
// The templates (a transfer between the owner's regions, its id, a grant of its source) let the
// fuzzer reach deep states. Whatever the calls:
//   - every call is answered (no crash, no hang; ASan and UBSan quiet), an error with a message;
//   - no answer but CreateGrant's carries a grant token (a token is returned once);
//   - a caller that is not the owner never learns that one of the owner's transfers exists:
//     reading, waiting for, watching, cancelling or marking ready any id is never
//     PERMISSION_DENIED for it (an unknown id's NOT_FOUND);
// and what an input submitted is cancelled and what it granted revoked at its end.
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/unique_fd.h"
#include "daemon/access/access.h"
#include "daemon/engine/host_engine.h"
#include "daemon/regions/regions.h"
#include "daemon/server/server.h"
#include "daemon/sessions/sessions.h"
#include "daemon/transfers/engine_registry.h"
#include "daemon/transfers/notifications.h"
#include "daemon/transfers/transfers.h"
#include "proto/kvrail/v1/admin.grpc.pb.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "spdlog/spdlog.h"
#include "wire/session_wire.h"

namespace {

namespace v1 = kvrail::v1;

void Check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "transfer_service_fuzzer: %s\n", what);
    __builtin_trap();
  }
}

constexpr uint64_t kRegionBytes = 64 << 10;

enum class Who { kOwner = 0, kOther = 1, kAnonymous = 2, kGarbled = 3 };

struct Daemon {
  std::string dir;
  std::unique_ptr<kvrail::sessions::SessionTable> sessions;
  std::unique_ptr<kvrail::regions::RegionTable> regions;
  std::unique_ptr<kvrail::access::Grants> grants;
  std::unique_ptr<kvrail::engine::Engine> engine;
  std::unique_ptr<kvrail::transfers::NotificationHub> hub;
  std::unique_ptr<kvrail::transfers::TransferManager> transfers;
  std::unique_ptr<kvrail::server::Server> server;
  std::unique_ptr<v1::Transfer::Stub> stub;
  std::unique_ptr<v1::Admin::Stub> admin;
  uint64_t owner = 0, other = 0;
  std::string owner_credential, other_credential;
  uint64_t src = 0, dst = 0;
  v1::SubmitTransferRequest submit;
  std::string grant;  // a live read grant of the owner's source

  uint64_t Region(bool writable) {
    kvrail::UniqueFd fd(::memfd_create("transfer_fuzzer", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    Check(fd.valid() && ::ftruncate(fd.get(), kRegionBytes) == 0, "memfd");
    auto token = sessions->AddFd(owner, std::move(fd));
    Check(token.ok(), "token");
    v1::RegionSpec spec;
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
    spec.set_size_bytes(kRegionBytes);
    spec.mutable_bytes();  // a plain byte region
    spec.set_writable(writable);
    spec.mutable_share()->set_fd_token(*token);
    auto region = regions->Register(spec, owner);
    if (!region.ok()) fprintf(stderr, "%s\n", region.status().ToString().c_str());
    Check(region.ok(), "register");
    return (*region)->id();
  }

  Daemon() {
    spdlog::set_level(spdlog::level::off);
    google::protobuf::SetLogHandler(nullptr);
    char tmpl[] = "/tmp/kvrail-fuzz-transfer.XXXXXX";
    Check(::mkdtemp(tmpl) != nullptr, "mkdtemp");
    dir = tmpl;
    sessions = kvrail::sessions::SessionTable::Create();
    regions = kvrail::regions::RegionTable::Create(kvrail::Clock::Real(), sessions.get());
    grants = kvrail::access::Grants::Create(kvrail::Clock::Real(), sessions.get(), regions.get());
    hub = kvrail::transfers::NotificationHub::Create(
        [t = sessions.get()](uint64_t s) { return t->SessionOpen(s); });
    sessions->AddSessionEndHook([h = hub.get()](uint64_t s) { h->EndSession(s); });
    engine = kvrail::engine::CreateHostEngine(1);
    kvrail::transfers::Options options;
    options.node_id = "node-fuzz";
    options.tile_bytes = 4096;
    options.notifications = hub.get();
    options.history = 256;
    kvrail::transfers::EngineRegistry engines;
    engines.Add(engine.get());
    transfers = kvrail::transfers::TransferManager::Create(regions.get(), grants.get(), engines,
                                                           kvrail::Clock::Real(), options);
    sessions->AddSessionEndHook([t = transfers.get()](uint64_t s) { t->EndSession(s); });
    // Sessions as the session socket would open them; no uid: neither is the operator.
    owner = sessions->BeginSession();
    other = sessions->BeginSession();
    owner_credential = kvrail::wire::SessionMetadataValue(owner, sessions->SessionSecret(owner));
    other_credential = kvrail::wire::SessionMetadataValue(other, sessions->SessionSecret(other));
    src = Region(false);
    dst = Region(true);

    kvrail::server::ServerOptions server_options;
    const std::string address = "unix:" + dir + "/kvrail.sock";
    server_options.listen = {address};
    server_options.node_id = "node-fuzz";
    server_options.notifications = hub.get();
    server_options.max_watchers_per_session = 8;
    server_options.max_watchers_per_uid = 16;
    auto started = kvrail::server::Server::Start(server_options, sessions.get(), regions.get(),
                                                 grants.get(), transfers.get());
    if (!started.ok()) fprintf(stderr, "%s\n", started.status().ToString().c_str());
    Check(started.ok(), "server");
    server = *std::move(started);
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    stub = v1::Transfer::NewStub(channel);
    admin = v1::Admin::NewStub(channel);

    v1::TransferSpec* spec = submit.mutable_spec();
    spec->mutable_src()->set_region_id(src);
    spec->mutable_dst()->set_region_id(dst);
    spec->set_num_bytes(8192);
    v1::CreateGrantRequest request;
    request.set_region_id(src);
    request.set_access(v1::GRANT_ACCESS_READ);
    kvrail::sessions::Caller caller;
    caller.session_id = owner;
    auto granted = grants->CreateGrant(request, caller);
    Check(granted.ok(), "grant");
    grant = granted->token();

    // The template works.
    v1::SubmitTransferResponse response;
    auto context = Context(Who::kOwner);
    grpc::Status s = stub->SubmitTransfer(context.get(), submit, &response);
    if (!s.ok()) fprintf(stderr, "%s\n", s.error_message().c_str());
    Check(s.ok(), "template submit");
  }

  // Stops in kvraild's order: the server (its calls end), the manager (drained), the engine.
  ~Daemon() {
    server->Shutdown(absl::Seconds(1));
    server.reset();
    stub.reset();
    admin.reset();
    transfers->Drain(absl::ZeroDuration());
    transfers.reset();
    engine.reset();
    grants.reset();
    regions.reset();
    sessions.reset();
  }

  std::unique_ptr<grpc::ClientContext> Context(Who who) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    switch (who) {
      case Who::kOwner:
        context->AddMetadata(kvrail::wire::kSessionMetadataKey, owner_credential);
        break;
      case Who::kOther:
        context->AddMetadata(kvrail::wire::kSessionMetadataKey, other_credential);
        break;
      case Who::kAnonymous:
        break;
      case Who::kGarbled:
        context->AddMetadata(kvrail::wire::kSessionMetadataKey,
                             absl::StrCat(owner, ".0123456789abcdef0123456789abcdef"));
        break;
    }
    return context;
  }
};

// A call that does not answer within its deadline is a hang: a finding.
void CheckAnswered(const grpc::Status& s) {
  Check(s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
            s.error_code() != grpc::StatusCode::UNAVAILABLE,
        "a call was not answered");
  if (!s.ok()) Check(!s.error_message().empty(), "an error without a message");
}

// No answer but CreateGrant's carries a token.
void CheckNoToken(const google::protobuf::Message& answer) {
  Check(answer.SerializeAsString().find("kvg1.") == std::string::npos,
        "an answer carries a grant token");
}

// A caller other than the owner gets no PERMISSION_DENIED for a transfer id (it would tell the
// id exists).
void CheckNotProbed(Who who, const grpc::Status& s) {
  if (who != Who::kOwner) {
    Check(s.error_code() != grpc::StatusCode::PERMISSION_DENIED,
          "another caller learned that a transfer exists");
  }
}

template <typename M>
bool Build(const M& tmpl, bool raw, const uint8_t* p, size_t n, M* out) {
  M fuzz;
  if (!fuzz.ParseFromArray(p, static_cast<int>(n))) return false;
  if (raw) {
    *out = fuzz;
  } else {
    *out = tmpl;
    out->MergeFrom(fuzz);
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Daemon* d = [] {
    Daemon* daemon = new Daemon();
    // libFuzzer ends with exit(): stop the daemon first, not under its running threads.
    std::atexit([] { delete d; });
    return daemon;
  }();
  std::vector<uint64_t> submitted;
  std::vector<std::string> granted;
  uint64_t last_id = 0;
  size_t at = 0;
  for (int calls = 0; calls < 16 && at + 3 <= size; ++calls) {
    const uint8_t op = data[at];
    const size_t n = std::min<size_t>(data[at + 1] | (size_t{data[at + 2]} << 8), size - at - 3);
    const uint8_t* p = data + at + 3;
    at += 3 + n;
    const Who who = static_cast<Who>((op >> 4) & 3);
    const bool raw = (op & 0x40) != 0;
    auto context = d->Context(who);
    grpc::Status s;
    switch (op & 0x0f) {
      case 0: {
        v1::SubmitTransferRequest request;
        v1::SubmitTransferRequest tmpl = d->submit;
        if (who != Who::kOwner) tmpl.mutable_spec()->mutable_src()->set_grant(d->grant);
        if (!Build(tmpl, raw, p, n, &request)) continue;
        v1::SubmitTransferResponse response;
        s = d->stub->SubmitTransfer(context.get(), request, &response);
        if (s.ok()) {
          submitted.push_back(response.transfer_id());
          last_id = response.transfer_id();
        }
        CheckNoToken(response);
        break;
      }
      case 1: {
        v1::GetTransferRequest tmpl, request;
        tmpl.set_transfer_id(last_id);
        if (!Build(tmpl, raw, p, n, &request)) continue;
        v1::TransferStatus response;
        s = d->stub->GetTransfer(context.get(), request, &response);
        CheckNoToken(response);
        CheckNotProbed(who, s);
        break;
      }
      case 2: {
        v1::WaitTransferRequest tmpl, request;
        tmpl.set_transfer_id(last_id);
        if (!Build(tmpl, raw, p, n, &request)) continue;
        request.set_timeout_ms(request.timeout_ms() % 50 + 1);  // bounded: never "forever"
        v1::TransferStatus response;
        s = d->stub->WaitTransfer(context.get(), request, &response);
        CheckNoToken(response);
        CheckNotProbed(who, s);
        break;
      }
      case 3: {
        v1::CancelTransferRequest tmpl, request;
        tmpl.set_transfer_id(last_id);
        if (!Build(tmpl, raw, p, n, &request)) continue;
        v1::TransferStatus response;
        s = d->stub->CancelTransfer(context.get(), request, &response);
        CheckNoToken(response);
        CheckNotProbed(who, s);
        break;
      }
      case 4: {
        v1::MarkReadyRequest tmpl, request;
        tmpl.set_transfer_id(last_id);
        if (!Build(tmpl, raw, p, n, &request)) continue;
        v1::MarkReadyResponse response;
        s = d->stub->MarkReady(context.get(), request, &response);
        CheckNotProbed(who, s);
        break;
      }
      case 5: {
        v1::CreateGrantRequest tmpl, request;
        tmpl.set_region_id(d->dst);
        tmpl.set_access(v1::GRANT_ACCESS_WRITE);
        tmpl.set_ttl_ms(60000);
        if (!Build(tmpl, raw, p, n, &request)) continue;
        v1::Grant response;
        s = d->stub->CreateGrant(context.get(), request, &response);
        if (s.ok()) granted.push_back(response.token());
        break;
      }
      case 6: {
        v1::RevokeGrantRequest tmpl, request;
        if (!granted.empty()) tmpl.set_token(granted.back());
        if (!Build(tmpl, raw, p, n, &request)) continue;
        if (request.token() == d->grant) continue;  // the template's grant stays
        v1::RevokeGrantResponse response;
        s = d->stub->RevokeGrant(context.get(), request, &response);
        break;
      }
      case 7: {
        // Only callers that do not own them: the owner's regions stay for the next input.
        if (who == Who::kOwner) continue;
        v1::UnregisterRegionRequest tmpl, request;
        tmpl.set_region_id(d->src);
        if (!Build(tmpl, raw, p, n, &request)) continue;
        v1::UnregisterRegionResponse response;
        s = d->stub->UnregisterRegion(context.get(), request, &response);
        if (request.region_id() == d->src || request.region_id() == d->dst) {
          Check(!s.ok(), "another caller unregistered the owner's region");
        }
        break;
      }
      case 8: {
        v1::NotificationPollRequest tmpl, request;
        tmpl.set_session_id(d->owner);
        if (!Build(tmpl, raw, p, n, &request)) continue;
        request.set_timeout_ms(request.timeout_ms() % 50);
        v1::NotificationPollResponse response;
        s = d->stub->PollNotifications(context.get(), request, &response);
        CheckNoToken(response);
        break;
      }
      case 9: {
        v1::WatchTransferRequest tmpl, request;
        tmpl.set_transfer_id(last_id);
        if (!Build(tmpl, raw, p, n, &request)) continue;
        auto reader = d->stub->WatchTransfer(context.get(), request);
        v1::TransferEvent event;
        for (int i = 0; i < 2 && reader->Read(&event); ++i) CheckNoToken(event);
        context->TryCancel();
        s = reader->Finish();
        if (s.error_code() == grpc::StatusCode::CANCELLED) s = grpc::Status::OK;
        CheckNotProbed(who, s);
        break;
      }
      case 10: {
        v1::ListTransfersRequest tmpl, request;
        if (!Build(tmpl, raw, p, n, &request)) continue;
        v1::ListTransfersResponse response;
        s = d->admin->ListTransfers(context.get(), request, &response);
        CheckNoToken(response);
        if (who != Who::kOwner) {
          for (const auto& t : response.transfers()) {
            Check(t.spec().session_id() != d->owner, "another caller listed the owner's transfer");
          }
        }
        break;
      }
      case 11: {
        v1::NotificationWatchRequest tmpl, request;
        tmpl.set_session_id(d->owner);
        if (!Build(tmpl, raw, p, n, &request)) continue;
        auto reader = d->stub->WatchNotifications(context.get(), request);
        context->TryCancel();
        v1::Notification note;
        while (reader->Read(&note)) CheckNoToken(note);
        s = reader->Finish();
        if (s.error_code() == grpc::StatusCode::CANCELLED) s = grpc::Status::OK;
        break;
      }
      default: {
        v1::GetStatsRequest request;
        if (!Build(v1::GetStatsRequest(), raw, p, n, &request)) continue;
        v1::Stats response;
        s = d->admin->GetStats(context.get(), request, &response);
        CheckNoToken(response);
        break;
      }
    }
    CheckAnswered(s);
  }
  // What this input began ends here: the next input starts from the same daemon state.
  for (uint64_t id : submitted) {
    v1::CancelTransferRequest cancel;
    cancel.set_transfer_id(id);
    v1::TransferStatus status;
    auto context = d->Context(Who::kOwner);
    CheckAnswered(d->stub->CancelTransfer(context.get(), cancel, &status));
  }
  for (const std::string& token : granted) {
    kvrail::sessions::Caller caller;
    caller.session_id = d->owner;
    (void)d->grants->RevokeGrant(token, caller);
  }
  return 0;
}

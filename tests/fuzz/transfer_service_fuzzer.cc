// libFuzzer target: the Transfer and Admin services' requests through the daemon's own server
// (daemon/server: caller check, authorization, the manager's validation) over a unix socket in
// this process (fuzz_daemon.h, with a fabric so that exports reach the leases), with a host engine
// moving bytes between two memfd regions of one session, the "owner". Each input is a sequence of
// calls:
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
//   - only the owner exports a region (ExportRegion succeeds for no other caller);
// and what an input submitted is cancelled and what it granted revoked at its end.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/kvrail/v1/admin.grpc.pb.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "tests/fuzz/fuzz_daemon.h"

namespace {

namespace v1 = kvrail::v1;
using kvrail::fuzz::Build;
using kvrail::fuzz::Check;
using kvrail::fuzz::CheckAnswered;

constexpr uint64_t kRegionBytes = 64 << 10;

enum class Who { kOwner = 0, kOther = 1, kAnonymous = 2, kGarbled = 3 };

kvrail::fuzz::FuzzDaemonOptions DaemonOptions() {
  kvrail::fuzz::FuzzDaemonOptions options;
  options.name = "transfer";
  options.fabric = true;
  return options;
}

// The daemon, the owner's two regions (a source and a writable destination), and the templates.
// Members are set in declaration order; the stubs go before the daemon (declared after it).
struct Daemon {
  kvrail::fuzz::FuzzDaemon daemon{DaemonOptions()};
  std::unique_ptr<v1::Transfer::Stub> stub = v1::Transfer::NewStub(daemon.channel());
  std::unique_ptr<v1::Admin::Stub> admin = v1::Admin::NewStub(daemon.channel());
  const uint64_t owner = daemon.OpenSession();
  const uint64_t other = daemon.OpenSession();
  const std::string owner_credential = daemon.Credential(owner);
  const std::string other_credential = daemon.Credential(other);
  const uint64_t src = Region(false);
  const uint64_t dst = Region(true);
  v1::SubmitTransferRequest submit;
  std::string grant;  // a live read grant of the owner's source

  Daemon() {
    v1::TransferSpec* spec = submit.mutable_spec();
    spec->mutable_src()->set_region_id(src);
    spec->mutable_dst()->set_region_id(dst);
    spec->set_num_bytes(8192);
    grant = daemon.Grant(owner, src, v1::GRANT_ACCESS_READ).token();

    // The template works.
    v1::SubmitTransferResponse response;
    auto context = Context(Who::kOwner);
    grpc::Status s = stub->SubmitTransfer(context.get(), submit, &response);
    if (!s.ok()) fprintf(stderr, "%s\n", s.error_message().c_str());
    Check(s.ok(), "template submit");
  }

  uint64_t Region(bool writable) {
    v1::RegionSpec spec;
    spec.set_size_bytes(kRegionBytes);
    spec.mutable_bytes();  // a plain byte region
    spec.set_writable(writable);
    return daemon.RegisterHostRegion(owner, spec);
  }

  std::unique_ptr<grpc::ClientContext> Context(Who who) {
    switch (who) {
      case Who::kOwner:
        return daemon.Context(owner_credential);
      case Who::kOther:
        return daemon.Context(other_credential);
      case Who::kAnonymous:
        return daemon.Context("");
      case Who::kGarbled:
        break;
    }
    return daemon.Context(absl::StrCat(owner, ".0123456789abcdef0123456789abcdef"));
  }
};

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
      case 12: {
        v1::ExportRegionRequest tmpl, request;
        tmpl.set_region_id(d->dst);
        tmpl.set_peer_node_id(kvrail::fuzz::kPeerNode);
        if (!Build(tmpl, raw, p, n, &request)) continue;
        v1::RegionLease response;
        s = d->stub->ExportRegion(context.get(), request, &response);
        CheckNoToken(response);
        if (s.ok()) Check(who == Who::kOwner, "a caller other than the owner exported a region");
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
    (void)d->daemon.grants().RevokeGrant(token, caller);
  }
  return 0;
}

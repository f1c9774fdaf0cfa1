// A tenant that floods kvraild with everything one uid may hold open or ask for at once
// (docs/security.md "Caps"), run by tests/load:flood_test as a uid of its own beside the
// checksummed clients. Usage: flooder --socket PATH
//
// Held floods, each until the daemon refuses it naming its cap: sessions of this uid (the rest of
// max_sessions_per_uid), fd tokens passed over many sessions (max_fd_tokens_per_uid), session
// WAITs on a transfer that never ends (max_watchers_per_session per connection, then
// max_watchers_per_uid), watch streams, notification watches and notification polls over gRPC
// (max_watchers_per_session, then max_watchers_per_uid). Storms, each on a thread of its own as
// fast as the daemon answers: CreateGrant until the live-grant cap (4096 per session: reached in
// a long run only) then RevokeGrant of them all,
// SubmitTransfer naming a 64 MiB block table in shared memory for a one-block transfer,
// ListTransfers and GetTransfer probing every id below the highest seen from a session that
// submitted nothing, and WAITs refused at the uid cap.
//
// Prints "<key> <value>" lines: what each held flood got and its first refusal, then "UP" once
// all are in place. The storms run until stdin closes; then it prints their counts (and
// "leaks N": answers that showed another session's transfer, which must be 0) and "END", and
// exits, closing everything. Exit 1 when it could not set itself up.
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/unique_fd.h"
#include "proto/kvrail/v1/admin.grpc.pb.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "wire/session_wire.h"

namespace kvrail::testing {
namespace {

// The flood's pools: 2 layers x 2 parts x 16 blocks of 16 tokens, 2 heads of 8 bf16.
constexpr uint32_t kBlocks = 16;
constexpr uint64_t kPoolBytes = 2ull * 2 * kBlocks * 16 * 2 * 8 * 2;
// The oversized block table: 16M ids (64 MiB) for a transfer of one block.
constexpr uint32_t kTableIds = 1u << 24;

void Say(const std::string& key, const std::string& value) {
  std::printf("%s %s\n", key.c_str(), value.c_str());
  std::fflush(stdout);
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "flooder: %s\n", what.c_str());
  std::exit(1);
}

// One session of this uid on a raw session-socket connection (WAITs are sent without waiting
// for their answers, which come when the transfer ends).
struct RawSession {
  UniqueFd sock;
  uint64_t id = 0;
  std::string credential;
  std::string refusal;  // the daemon's answer instead of a greeting
};

RawSession OpenRaw(const std::string& session_path) {
  RawSession s;
  s.sock = UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, session_path.c_str(), sizeof(addr.sun_path) - 1);
  if (!s.sock.valid() ||
      ::connect(s.sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    s.refusal = absl::StrCat("connect: ", std::strerror(errno));
    s.sock.Reset();
    return s;
  }
  timeval tv{5, 0};
  ::setsockopt(s.sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  absl::StatusOr<std::string> greeting = wire::ReceivePacket(s.sock.get());
  absl::StatusOr<uint64_t> id =
      greeting.ok() ? wire::ParseGreeting(*greeting) : absl::StatusOr<uint64_t>(greeting.status());
  if (!id.ok()) {
    s.refusal = greeting.ok() ? *greeting : greeting.status().ToString();
    s.sock.Reset();
    return s;
  }
  s.id = *id;
  s.credential = wire::SessionMetadataValue(s.id, wire::ParseGreetingSecret(*greeting));
  return s;
}

std::unique_ptr<grpc::ClientContext> Context(const std::string& credential) {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!credential.empty()) context->AddMetadata(wire::kSessionMetadataKey, credential);
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return context;
}

std::string Text(const grpc::Status& s) {
  return absl::StrCat(s.error_code(), " ", s.error_message());
}

class Flooder {
 public:
  explicit Flooder(const std::string& socket)
      : session_path_(wire::SessionSocketPath(socket)),
        channel_(grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials())),
        stub_(v1::Transfer::NewStub(channel_)),
        admin_(v1::Admin::NewStub(channel_)) {}

  void SetUp() {
    main_ = OpenRaw(session_path_);
    if (!main_.sock.valid()) Die("main session: " + main_.refusal);
    auto fd_session = wire::SessionConnection::Open(session_path_);
    if (!fd_session.ok()) Die(fd_session.status().ToString());
    // The main session's regions are registered through a connection that is the main session:
    // its own fd tokens name them.
    src_ = Register(false, kPoolBytes, true);
    dst_ = Register(true, kPoolBytes, true);
    table_ = Register(false, uint64_t{kTableIds} * 4, false);
    v1::SubmitTransferRequest submit;
    v1::TransferSpec& spec = *submit.mutable_spec();
    spec.mutable_src()->set_region_id(src_);
    spec.mutable_src()->add_block_ids(1);
    spec.mutable_dst()->set_region_id(dst_);
    spec.mutable_dst()->add_block_ids(2);
    spec.set_layerwise(true);  // no layer is ever marked ready: it never ends
    v1::SubmitTransferResponse submitted;
    grpc::Status s = stub_->SubmitTransfer(Context(main_.credential).get(), submit, &submitted);
    if (!s.ok()) Die("submit: " + Text(s));
    stuck_ = submitted.transfer_id();
    Say("stuck_transfer", std::to_string(stuck_));
  }

  // Session WAITs on the stuck transfer: 64 per connection (the 65th refused), connections until
  // the uid's cap refuses. Each burst ends with a malformed WAIT, answered at once: the answers
  // before it are the burst's refusals (an accepted WAIT is answered only when its transfer ends).
  void FloodWaits() {
    const std::string wait = wire::EncodeWait(stuck_, main_.credential);
    const std::string sentinel = "WAIT end-of-burst";
    uint64_t pending = 0;
    std::string per_connection, per_uid;
    for (int c = 0; c < 64 && per_uid.empty(); ++c) {
      RawSession s = OpenRaw(session_path_);
      if (!s.sock.valid()) Die("WAIT session: " + s.refusal);
      for (int i = 0; i < 65; ++i) {
        if (!wire::SendPacket(s.sock.get(), wait).ok()) Die("WAIT: send");
      }
      if (!wire::SendPacket(s.sock.get(), sentinel).ok()) Die("WAIT: send");
      int refused = 0;
      while (true) {
        absl::StatusOr<std::string> answer = wire::ReceivePacket(s.sock.get());
        if (!answer.ok()) Die("WAIT: no answer: " + answer.status().ToString());
        if (absl::StrContains(*answer, "end-of-burst")) break;
        ++refused;
        if (absl::StrContains(*answer, "max_watchers_per_uid")) {
          if (per_uid.empty()) per_uid = *answer;
        } else if (per_connection.empty()) {
          per_connection = *answer;
        }
      }
      pending += 65 - refused;
      if (per_uid.empty()) {
        wait_sessions_.push_back(std::move(s));
      } else {
        waits_refused_at_uid_ = std::move(s);
      }
    }
    Say("waits_pending", std::to_string(pending));
    Say("wait_connections", std::to_string(wait_sessions_.size() + 1));
    Say("wait_refusal_connection", per_connection);
    Say("wait_refusal_uid", per_uid);
  }

  // gRPC waits and watches: 64 watch streams of the stuck transfer from the main session (the
  // 65th refused), then notification watches and 60 s notification polls from the WAIT
  // sessions until the uid's cap refuses.
  void FloodWatches() {
    v1::WatchTransferRequest watch;
    watch.set_transfer_id(stuck_);
    std::string per_session, per_uid;
    uint64_t open = 0, notification_watches = 0, polls = 0;
    for (int i = 0; i < 65; ++i) {
      auto& reader = Stream<v1::TransferEvent>(
          main_.credential, [&](grpc::ClientContext* c) { return stub_->WatchTransfer(c, watch); });
      v1::TransferEvent event;
      if (reader.Read(&event)) {
        ++open;
        continue;
      }
      per_session = Text(reader.Finish());
      break;
    }
    for (size_t s = 0; s < wait_sessions_.size() && per_uid.empty(); ++s) {
      const RawSession& session = wait_sessions_[s];
      v1::NotificationWatchRequest notify;
      notify.set_session_id(session.id);
      for (int i = 0; i < 32; ++i) {
        Stream<v1::Notification>(session.credential, [&](grpc::ClientContext* c) {
          return stub_->WatchNotifications(c, notify);
        });
        ++notification_watches;
      }
      for (int i = 0; i < 31; ++i) {  // the session's 64th place is the probe's, below
        polls_.push_back(std::make_unique<Poll>());
        Poll& p = *polls_.back();
        p.context.AddMetadata(wire::kSessionMetadataKey, session.credential);
        p.request.set_session_id(session.id);
        p.request.set_timeout_ms(60000);
        stub_->async()->PollNotifications(&p.context, &p.request, &p.response,
                                          [&p](grpc::Status status) {
                                            p.status = std::move(status);
                                            p.answered = true;
                                          });
      }
      // Whether the uid is full: one more poll of this session (a place of its own).
      absl::SleepFor(absl::Milliseconds(50));
      grpc::ClientContext probe;
      probe.AddMetadata(wire::kSessionMetadataKey, session.credential);
      v1::NotificationPollRequest request;
      request.set_session_id(session.id);
      request.set_timeout_ms(10);
      v1::NotificationPollResponse response;
      const grpc::Status probed = stub_->PollNotifications(&probe, request, &response);
      if (absl::StrContains(probed.error_message(), "max_watchers_per_uid")) per_uid = Text(probed);
    }
    for (const auto& p : polls_) polls += p->answered ? 0 : 1;
    Say("transfer_watches", std::to_string(open));
    Say("notification_watches", std::to_string(notification_watches));
    Say("notification_polls_waiting", std::to_string(polls));
    Say("watch_refusal_session", per_session);
    Say("watch_refusal_uid", per_uid);
  }

  // fd tokens: one memfd passed again and again over sessions of their own until refused for the
  // uid (each session may hold 1024, the uid 1024 in all).
  void FloodFdTokens() {
    UniqueFd memfd(::memfd_create("flood", MFD_CLOEXEC));
    if (!memfd.valid()) Die("memfd_create");
    uint64_t tokens = 0;
    std::string refusal;
    for (int s = 0; s < 16 && refusal.empty(); ++s) {
      auto session = wire::SessionConnection::Open(session_path_);
      if (!session.ok()) Die("fd session: " + session.status().ToString());
      for (int i = 0; i < 200; ++i) {
        absl::StatusOr<std::string> token = (*session)->SendFd(memfd.get());
        if (!token.ok()) {
          refusal = std::string(token.status().message());
          break;
        }
        ++tokens;
      }
      fd_sessions_.push_back(*std::move(session));
    }
    Say("fd_tokens", std::to_string(tokens));
    Say("fd_sessions", std::to_string(fd_sessions_.size()));
    Say("fd_refusal", refusal);
  }

  // Sessions until the uid's session cap refuses.
  void FloodSessions() {
    std::string refusal;
    for (int i = 0; i < 4096 && refusal.empty(); ++i) {
      RawSession s = OpenRaw(session_path_);
      if (!s.sock.valid()) {
        refusal = s.refusal;
        break;
      }
      spare_sessions_.push_back(std::move(s));
    }
    Say("sessions", std::to_string(1 + wait_sessions_.size() + 1 + fd_sessions_.size() +
                                   spare_sessions_.size()));
    Say("session_refusal", refusal);
  }

  // The storms, until `stop`.
  void Storm(const std::atomic<bool>& stop) {
    std::vector<std::thread> threads;
    threads.emplace_back([&] { GrantStorm(stop); });
    threads.emplace_back([&] { TableStorm(stop); });
    threads.emplace_back([&] { ProbeStorm(stop); });
    threads.emplace_back([&] { WaitStorm(stop); });
    for (auto& t : threads) t.join();
    Say("grants_created", std::to_string(grants_created_.load()));
    Say("grants_refused", std::to_string(grants_refused_.load()));
    Say("grant_refusal", grant_refusal_);
    Say("tables_refused", std::to_string(tables_refused_.load()));
    Say("table_refusal", table_refusal_);
    Say("table_refusal_max_us", std::to_string(table_max_us_.load()));
    Say("probes", std::to_string(probes_.load()));
    Say("leaks", std::to_string(leaks_.load()));
    Say("waits_refused", std::to_string(waits_refused_.load()));
  }

 private:
  struct Poll {
    grpc::ClientContext context;
    v1::NotificationPollRequest request;
    v1::NotificationPollResponse response;
    grpc::Status status;
    std::atomic<bool> answered{false};
  };
  struct AnyStream {
    virtual ~AnyStream() = default;
  };
  template <typename T>
  struct TypedStream : AnyStream {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReader<T>> reader;
  };

  // Opens a server stream that stays open (no deadline) until this process exits.
  template <typename T>
  grpc::ClientReader<T>& Stream(
      const std::string& credential,
      const std::function<std::unique_ptr<grpc::ClientReader<T>>(grpc::ClientContext*)>& open) {
    auto stream = std::make_unique<TypedStream<T>>();
    stream->context = std::make_unique<grpc::ClientContext>();
    stream->context->AddMetadata(wire::kSessionMetadataKey, credential);
    stream->reader = open(stream->context.get());
    grpc::ClientReader<T>& reader = *stream->reader;
    streams_.push_back(std::move(stream));
    return reader;
  }

  // A region of the main session over a memfd of `bytes` (paged KV when `paged`).
  uint64_t Register(bool writable, uint64_t bytes, bool paged) {
    UniqueFd memfd(::memfd_create("flood-region", MFD_CLOEXEC));
    if (!memfd.valid() || ::ftruncate(memfd.get(), static_cast<off_t>(bytes)) != 0) {
      Die("memfd for a region");
    }
    if (!wire::SendPacket(main_.sock.get(), wire::kFdRequest, memfd.get()).ok()) Die("FD");
    absl::StatusOr<std::string> answer = wire::ReceivePacket(main_.sock.get());
    absl::StatusOr<std::string> token =
        answer.ok() ? wire::ParseTokenAnswer(*answer) : answer.status();
    if (!token.ok()) Die("FD: " + token.status().ToString());
    v1::RegisterRegionRequest request;
    v1::RegionSpec& spec = *request.mutable_spec();
    spec.set_name(paged ? (writable ? "flood-dst" : "flood-src") : "flood-table");
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
    spec.set_size_bytes(bytes);
    spec.set_writable(writable);
    spec.mutable_share()->set_fd_token(*token);
    if (paged) {
      v1::PagedKvLayout& l = *spec.mutable_paged_kv();
      l.set_num_layers(2);
      l.set_num_parts(2);
      l.set_num_blocks(kBlocks);
      l.set_tokens_per_block(16);
      l.set_num_heads(2);
      l.set_head_dim(8);
      l.set_dtype(v1::DTYPE_BF16);
      l.set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
    } else {
      spec.mutable_bytes();
    }
    request.set_session_id(main_.id);
    v1::RegisterRegionResponse response;
    const grpc::Status s =
        stub_->RegisterRegion(Context(main_.credential).get(), request, &response);
    if (!s.ok()) Die("register: " + Text(s));
    return response.region().region_id();
  }

  void GrantStorm(const std::atomic<bool>& stop) {
    std::vector<std::string> live;
    while (!stop.load()) {
      v1::CreateGrantRequest request;
      request.set_region_id(src_);
      request.set_access(v1::GRANT_ACCESS_READ);
      v1::Grant grant;
      const grpc::Status s = stub_->CreateGrant(Context(main_.credential).get(), request, &grant);
      if (s.ok()) {
        ++grants_created_;
        live.push_back(grant.token());
        continue;
      }
      ++grants_refused_;
      if (grant_refusal_.empty()) grant_refusal_ = Text(s);
      for (const std::string& token : live) {
        v1::RevokeGrantRequest revoke;
        revoke.set_token(token);
        v1::RevokeGrantResponse revoked;
        (void)stub_->RevokeGrant(Context(main_.credential).get(), revoke, &revoked);
      }
      live.clear();
    }
  }

  void TableStorm(const std::atomic<bool>& stop) {
    while (!stop.load()) {
      v1::SubmitTransferRequest submit;
      v1::TransferSpec& spec = *submit.mutable_spec();
      spec.mutable_src()->set_region_id(src_);
      v1::BlockTableRef& table = *spec.mutable_src()->mutable_block_table();
      table.set_region_id(table_);
      table.set_count(kTableIds);
      spec.mutable_dst()->set_region_id(dst_);
      spec.mutable_dst()->add_block_ids(3);
      spec.set_num_tokens(16);
      v1::SubmitTransferResponse submitted;
      const absl::Time began = absl::Now();
      const grpc::Status s =
          stub_->SubmitTransfer(Context(main_.credential).get(), submit, &submitted);
      const int64_t us = absl::ToInt64Microseconds(absl::Now() - began);
      if (s.ok()) {
        table_refusal_ = "ACCEPTED (a 16M-id table for one block)";
        continue;
      }
      ++tables_refused_;
      if (table_refusal_.empty()) table_refusal_ = Text(s);
      int64_t seen = table_max_us_.load();
      while (us > seen && !table_max_us_.compare_exchange_weak(seen, us)) {
      }
    }
  }

  // From the fd-token sessions (none submitted anything): every id up to the highest the daemon
  // has given out plus a margin, and the lists, must show nothing.
  void ProbeStorm(const std::atomic<bool>& stop) {
    const std::string& credential =
        spare_sessions_.empty() ? main_.credential : spare_sessions_.front().credential;
    uint64_t id = 1;
    while (!stop.load()) {
      v1::GetTransferRequest get;
      get.set_transfer_id(id);
      v1::TransferStatus status;
      const grpc::Status s = stub_->GetTransfer(Context(credential).get(), get, &status);
      ++probes_;
      // Another session's transfer and an id never given out are answered alike.
      if (s.ok() || s.error_code() != grpc::StatusCode::NOT_FOUND ||
          s.error_message() != absl::StrCat("transfer_id: no transfer ", id)) {
        if (leaks_.fetch_add(1) == 0) Say("leak_example", absl::StrCat(id, ": ", Text(s)));
      }
      id = id % (stuck_ + 5000) + 1;
      if (id % 64 == 0) {
        v1::ListTransfersRequest list;
        list.set_limit(1000);
        v1::ListTransfersResponse listed;
        const grpc::Status l = admin_->ListTransfers(Context(credential).get(), list, &listed);
        ++probes_;
        if (!l.ok() || listed.transfers_size() != 0) {
          if (leaks_.fetch_add(1) == 0) {
            Say("leak_example", absl::StrCat("ListTransfers: ", Text(l), ", ",
                                             listed.transfers_size(), " transfers"));
          }
        }
      }
    }
  }

  // WAITs on the connection the uid's cap refused: each refused at once.
  void WaitStorm(const std::atomic<bool>& stop) {
    if (!waits_refused_at_uid_.sock.valid()) return;
    const std::string wait = wire::EncodeWait(stuck_, main_.credential);
    timeval tv{5, 0};
    ::setsockopt(waits_refused_at_uid_.sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    while (!stop.load()) {
      if (!wire::SendPacket(waits_refused_at_uid_.sock.get(), wait).ok()) return;
      absl::StatusOr<std::string> answer = wire::ReceivePacket(waits_refused_at_uid_.sock.get());
      if (!answer.ok()) return;
      if (wire::ParseRejected(*answer).has_value()) ++waits_refused_;
    }
  }

  const std::string session_path_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Transfer::Stub> stub_;
  std::unique_ptr<v1::Admin::Stub> admin_;
  RawSession main_;
  uint64_t src_ = 0, dst_ = 0, table_ = 0, stuck_ = 0;
  std::vector<RawSession> wait_sessions_;
  RawSession waits_refused_at_uid_;
  std::vector<std::unique_ptr<wire::SessionConnection>> fd_sessions_;
  std::vector<RawSession> spare_sessions_;
  std::vector<std::unique_ptr<AnyStream>> streams_;
  std::vector<std::unique_ptr<Poll>> polls_;
  std::atomic<uint64_t> grants_created_{0}, grants_refused_{0}, tables_refused_{0}, probes_{0},
      leaks_{0}, waits_refused_{0};
  std::atomic<int64_t> table_max_us_{0};
  std::string grant_refusal_, table_refusal_;  // written by one storm thread each
};

int Main(int argc, char** argv) {
  std::string socket;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--socket") == 0) socket = argv[i + 1];
  }
  if (socket.empty()) Die("usage: flooder --socket PATH");
  Flooder flooder(socket);
  flooder.SetUp();
  flooder.FloodWaits();
  flooder.FloodWatches();
  flooder.FloodFdTokens();
  flooder.FloodSessions();
  std::atomic<bool> stop{false};
  std::thread storms([&] { flooder.Storm(stop); });
  Say("UP", "");
  char byte;
  while (::read(0, &byte, 1) > 0) {
  }
  stop = true;
  storms.join();
  Say("END", "");
  std::_Exit(0);  // everything it holds goes with the process, as when a tenant dies
}

}  // namespace
}  // namespace kvrail::testing

int main(int argc, char** argv) { return kvrail::testing::Main(argc, argv); }

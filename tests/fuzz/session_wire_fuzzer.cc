// libFuzzer target: the session socket's wire (wire/session_wire.h) and the daemon's end of it
// (daemon/session). The first input byte picks what the rest is:
//   even: bytes handed to every parser of the protocol (both directions) and round-trip checks
//         (what an Encode* wrote, the matching Parse* reads back);
//   odd:  a conversation with a real SessionServer over a real SOCK_SEQPACKET connection: the
//         rest is split into packets (2-byte little-endian length, then a flags byte: bit 0 sends
//         a memfd with the packet, bit 1 sends nine, more than kMaxFdsPerPacket), each sent and
//         its answer read. The server must answer every packet with a well-formed answer, never
//         crash or hang, and end the session when the connection closes.
#include <fcntl.h>
#include <google/protobuf/stubs/logging.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "base/clock.h"
#include "base/unique_fd.h"
#include "daemon/session/session_server.h"
#include "daemon/sessions/sessions.h"
#include "spdlog/spdlog.h"
#include "wire/session_wire.h"

namespace {

namespace wire = kvrail::wire;
namespace v1 = kvrail::v1;

void CheckAt(bool ok, int line) {
  if (!ok) {
    fprintf(stderr, "check failed at %s:%d\n", __FILE__, line);
    __builtin_trap();  // a finding: libFuzzer saves the input
  }
}
#define Check(ok) CheckAt((ok), __LINE__)

void FuzzParsers(absl::string_view in) {
  const wire::Request request = wire::ParseRequest(in);
  if (request.kind == wire::RequestKind::kSubmit) (void)wire::ParseSubmitBody(request.body);
  if (request.kind == wire::RequestKind::kPost) (void)wire::ParsePostBody(request.body);
  if (request.kind == wire::RequestKind::kWait) {
    (void)wire::ParseWaitBody(request.body, true);
    Check(!wire::ParseWaitBody(request.body, false).ok());  // never plain: always refused
  }
  if (request.kind == wire::RequestKind::kCancel) {
    absl::StatusOr<uint64_t> id = wire::ParseCancelBody(request.body, true);
    // An id read back reads back the same from the packet the client sends for it.
    if (id.ok()) {
      const std::string again = wire::EncodeCancel(*id);
      absl::StatusOr<uint64_t> reread = wire::ParseCancelBody(wire::ParseRequest(again).body, true);
      Check(reread.ok() && *reread == *id);
    }
    Check(!wire::ParseCancelBody(request.body, false).ok());
  }
  (void)wire::ParseSubmitBody(in);
  (void)wire::ParseWaitBody(in, true);
  absl::StatusOr<uint64_t> greeting = wire::ParseGreeting(in);
  if (greeting.ok()) Check(*greeting != 0);
  (void)wire::ParseGreetingInstance(in);
  (void)wire::ParseGreetingSecret(in);
  auto metadata = wire::ParseSessionMetadata(in);
  if (metadata) {
    auto again =
        wire::ParseSessionMetadata(wire::SessionMetadataValue(metadata->first, metadata->second));
    Check(again && again->first == metadata->first && again->second == metadata->second);
  }
  (void)wire::ParseTokenAnswer(in);
  auto rejected = wire::ParseRejected(in);
  if (rejected) Check(!rejected->ok());
  (void)wire::ParseSubmitAnswer(in);
  (void)wire::ParseDoneAnswer(in);
  bool brief = false;
  absl::StatusOr<v1::TransferStatus> cancelled = wire::ParseCancelAnswer(in, &brief);
  // Whatever status a daemon answers a CANCEL with fits the answer a client reads.
  if (cancelled.ok()) Check(wire::EncodeCancelled(*cancelled).size() <= wire::kMaxAnswerBytes);

  // Round trips with fuzz-chosen values.
  uint64_t id = 0;
  std::memcpy(&id, in.data(), std::min(in.size(), sizeof(id)));
  if (id != 0) {
    const std::string g = wire::EncodeGreeting(id, "0123456789abcdef0123456789abcdef", "s3cr3t");
    absl::StatusOr<uint64_t> parsed = wire::ParseGreeting(g);
    Check(parsed.ok() && *parsed == id);
    Check(wire::ParseGreetingSecret(g) == "s3cr3t");
  }
  absl::StatusOr<uint64_t> wait =
      wire::ParseWaitBody(wire::ParseRequest(wire::EncodeWait(id)).body, true);
  Check(wait.ok() && *wait == id);
  const int code = 1 + static_cast<int>(id % 16);  // every non-OK absl code
  const absl::Status status(static_cast<absl::StatusCode>(code), in);
  auto back = wire::ParseRejected(wire::EncodeRejected(status));
  Check(back.has_value() && back->code() == status.code());
  v1::TransferStatus done;
  done.set_transfer_id(id);
  done.set_error_message(absl::CHexEscape(in));  // a proto string: UTF-8
  absl::StatusOr<v1::TransferStatus> done_back = wire::ParseDoneAnswer(wire::EncodeDone(done));
  Check(done_back.ok() && done_back->transfer_id() == id);
}

// A daemon end that lives for the whole run: a region table, a session server whose SUBMIT
// accepts every spec the wire parsed (admission is the planner fuzzer's), whose WAIT answers at
// once for even ids and NOT_FOUND for odd ones.
struct Server {
  std::string dir;
  std::string path;
  std::unique_ptr<kvrail::sessions::SessionTable> sessions;
  std::unique_ptr<kvrail::session::SessionServer> server;
  Server() {
    spdlog::set_level(spdlog::level::off);
    google::protobuf::SetLogHandler(nullptr);  // fuzzed strings that are not UTF-8: no log spam
    char tmpl[] = "/tmp/kvrail-fuzz-session.XXXXXX";
    Check(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    path = dir + "/kvrail.sock.session";
    sessions = kvrail::sessions::SessionTable::Create();
    auto started = kvrail::session::SessionServer::Start(
        path, 0600, sessions.get(), "0123456789abcdef0123456789abcdef",
        [](const v1::TransferSpec& spec) -> absl::StatusOr<v1::SubmitTransferResponse> {
          if (spec.session_id() == 0) return absl::InternalError("no session bound");
          v1::SubmitTransferResponse response;
          response.set_transfer_id(spec.src().region_id() * 2 + 2);
          return response;
        },
        [](uint64_t id, std::function<void(const v1::TransferStatus&)> done) -> absl::Status {
          if (id % 2 == 1) return absl::NotFoundError("transfer_id: unknown");
          v1::TransferStatus status;
          status.set_transfer_id(id);
          done(status);
          return absl::OkStatus();
        });
    Check(started.ok());
    server = *std::move(started);
  }
};

kvrail::UniqueFd Connect(const std::string& path) {
  kvrail::UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  Check(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  timeval tv{5, 0};  // an answer that never comes is a finding (a hang), not a slow input
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Sends `payload` with `n` descriptors (memfds of one page) in SCM_RIGHTS.
void SendWithFds(int sock, absl::string_view payload, int n) {
  std::vector<kvrail::UniqueFd> fds;
  for (int i = 0; i < n; ++i) {
    kvrail::UniqueFd f(::memfd_create("fuzz", MFD_CLOEXEC));
    Check(f.valid() && ::ftruncate(f.get(), 4096) == 0);
    fds.push_back(std::move(f));
  }
  iovec iov{const_cast<char*>(payload.data()), payload.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * (n > 0 ? n : 1)));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (n > 0) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    for (int i = 0; i < n; ++i) {
      const int raw = fds[i].get();
      std::memcpy(CMSG_DATA(c) + i * sizeof(int), &raw, sizeof(int));
    }
  }
  (void)::sendmsg(sock, &msg, MSG_NOSIGNAL);
}

void FuzzConversation(absl::string_view in) {
  static Server* server = [] {
    Server* s = new Server();
    // libFuzzer ends with exit(): stop the poll thread before statics it may use are destroyed.
    std::atexit([] {
      server->server.reset();
      server->sessions.reset();
    });
    return s;
  }();
  kvrail::UniqueFd sock = Connect(server->path);
  absl::StatusOr<std::string> greeting = wire::ReceivePacket(sock.get());
  Check(greeting.ok() && wire::ParseGreeting(*greeting).ok());
  Check(!wire::ParseGreetingSecret(*greeting).empty());
  int packets = 0;
  while (in.size() >= 3 && packets < 32) {
    const size_t len = std::min<size_t>(in[0] | (static_cast<uint8_t>(in[1]) << 8), in.size() - 3);
    const uint8_t flags = static_cast<uint8_t>(in[2]);
    const absl::string_view payload = in.substr(3, len);
    in.remove_prefix(3 + len);
    ++packets;
    if (payload.empty() && (flags & 3) == 0) continue;  // an empty packet is a close
    SendWithFds(sock.get(), payload, (flags & 2) ? 9 : (flags & 1) ? 1 : 0);
    kvrail::UniqueFd passed;
    absl::StatusOr<std::string> answer = wire::ReceivePacket(sock.get(), &passed);
    Check(answer.ok());      // every packet is answered
    Check(!passed.valid());  // the daemon never hands descriptors out
    const absl::string_view a = *answer;
    Check(a.rfind("TOKEN ", 0) == 0 || a.rfind("ERROR ", 0) == 0 || a.rfind("REJECTED ", 0) == 0 ||
          a.rfind("SUBMITTED ", 0) == 0 || a.rfind("DONE ", 0) == 0);
    if (a.rfind("REJECTED ", 0) == 0) Check(wire::ParseRejected(a).has_value());
  }
  sock = kvrail::UniqueFd();
  // The session ends when its connection closes (its tokens and regions with it): waited for by
  // the clock, 10 s at most (5000 x 100 us was ~0.5 s: a poll thread kept off the CPU that long on
  // a loaded 2-core machine is not a finding; one that never ends the session still is).
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (server->server->active_sessions() != 0 && absl::Now() < until) ::usleep(100);
  Check(server->server->active_sessions() == 0);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // fuzzed strings that are not UTF-8: no log spam
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > wire::kMaxRequestBytes) return 0;
  const absl::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    FuzzParsers(in);
  } else {
    FuzzConversation(in);
  }
  return 0;
}

// The session socket's wire: the client's end against a fake daemon (a SOCK_SEQPACKET server in a
// thread, inside a temporary directory), the packet formats, and the receive function's handling
// of failed receives and of too many descriptors.
#include "wire/session_wire.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "absl/strings/match.h"

namespace kvrail::wire {
namespace {

// Host memory the way the client library makes it (HostBuffer): a memfd mapped MAP_SHARED.
class SharedMemory {
 public:
  explicit SharedMemory(size_t size) : fd_(::memfd_create("t", MFD_CLOEXEC)), size_(size) {
    REQUIRE(fd_.valid());
    REQUIRE(::ftruncate(fd_.get(), static_cast<off_t>(size)) == 0);
    void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    REQUIRE(map != MAP_FAILED);
    data_ = static_cast<uint8_t*>(map);
  }
  ~SharedMemory() { ::munmap(data_, size_); }
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_.get(); }

 private:
  UniqueFd fd_;
  uint8_t* data_ = nullptr;
  size_t size_;
};

// A temporary directory removed (with the files the test put there) on destruction.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kvrail_session_test.XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    ::unlink((path_ + "/k.sock.session").c_str());
    ::rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Listens on `path`, accepts one connection and runs `serve` on it in a thread.
class FakeDaemon {
 public:
  FakeDaemon(const std::string& path, std::function<void(int)> serve) {
    listener_ = UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    REQUIRE(listener_.valid());
    struct sockaddr_un addr;
    std::memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    REQUIRE(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(listener_.get(), 4) == 0);
    thread_ = std::thread([this, serve = std::move(serve)] {
      UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!conn.valid()) return;
      serve(conn.get());
    });
  }
  ~FakeDaemon() { thread_.join(); }

 private:
  UniqueFd listener_;
  std::thread thread_;
};

TEST_CASE("the fd passed over the session socket maps the same memfd") {
  TempDir dir;
  const std::string path = SessionSocketPath(dir.path() + "/k.sock");
  CHECK(path == dir.path() + "/k.sock.session");

  SharedMemory host(1 << 20);
  for (size_t i = 0; i < host.size(); ++i) host.data()[i] = static_cast<uint8_t>(i * 7 + 3);

  std::atomic<bool> server_saw_pattern{false};
  std::atomic<bool> server_wrote{false};
  std::string server_error;
  {
    FakeDaemon daemon(path, [&](int conn) {
      if (!SendPacket(conn, "SESSION 42").ok()) return;
      for (int round = 0; round < 2; ++round) {
        UniqueFd fd;
        auto packet = ReceivePacket(conn, &fd);
        if (!packet.ok() || *packet != "FD" || !fd.valid()) {
          server_error = "bad FD packet";
          (void)SendPacket(conn, "ERROR bad FD packet");
          return;
        }
        struct stat st;
        ::fstat(fd.get(), &st);
        const size_t size = static_cast<size_t>(st.st_size);
        void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
        if (map == MAP_FAILED) {
          server_error = "mmap failed";
          (void)SendPacket(conn, "ERROR mmap failed");
          return;
        }
        auto* bytes = static_cast<uint8_t*>(map);
        bool same = size == (1u << 20);
        for (size_t i = 0; same && i < size; ++i)
          same = bytes[i] == static_cast<uint8_t>(i * 7 + 3);
        server_saw_pattern = same;
        // Write through the daemon's mapping; the client must see it through its own.
        std::memset(bytes + 4096, 0x5A, 4096);
        server_wrote = true;
        ::munmap(map, size);
        (void)SendPacket(conn, round == 0 ? "TOKEN tok-1" : "ERROR too many regions");
      }
      // Wait for the client to close; a closed connection reads as UNAVAILABLE.
      auto eof = ReceivePacket(conn);
      if (eof.ok() || eof.status().code() != absl::StatusCode::kUnavailable) {
        server_error = "expected the client to close";
      }
    });

    {
      auto session = SessionConnection::Open(path);
      REQUIRE(session.ok());
      CHECK((*session)->session_id() == 42);
      auto token = (*session)->SendFd(host.fd());
      REQUIRE(token.ok());
      CHECK(*token == "tok-1");
      CHECK(server_saw_pattern);
      CHECK(server_wrote);
      for (size_t i = 4096; i < 8192; ++i) REQUIRE(host.data()[i] == 0x5A);
      CHECK(host.data()[4095] == static_cast<uint8_t>(4095 * 7 + 3));

      auto refused = (*session)->SendFd(host.fd());
      REQUIRE_FALSE(refused.ok());
      CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
      CHECK_THAT(std::string(refused.status().message()), Catch::Contains("too many regions"));
    }  // closes the session
  }    // FakeDaemon joins its thread
  CHECK(server_error.empty());
}

TEST_CASE("a bad greeting or a vanished daemon is a clear error") {
  TempDir dir;
  const std::string path = dir.path() + "/k.sock.session";
  SECTION("no socket") {
    auto session = SessionConnection::Open(path);
    REQUIRE_FALSE(session.ok());
    CHECK(session.status().code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(std::string(session.status().message()), Catch::Contains(path));
  }
  SECTION("wrong greeting") {
    FakeDaemon daemon(path, [](int conn) { (void)SendPacket(conn, "HELLO 1"); });
    auto session = SessionConnection::Open(path);
    REQUIRE_FALSE(session.ok());
    CHECK_THAT(std::string(session.status().message()), Catch::Contains("HELLO 1"));
  }
  SECTION("daemon closes instead of answering FD") {
    FakeDaemon daemon(path, [](int conn) {
      (void)SendPacket(conn, "SESSION 7\n");  // a trailing newline is tolerated
      UniqueFd fd;
      (void)ReceivePacket(conn, &fd);
    });
    auto session = SessionConnection::Open(path);
    REQUIRE(session.ok());
    CHECK((*session)->session_id() == 7);
    UniqueFd memfd(::memfd_create("t", MFD_CLOEXEC));
    auto token = (*session)->SendFd(memfd.get());
    REQUIRE_FALSE(token.ok());
    CHECK(token.status().code() == absl::StatusCode::kUnavailable);
  }
  SECTION("daemon never answers: the receive timeout fires") {
    std::atomic<bool> done{false};
    FakeDaemon daemon(path, [&](int conn) {
      while (!done) ::usleep(1000);
      (void)conn;
    });
    auto session = SessionConnection::Open(path, absl::Milliseconds(100));
    done = true;
    REQUIRE_FALSE(session.ok());
    CHECK(session.status().code() == absl::StatusCode::kDeadlineExceeded);
  }
}

TEST_CASE("the greeting names the daemon instance; the connection reports the daemon closing") {
  TempDir dir;
  const std::string path = dir.path() + "/k.sock.session";
  std::atomic<bool> close_now{false};
  FakeDaemon daemon(path, [&](int conn) {
    (void)SendPacket(conn, EncodeGreeting(9, "0123456789abcdef0123456789abcdef"));
    for (int ms = 0; ms < 10000 && !close_now; ++ms) ::usleep(1000);  // bounded: never hangs
  });  // returning closes the connection, as a daemon that dies does
  auto session = SessionConnection::Open(path);
  REQUIRE(session.ok());
  CHECK((*session)->session_id() == 9);
  CHECK((*session)->instance_id() == "0123456789abcdef0123456789abcdef");
  CHECK_FALSE((*session)->PeerClosed());

  int wake[2];
  REQUIRE(::pipe2(wake, O_CLOEXEC) == 0);
  UniqueFd wake_read(wake[0]), wake_write(wake[1]);
  SECTION("a wake ends the wait without a close") {
    REQUIRE(::write(wake_write.get(), "x", 1) == 1);
    auto closed = (*session)->WaitForClose(wake_read.get());
    REQUIRE(closed.ok());
    CHECK_FALSE(*closed);
    CHECK_FALSE((*session)->PeerClosed());
    close_now = true;
  }
  SECTION("the daemon closing ends the wait") {
    std::thread closer([&] {
      ::usleep(20000);
      close_now = true;
    });
    auto closed = (*session)->WaitForClose(wake_read.get());
    closer.join();
    REQUIRE(closed.ok());
    CHECK(*closed);
    CHECK((*session)->PeerClosed());
  }
}

TEST_CASE("every packet kind has the protocol's bytes and parses back") {
  CHECK(EncodeGreeting(42) == "SESSION 42");
  const std::string greeting = EncodeGreeting(42, "00ff");
  CHECK(greeting == std::string("SESSION 42\0INSTANCE 00ff", 24));
  // A client that predates the instance reads the id and stops at the NUL.
  CHECK(ParseGreeting(greeting).value() == 42);
  CHECK(ParseGreetingInstance(greeting) == "00ff");
  CHECK(ParseGreetingInstance("SESSION 42").empty());
  CHECK(ParseGreetingInstance(std::string("SESSION 42\0INSTANCE a b", 23)).empty());
  CHECK(ParseGreetingInstance(std::string("SESSION 42\0OTHER 00ff", 21)).empty());
  CHECK(EncodeToken("tok-1") == "TOKEN tok-1");
  CHECK(EncodeError("no room") == "ERROR no room");
  CHECK(EncodeRejected(absl::NotFoundError("transfer 9 unknown")) ==
        "REJECTED 5 transfer 9 unknown");
  CHECK(EncodeWait(77) == "WAIT 77");
  CHECK(std::string(kFdRequest) == "FD");

  v1::SubmitTransferRequest request;
  request.mutable_spec()->mutable_src()->set_region_id(3);
  request.mutable_spec()->mutable_dst()->add_block_ids(17);
  const std::string submit = EncodeSubmit(request);
  CHECK(submit == "SUBMIT " + request.SerializeAsString());
  v1::SubmitTransferResponse response;
  response.set_transfer_id(12);
  CHECK(EncodeSubmitted(response) == "SUBMITTED " + response.SerializeAsString());
  v1::TransferStatus status;
  status.set_transfer_id(12);
  status.set_state(v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(EncodeDone(status) == "DONE " + status.SerializeAsString());

  // Requests, as the daemon sees them.
  Request parsed = ParseRequest(submit);
  CHECK(parsed.kind == RequestKind::kSubmit);
  auto body = ParseSubmitBody(parsed.body);
  REQUIRE(body.ok());
  CHECK(body->SerializeAsString() == request.SerializeAsString());
  CHECK(ParseSubmitBody("\xff\xff\xff garbage").status() ==
        absl::InvalidArgumentError("SUBMIT: not a serialized SubmitTransferRequest"));
  v1::PostTransferRequest post;
  post.set_prepared_id(5);
  post.add_src_block_ids(9);
  post.add_dst_block_ids(4);
  const std::string post_packet = EncodePost(post);  // parsed.body views into it
  parsed = ParseRequest(post_packet);
  CHECK(parsed.kind == RequestKind::kPost);
  auto posted = ParsePostBody(parsed.body);
  REQUIRE(posted.ok());
  CHECK(posted->SerializeAsString() == post.SerializeAsString());
  CHECK(ParsePostBody("\xff\xff\xff garbage").status() ==
        absl::InvalidArgumentError("POST: not a serialized PostTransferRequest"));
  parsed = ParseRequest("WAIT 77");
  CHECK(parsed.kind == RequestKind::kWait);
  CHECK(ParseWaitBody(parsed.body, true).value() == 77);
  CHECK(ParseWaitBody("soon", true).status() ==
        absl::InvalidArgumentError("WAIT: want \"WAIT <transfer id>\", got \"WAIT soon\""));
  CHECK(ParseWaitBody("77", false).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseWaitBody(std::string(100, '9'), true).status().message().size() < 100);
  CHECK(ParseRequest("FD").kind == RequestKind::kFd);
  CHECK(ParseRequest("FD ").kind == RequestKind::kOther);
  CHECK(ParseRequest("SUBMIT").kind == RequestKind::kOther);
  CHECK(ParseRequest("CQ").kind == RequestKind::kCompletionQueue);
  CHECK(ParseRequest("SQ").kind == RequestKind::kSubmissionQueue);
  CHECK(ParseRequest("SQ ").kind == RequestKind::kOther);

  // Answers, as the client sees them.
  CHECK(ParseGreeting("SESSION 42").value() == 42);
  CHECK(ParseGreeting(std::string("SESSION 7\n\0", 11)).value() == 7);
  CHECK(ParseGreeting("SESSION 0").status().code() == absl::StatusCode::kInternal);
  CHECK(ParseTokenAnswer("TOKEN tok-1\n").value() == "tok-1");
  CHECK(ParseTokenAnswer("ERROR too many regions").status() ==
        absl::FailedPreconditionError("too many regions"));
  CHECK(ParseTokenAnswer("TOKEN a b").status().code() == absl::StatusCode::kInternal);
  CHECK(ParseRejected("REJECTED 9 spec.dst.node_id: other") ==
        absl::FailedPreconditionError("spec.dst.node_id: other"));
  CHECK_FALSE(ParseRejected("REJECTED 0 ok").has_value());
  CHECK_FALSE(ParseRejected("REJECTED 17 beyond").has_value());
  CHECK_FALSE(ParseRejected("REJECTED 3").has_value());
  CHECK(ParseSubmitAnswer(EncodeSubmitted(response)).value().transfer_id() == 12);
  CHECK(ParseSubmitAnswer(EncodeRejected(absl::InvalidArgumentError("spec.src: bad"))).status() ==
        absl::InvalidArgumentError("spec.src: bad"));
  CHECK(ParseSubmitAnswer("ERROR expected FD").status().code() == absl::StatusCode::kUnimplemented);
  CHECK(ParseSubmitAnswer("SUBMITTED \xff").status().code() == absl::StatusCode::kInternal);
  CHECK(ParseDoneAnswer(EncodeDone(status)).value().SerializeAsString() ==
        status.SerializeAsString());
  CHECK(ParseDoneAnswer("REJECTED 5 transfer 9 unknown").status() ==
        absl::NotFoundError("transfer 9 unknown"));
  CHECK(ParseDoneAnswer("DONE \xff").status().code() == absl::StatusCode::kInternal);
  CHECK(ParseDoneAnswer("ERROR what").status().code() == absl::StatusCode::kUnimplemented);
}

TEST_CASE("CANCEL: the packet, its body's checks, and an answer that always fits a packet") {
  CHECK(EncodeCancel(77) == "CANCEL 77");
  const std::string packet = EncodeCancel(77);
  Request parsed = ParseRequest(packet);
  CHECK(parsed.kind == RequestKind::kCancel);
  CHECK(ParseCancelBody(parsed.body, true).value() == 77);
  CHECK(ParseCancelBody("77", false).status().code() == absl::StatusCode::kInvalidArgument);
  // Nothing but the id: no credential (a spare connection's session cancels nothing of the
  // main session's), no sign, no trailing bytes.
  for (const char* bad : {"", "soon", "77 1.abcd", "-1", "+7", "7 ", "99999999999999999999999"}) {
    INFO(bad);
    const absl::Status refused = ParseCancelBody(bad, true).status();
    CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(refused.message(), "CANCEL: want \"CANCEL <transfer id>\""));
  }
  CHECK(ParseCancelBody(std::string(100, '9'), true).status().message().size() < 100);
  CHECK(ParseRequest("CANCEL").kind == RequestKind::kOther);

  v1::TransferStatus status;
  status.set_transfer_id(12);
  status.set_state(v1::TRANSFER_STATE_CANCELLED);
  status.mutable_spec()->mutable_src()->add_block_ids(3);
  status.set_error_message("cancelled by a client");
  bool brief = true;
  auto whole = ParseCancelAnswer(EncodeCancelled(status), &brief);
  REQUIRE(whole.ok());
  CHECK_FALSE(brief);
  CHECK(whole->SerializeAsString() == status.SerializeAsString());
  CHECK(EncodeCancelled(status) == "CANCELLED " + status.SerializeAsString());

  // A spec whose ids do not fit an answer: the status without them, marked brief.
  for (uint32_t i = 0; i < 20000; ++i) status.mutable_spec()->mutable_dst()->add_block_ids(i);
  const std::string large = EncodeCancelled(status);
  CHECK(large.size() <= kMaxAnswerBytes);
  auto trimmed = ParseCancelAnswer(large, &brief);
  REQUIRE(trimmed.ok());
  CHECK(brief);
  CHECK(trimmed->transfer_id() == 12);
  CHECK(trimmed->state() == v1::TRANSFER_STATE_CANCELLED);
  CHECK(trimmed->error_message() == "cancelled by a client");
  CHECK(trimmed->spec().dst().block_ids_size() == 0);
  // Even an error message longer than a packet: the answer still fits, with the message's start.
  status.set_error_message(std::string(2 * kMaxAnswerBytes, 'x'));
  const std::string longest = EncodeCancelled(status);
  CHECK(longest.size() <= kMaxAnswerBytes);
  auto kept = ParseCancelAnswer(longest, &brief);
  REQUIRE(kept.ok());
  CHECK(brief);
  CHECK(kept->error_message() == std::string(kMaxAnswerBytes / 2, 'x'));

  CHECK(ParseCancelAnswer("REJECTED 5 transfer 9 unknown", nullptr).status() ==
        absl::NotFoundError("transfer 9 unknown"));
  CHECK(ParseCancelAnswer("CANCELLED \xff", nullptr).status().code() ==
        absl::StatusCode::kInternal);
  CHECK(ParseCancelAnswer("ERROR expected FD", nullptr).status().code() ==
        absl::StatusCode::kUnimplemented);
  CHECK(ParseCancelAnswer(EncodeDone(status), nullptr).status().code() ==
        absl::StatusCode::kUnimplemented);
}

// Writes an SCM_RIGHTS header naming `fd` at the start of `buffer`'s control bytes: what a
// previous receive could have left there.
void PlantStaleDescriptor(ReceiveBuffer* buffer, int fd) {
  std::memset(buffer->control(), 0, buffer->control_size());
  auto* cmsg = reinterpret_cast<struct cmsghdr*>(buffer->control());
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
}

bool IsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST_CASE("a failed recvmsg never turns stale control bytes into descriptors to close") {
  // A descriptor of ours that stale control bytes name: it must survive every failed receive.
  UniqueFd victim(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  REQUIRE(victim.valid());
  ReceiveBuffer buffer(kMaxRequestBytes);

  SECTION("recvmsg on something that is not a socket (ENOTSOCK)") {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    UniqueFd read_end(p[0]), write_end(p[1]);
    PlantStaleDescriptor(&buffer, victim.get());
    auto received = ReceiveMessage(read_end.get(), &buffer, MSG_DONTWAIT);
    REQUIRE_FALSE(received.ok());
    CHECK(received.status().code() == absl::StatusCode::kUnavailable);
    CHECK(IsOpen(victim.get()));
  }
  SECTION("the peer closed with our packet unread (ECONNRESET)") {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    UniqueFd ours(sv[0]), peer(sv[1]);
    REQUIRE(SendPacket(ours.get(), "WAIT 1").ok());
    peer = UniqueFd();  // closes with "WAIT 1" unread: we are reset
    PlantStaleDescriptor(&buffer, victim.get());
    auto received = ReceiveMessage(ours.get(), &buffer, MSG_DONTWAIT);
    REQUIRE_FALSE(received.ok());
    CHECK(received.status().code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(std::string(received.status().message()), Catch::Contains(strerror(ECONNRESET)));
    CHECK(IsOpen(victim.get()));
  }
  SECTION("a packet without descriptors after stale bytes") {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    UniqueFd ours(sv[0]), peer(sv[1]);
    REQUIRE(SendPacket(peer.get(), "FD").ok());
    PlantStaleDescriptor(&buffer, victim.get());
    auto received = ReceiveMessage(ours.get(), &buffer, MSG_DONTWAIT);
    REQUIRE(received.ok());
    CHECK(received->payload == "FD");
    CHECK(received->fds.empty());
    CHECK(IsOpen(victim.get()));
  }
}

TEST_CASE("receiving: descriptors, nothing to read, a closed peer, a long packet, too many fds") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  UniqueFd ours(sv[0]), peer(sv[1]);
  ReceiveBuffer buffer(16);

  auto empty = ReceiveMessage(ours.get(), &buffer, MSG_DONTWAIT);
  CHECK(empty.status().code() == absl::StatusCode::kDeadlineExceeded);

  UniqueFd memfd(::memfd_create("t", MFD_CLOEXEC));
  REQUIRE(SendPacket(peer.get(), "FD", memfd.get()).ok());
  auto with_fd = ReceiveMessage(ours.get(), &buffer, MSG_DONTWAIT);
  REQUIRE(with_fd.ok());
  CHECK(with_fd->payload == "FD");
  REQUIRE(with_fd->fds.size() == 1);
  CHECK(with_fd->fds[0].get() != memfd.get());
  CHECK((::fcntl(with_fd->fds[0].get(), F_GETFD) & FD_CLOEXEC) != 0);

  REQUIRE(SendPacket(peer.get(), std::string(40, 'x')).ok());
  auto long_packet = ReceiveMessage(ours.get(), &buffer, MSG_DONTWAIT);
  REQUIRE(long_packet.ok());
  CHECK(long_packet->truncated);
  CHECK(long_packet->payload == std::string(16, 'x'));

  // More descriptors than a packet has room for: the packet fails and every one that arrived is
  // closed (the pipe reads EOF once our own write ends are closed too).
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0);
  UniqueFd read_end(p[0]), write_end(p[1]);
  std::vector<int> fds(kMaxFdsPerPacket + 2, write_end.get());
  {
    char byte = 'F';
    struct iovec iov {
      &byte, 1
    };
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
    struct msghdr msg {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
    REQUIRE(::sendmsg(peer.get(), &msg, MSG_NOSIGNAL) == 1);
  }
  auto too_many = ReceiveMessage(ours.get(), &buffer, MSG_DONTWAIT);
  REQUIRE_FALSE(too_many.ok());
  CHECK(too_many.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(too_many.status().message()), Catch::Contains("truncated"));
  write_end = UniqueFd();
  char c;
  CHECK(::read(read_end.get(), &c, 1) == 0);  // EOF: no write end is left open anywhere

  peer = UniqueFd();
  auto closed = ReceiveMessage(ours.get(), &buffer, MSG_DONTWAIT);
  CHECK(closed.status() == absl::UnavailableError("connection closed by peer"));
}

TEST_CASE("a refused session's answer is the status it names, not a malformed greeting") {
  const std::string refused = EncodeRejected(absl::ResourceExhaustedError(
      "max_sessions: 4096 sessions are open, the most this daemon serves"));
  absl::StatusOr<uint64_t> parsed = ParseGreeting(refused);
  REQUIRE_FALSE(parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(parsed.status().message()).find("max_sessions") != std::string::npos);
  CHECK(ParseGreeting("SESSION x").status().code() == absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace kvrail::wire

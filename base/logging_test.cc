#include "base/logging.h"

#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace kvrail {
namespace {

TEST_CASE("json lines carry fields as members, not inside the message, and stay valid JSON") {
  std::ostringstream out;
  REQUIRE(SetUpLoggingTo("debug", "json", /*journald=*/false, &out).ok());
  LogFields(spdlog::level::debug, "transfer ended \"x\"\n",
            {{"transfer_id", uint64_t{42}},
             {"path", "host_local"},
             {"bytes", uint64_t{1048576}},
             {"seconds", 0.25},
             {"label", "a\"b\\c"}});
  const std::string line = out.str();
  INFO(line);
  CHECK(
      line.find(
          R"("msg":"transfer ended \"x\"\n","transfer_id":42,"path":"host_local","bytes":1048576,"seconds":0.25,"label":"a\"b\\c"})") !=
      std::string::npos);
  CHECK(line.rfind("{\"ts\":", 0) == 0);
  CHECK(line.find('<') == std::string::npos);
  // A plain spdlog line has no fields; a field of the previous line never leaks into it.
  out.str("");
  spdlog::info("plain");
  CHECK(out.str().find(R"("msg":"plain"})") != std::string::npos);
}

TEST_CASE("text lines put fields after the message as key=value") {
  std::ostringstream out;
  REQUIRE(SetUpLoggingTo("debug", "text", false, &out).ok());
  LogFields(spdlog::level::info, "transfer ended", {{"transfer_id", 7}, {"path", "nvlink_p2p"}});
  INFO(out.str());
  CHECK(out.str().find("transfer ended transfer_id=7 path=\"nvlink_p2p\"") != std::string::npos);
}

TEST_CASE("text lines escape control characters: a logged string cannot start a line of its own") {
  std::ostringstream out;
  REQUIRE(SetUpLoggingTo("info", "text", /*journald=*/true, &out).ok());
  spdlog::info("region registered: '{}'", std::string("kv\n<3>forged\r\t\x1b[31m\\n\x7f\0z", 24));
  const std::string text = out.str();
  INFO(text);
  REQUIRE(std::count(text.begin(), text.end(), '\n') == 1);
  CHECK(text.back() == '\n');
  CHECK(text.rfind("<6>info", 0) == 0);
  CHECK(text.find(R"(region registered: 'kv\n<3>forged\r\t\x1b[31m\\n\x7f\x00z')") !=
        std::string::npos);
  // Field keys are escaped too (values are JSON strings already).
  out.str("");
  LogFields(spdlog::level::info, "m", {{"k\ney", "v\n"}});
  CHECK(out.str().find(R"(m k\ney="v\n")") != std::string::npos);
}

TEST_CASE("below the level nothing is formatted or written") {
  std::ostringstream out;
  REQUIRE(SetUpLoggingTo("info", "json", false, &out).ok());
  LogFields(spdlog::level::debug, "per-transfer line", {{"transfer_id", 1}});
  spdlog::debug("also not");
  CHECK(out.str().empty());
}

TEST_CASE("below the level KVRAIL_LOG_FIELDS does not even build its fields") {
  std::ostringstream out;
  REQUIRE(SetUpLoggingTo("info", "json", false, &out).ok());
  int built = 0;
  const auto value = [&built] {
    ++built;
    return 0.25;  // a double: printed with snprintf when built
  };
  // At every transfer's end (debug): nothing built, nothing written.
  KVRAIL_LOG_FIELDS(spdlog::level::debug, "transfer ended", {{"seconds", value()}});
  CHECK(built == 0);
  CHECK(out.str().empty());
  KVRAIL_LOG_FIELDS(spdlog::level::info, "transfer ended", {{"seconds", value()}});
  CHECK(built == 1);
  CHECK(out.str().find("\"seconds\":0.25") != std::string::npos);
}

TEST_CASE("below debug KVRAIL_DEBUG does not even evaluate its arguments") {
  std::ostringstream out;
  REQUIRE(SetUpLoggingTo("info", "json", false, &out).ok());
  int built = 0;
  const auto describe = [&built] {
    ++built;
    return std::string("1 tile of 4096 bytes");  // what a plan's description costs: a string
  };
  KVRAIL_DEBUG("transfer {} accepted: {}", 7, describe());
  CHECK(built == 0);
  CHECK(out.str().empty());
  REQUIRE(SetUpLoggingTo("debug", "json", false, &out).ok());
  KVRAIL_DEBUG("transfer {} accepted: {}", 7, describe());
  CHECK(built == 1);
  CHECK(out.str().find("transfer 7 accepted: 1 tile of 4096 bytes") != std::string::npos);
}

TEST_CASE("under journald each line starts with its syslog priority") {
  std::ostringstream out;
  REQUIRE(SetUpLoggingTo("debug", "text", /*journald=*/true, &out).ok());
  spdlog::debug("d");
  spdlog::info("i");
  spdlog::warn("w");
  spdlog::error("e");
  const std::string text = out.str();
  INFO(text);
  CHECK(text.find("<7>debug") != std::string::npos);
  CHECK(text.find("<6>info") != std::string::npos);
  CHECK(text.find("<4>warning") != std::string::npos);
  CHECK(text.find("<3>error") != std::string::npos);
  // The journal stamps lines; text lines under it carry no time of their own.
  CHECK(text.find("T") == std::string::npos);
  std::ostringstream json;
  REQUIRE(SetUpLoggingTo("info", "json", true, &json).ok());
  spdlog::warn("w");
  CHECK(json.str().rfind("<4>{\"ts\":", 0) == 0);
}

TEST_CASE("JOURNAL_STREAM counts only when it names this process's stderr") {
  struct stat st;
  REQUIRE(::fstat(2, &st) == 0);
  ::unsetenv("JOURNAL_STREAM");
  CHECK_FALSE(StderrIsJournal());
  const std::string mine = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  ::setenv("JOURNAL_STREAM", mine.c_str(), 1);
  CHECK(StderrIsJournal());
  // Inherited from a parent whose stderr went to the journal, while ours goes elsewhere.
  const std::string other = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino + 1);
  ::setenv("JOURNAL_STREAM", other.c_str(), 1);
  CHECK_FALSE(StderrIsJournal());
  ::setenv("JOURNAL_STREAM", "garbage", 1);
  CHECK_FALSE(StderrIsJournal());
  ::unsetenv("JOURNAL_STREAM");
}

TEST_CASE("unknown level or format names the key") {
  std::ostringstream out;
  CHECK(std::string(SetUpLoggingTo("loud", "json", false, &out).message()).rfind("log_level:", 0) ==
        0);
  CHECK(std::string(SetUpLoggingTo("info", "xml", false, &out).message()).rfind("log_format:", 0) ==
        0);
}

// What a journal sender was given: one entry per call, its "FIELD=value" items.
struct FakeJournal {
  std::vector<std::vector<std::string>> entries;
  int result = 0;
  JournalSend Sender() {
    return [this](const struct iovec* items, int count) {
      std::vector<std::string> entry;
      for (int i = 0; i < count; ++i) {
        entry.emplace_back(static_cast<const char*>(items[i].iov_base), items[i].iov_len);
      }
      entries.push_back(std::move(entry));
      return result;
    };
  }
  // The value of FIELD in entry `i` ("" when absent), and how often FIELD occurs there.
  std::string Field(size_t i, const std::string& field) const {
    for (const std::string& item : entries.at(i)) {
      if (item.rfind(field + "=", 0) == 0) return item.substr(field.size() + 1);
    }
    return "";
  }
  int Count(size_t i, const std::string& field) const {
    return static_cast<int>(
        std::count_if(entries.at(i).begin(), entries.at(i).end(),
                      [&](const std::string& item) { return item.rfind(field + "=", 0) == 0; }));
  }
};

TEST_CASE("journal: a forged priority in a region name stays one entry at the line's priority") {
  FakeJournal journal;
  REQUIRE(SetUpLoggingToJournal("info", journal.Sender()).ok());
  const std::string forged = "kv\n<3>kvraild: disk on fire\r\x1b[31m";
  LogFields(spdlog::level::info, "region registered",
            {{"region_id", uint64_t{7}}, {"region_name", forged}, {"bytes", uint64_t{4096}}});
  REQUIRE(journal.entries.size() == 1);
  CHECK(journal.Count(0, "PRIORITY") == 1);
  CHECK(journal.Field(0, "PRIORITY") == "6");
  CHECK(journal.Count(0, "MESSAGE") == 1);
  const std::string message = journal.Field(0, "MESSAGE");
  INFO(message);
  CHECK(message.rfind("region registered", 0) == 0);
  CHECK(message.find('\n') == std::string::npos);
  CHECK(message.find('\r') == std::string::npos);
  CHECK(message.find('\x1b') == std::string::npos);
  // The name is a field of its own, byte for byte as the client gave it.
  CHECK(journal.Field(0, "KVRAIL_REGION_NAME") == forged);
  CHECK(journal.Field(0, "KVRAIL_REGION_ID") == "7");
  CHECK(journal.Field(0, "KVRAIL_BYTES") == "4096");
  CHECK(journal.Field(0, "SYSLOG_IDENTIFIER") == "kvraild");
  CHECK_FALSE(journal.Field(0, "TID").empty());
}

TEST_CASE("journal: plain lines are escaped into MESSAGE; levels map to syslog priorities") {
  FakeJournal journal;
  REQUIRE(SetUpLoggingToJournal("info", journal.Sender()).ok());
  spdlog::debug("not at info");
  spdlog::info("session from '{}'", "a\n<2>b");
  spdlog::warn("w");
  spdlog::error("e");
  spdlog::critical("c");
  REQUIRE(journal.entries.size() == 4);
  CHECK(journal.Field(0, "MESSAGE") == "session from 'a\\n<2>b'");
  CHECK(journal.Field(0, "PRIORITY") == "6");
  CHECK(journal.Field(1, "PRIORITY") == "4");
  CHECK(journal.Field(2, "PRIORITY") == "3");
  CHECK(journal.Field(3, "PRIORITY") == "2");
  // No field of an earlier LogFields line leaks into a plain one.
  CHECK(journal.Count(0, "KVRAIL_REGION_NAME") == 0);
  CHECK_FALSE(SetUpLoggingToJournal("loud", journal.Sender()).ok());
}

TEST_CASE("journal: a fatal start error is one entry at error priority") {
  FakeJournal journal;
  ReportStartErrorTo("config: line 3\n<6>all is well", journal.Sender(), true);
  REQUIRE(journal.entries.size() == 1);
  CHECK(journal.Field(0, "PRIORITY") == "3");
  CHECK(journal.Field(0, "MESSAGE") == "kvraild: config: line 3\\n<6>all is well");
}

// fd 2 goes to a temporary file while this lives; Text() is what was written there.
class CapturedStderr {
 public:
  CapturedStderr() {
    char path[] = "/tmp/kvrail-stderr-XXXXXX";
    fd_ = ::mkstemp(path);
    REQUIRE(fd_ >= 0);
    path_ = path;
    std::fflush(stderr);
    saved_ = ::dup(2);
    REQUIRE(::dup2(fd_, 2) == 2);
  }
  ~CapturedStderr() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  std::string Text() const {
    std::fflush(stderr);
    std::ifstream in(path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  int fd_ = -1;
  int saved_ = -1;
  std::string path_;
};

TEST_CASE("stderr fallbacks: prefixed lines a reader of the journal's stream can read") {
  CapturedStderr captured;
  // Without the native protocol, with stderr the journal's stream: "<3>" first.
  ReportStartErrorTo("cuda_engine: required\nbut none", nullptr, /*stderr_is_journal=*/true);
  // Off the journal: the line as it is.
  ReportStartErrorTo("bad config", nullptr, /*stderr_is_journal=*/false);
  // The journal refused the entry: the same line, prefixed.
  FakeJournal journal;
  journal.result = -11;
  ReportStartErrorTo("socket in use", journal.Sender(), true);
  // A logged line the journal refused: as the text format writes it under journald.
  REQUIRE(SetUpLoggingToJournal("info", journal.Sender()).ok());
  LogFields(spdlog::level::warn, "region registered", {{"region_name", "a\n<3>b"}});
  const std::string text = captured.Text();
  INFO(text);
  CHECK(text.find("<3>kvraild: cuda_engine: required\\nbut none\n") == 0);
  CHECK(text.find("\nkvraild: bad config\n") != std::string::npos);
  CHECK(text.find("\n<3>kvraild: socket in use\n") != std::string::npos);
  CHECK(std::regex_search(
      text, std::regex(R"(\n<4>warning \[\d+\] region registered region_name="a\\n<3>b"\n$)")));
}

TEST_CASE("text fields: a string value escaped as the message is, between double quotes") {
  std::ostringstream out;
  REQUIRE(SetUpLoggingTo("info", "text", false, &out).ok());
  LogFields(spdlog::level::info, "m",
            {{"name", std::string("a\"b\\\r\t\x1b[2J\0z", 12)}, {"n", 3}});
  INFO(out.str());
  CHECK(out.str().find(R"(m name="a\"b\\\r\t\x1b[2J\x00z" n=3)") != std::string::npos);
}

TEST_CASE("journal socket: only a unix socket counts") {
  char dir[] = "/tmp/kvrail-journal-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string socket_path = std::string(dir) + "/socket";
  const std::string file_path = std::string(dir) + "/file";
  CHECK_FALSE(JournalSocketExists(socket_path.c_str()));
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  CHECK(JournalSocketExists(socket_path.c_str()));
  std::ofstream(file_path) << "x";
  CHECK_FALSE(JournalSocketExists(file_path.c_str()));
  ::close(fd);
  ::unlink(socket_path.c_str());
  ::unlink(file_path.c_str());
  ::rmdir(dir);
}

TEST_CASE("journal field names: upper case, digits and underscores") {
  CHECK(JournalFieldName("region_name") == "KVRAIL_REGION_NAME");
  CHECK(JournalFieldName("peer-node.id") == "KVRAIL_PEER_NODE_ID");
  CHECK(JournalFieldName(std::string(100, 'a')).size() == 64);
}

}  // namespace
}  // namespace kvrail

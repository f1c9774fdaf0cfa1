#include "daemon/metrics/process_stats.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <ctime>

namespace kvrail::metrics {
namespace {

// A recorded /proc/<pid>/stat line whose command name holds a space and a ')'.
constexpr char kStat[] =
    "4242 (kvr aild) x) S 1 4242 4242 0 -1 4194560 2000 0 0 0 250 50 0 0 20 0 9 0 123456 "
    "1073741824 25600 18446744073709551615 1 1 0 0 0 0 0 4096 17920 0 0 0 17 1 0 0 0 0 0\n";
constexpr char kSystemStat[] = "cpu  1 2 3 4\nintr 5\nbtime 1700000000\nprocesses 9\n";

TEST_CASE("process stats come from the fields after the command name") {
  auto s = ParseProcessStats(kStat, kSystemStat, /*ticks_per_second=*/100, /*page_bytes=*/4096);
  REQUIRE(s.ok());
  CHECK(s->cpu_seconds == Approx(3.0));                   // (250 + 50) / 100
  CHECK(s->start_time_seconds == Approx(1700001234.56));  // btime + 123456 / 100
  CHECK(s->virtual_bytes == 1073741824.0);
  CHECK(s->resident_bytes == 25600.0 * 4096);
}

TEST_CASE("process stats: truncated or unknown text is refused, naming what is missing") {
  auto cut = ParseProcessStats("4242 (kvraild) S 1 2 3", kSystemStat, 100, 4096);
  REQUIRE_FALSE(cut.ok());
  CHECK(std::string(cut.status().message()).find("field 14") != std::string::npos);
  auto no_comm = ParseProcessStats("4242 kvraild S", kSystemStat, 100, 4096);
  CHECK_FALSE(no_comm.ok());
  auto no_btime = ParseProcessStats(kStat, "cpu 1 2 3\n", 100, 4096);
  REQUIRE_FALSE(no_btime.ok());
  CHECK(std::string(no_btime.status().message()).find("btime") != std::string::npos);
}

TEST_CASE("this process's stats are plausible") {
  auto s = ReadProcessStats();
  REQUIRE(s.ok());
  CHECK(s->resident_bytes > 0);
  CHECK(s->open_fds >= 3);  // stdin, stdout, stderr at least
  CHECK(s->max_fds >= s->open_fds);
  const double now = static_cast<double>(std::time(nullptr));
  CHECK(s->start_time_seconds <= now + 1);
  CHECK(s->start_time_seconds > now - 3600);
}

}  // namespace
}  // namespace kvrail::metrics

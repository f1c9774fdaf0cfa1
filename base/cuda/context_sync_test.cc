#include "base/cuda/context_sync.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <optional>

namespace kvrail::cuda {
namespace {

absl::Time fake_now = absl::FromUnixSeconds(1000);
absl::Time FakeNow() { return fake_now; }

TEST_CASE("context sync scopes: the oldest open one, its name and the count") {
  SetContextSyncClockForTest(&FakeNow);
  CHECK(!OldestContextSync().has_value());
  {
    ContextSyncScope a("cudaHostRegister");
    fake_now += absl::Milliseconds(5);
    std::optional<ContextSyncScope> b;
    b.emplace("cudaIpcOpenMemHandle");
    auto oldest = OldestContextSync();
    REQUIRE(oldest.has_value());
    CHECK(std::strcmp(oldest->what, "cudaHostRegister") == 0);
    CHECK(oldest->since == absl::FromUnixSeconds(1000));
    CHECK(oldest->open == 2);
    b.reset();
    CHECK(OldestContextSync()->open == 1);
  }
  CHECK(!OldestContextSync().has_value());
  {
    ContextSyncScope c("cudaFreeHost");
    CHECK(OldestContextSync()->since == absl::FromUnixSeconds(1000) + absl::Milliseconds(5));
  }
  SetContextSyncClockForTest(nullptr);
}

}  // namespace
}  // namespace kvrail::cuda

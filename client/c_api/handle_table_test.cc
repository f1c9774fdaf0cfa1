#include "client/c_api/handle_table.h"

#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"

namespace kvrail::c_api {
namespace {

TEST_CASE("handles are never 0 and never reused, across tables") {
  HandleTable<int> ints;
  HandleTable<double> doubles;
  std::set<uint64_t> seen;
  for (int i = 0; i < 100; ++i) {
    const uint64_t a = ints.Add(std::make_shared<int>(i));
    const uint64_t b = doubles.Add(std::make_shared<double>(i));
    REQUIRE(a != 0);
    REQUIRE(seen.insert(a).second);
    REQUIRE(seen.insert(b).second);
    ints.Remove(a);  // a removed handle's number is not handed out again
  }
  // A handle of one table is not live in another.
  const uint64_t d = doubles.Add(std::make_shared<double>(1.5));
  CHECK(ints.Find(d) == nullptr);
  CHECK(doubles.Find(d) != nullptr);
}

TEST_CASE("a removed handle is not found, and removing it again is a no-op") {
  HandleTable<int> table;
  const uint64_t h = table.Add(std::make_shared<int>(7));
  REQUIRE(table.Find(h) != nullptr);
  CHECK(*table.Find(h) == 7);
  CHECK(table.Remove(h) != nullptr);
  CHECK(table.Find(h) == nullptr);
  CHECK(table.Remove(h) == nullptr);
  CHECK(table.Find(0) == nullptr);
  CHECK(table.size() == 0);
}

TEST_CASE("an object removed while a caller holds it lives until the caller lets go") {
  HandleTable<int> table;
  auto object = std::make_shared<int>(3);
  std::weak_ptr<int> watch = object;
  const uint64_t h = table.Add(std::move(object));
  std::shared_ptr<int> in_flight = table.Find(h);
  table.Remove(h);
  CHECK_FALSE(watch.expired());
  CHECK(*in_flight == 3);
  in_flight.reset();
  CHECK(watch.expired());
}

TEST_CASE("concurrent add, find and remove keep the table consistent") {
  HandleTable<int> table;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&table, t] {
      for (int i = 0; i < 1000; ++i) {
        const uint64_t h = table.Add(std::make_shared<int>(t * 1000 + i));
        auto found = table.Find(h);
        if (found == nullptr || *found != t * 1000 + i) std::abort();
        if (table.Remove(h) == nullptr) std::abort();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(table.size() == 0);
}

}  // namespace
}  // namespace kvrail::c_api

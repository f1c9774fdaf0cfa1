// Ready-flag watches: a watch stops before the memory it reads may be unmapped.
#include "daemon/transfers/flag_watches.h"

#include <catch2/catch.hpp>
#include <memory>

#include "daemon/transfers/test_support.h"

namespace kvrail::transfers {
namespace {

// Records, when destroyed (the watch stopping), whether the flag region was still held.
class ProbeHandle final : public readiness::WatchHandle {
 public:
  ProbeHandle(std::weak_ptr<regions::Region> region, bool* region_alive_at_stop)
      : region_(std::move(region)), alive_(region_alive_at_stop) {}
  ~ProbeHandle() override { *alive_ = !region_.expired(); }

 private:
  std::weak_ptr<regions::Region> region_;
  bool* alive_;
};

std::shared_ptr<regions::Region> FlagRegion() {
  static testing::TestRegions* regions = new testing::TestRegions();
  return std::make_shared<testing::StandInRegion>(regions->Bytes(4096, false));
}

TEST_CASE("a Watched stops its watch before it lets go of the flag words' region") {
  bool alive_at_stop = false;
  {
    std::shared_ptr<regions::Region> region = FlagRegion();
    std::weak_ptr<regions::Region> weak = region;
    Watched watched(std::make_unique<ProbeHandle>(weak, &alive_at_stop), std::move(region),
                    std::weak_ptr<Record>());
  }
  CHECK(alive_at_stop);
}

TEST_CASE("a Watched moved over another stops the replaced watch before its region goes") {
  bool first_alive = false, second_alive = false;
  {
    std::shared_ptr<regions::Region> a = FlagRegion(), b = FlagRegion();
    std::weak_ptr<regions::Region> wa = a, wb = b;
    Watched watched(std::make_unique<ProbeHandle>(wa, &first_alive), std::move(a),
                    std::weak_ptr<Record>());
    watched = Watched(std::make_unique<ProbeHandle>(wb, &second_alive), std::move(b),
                      std::weak_ptr<Record>());
    CHECK(first_alive);
  }
  CHECK(second_alive);
}

}  // namespace
}  // namespace kvrail::transfers

// For tests: a region table over a session table of its own (declared first: it outlives the
// region table, as in kvraild).
#pragma once

#include <memory>

#include "base/clock.h"
#include "daemon/regions/regions.h"
#include "daemon/sessions/sessions.h"

namespace kvrail::regions::testing {

// Thread-compatible (the tables inside are thread-safe).
struct Tables {
  explicit Tables(RegionLimits limits = {}, uint64_t first_region_id = 1,
                  ::kvrail::sessions::SessionLimits session_limits = {},
                  uint64_t first_session_id = 1, Clock* clock = Clock::Real())
      : sessions(::kvrail::sessions::SessionTable::Create(session_limits, first_session_id)),
        regions(RegionTable::Create(clock, sessions.get(), first_region_id, {}, limits)) {}
  std::unique_ptr<::kvrail::sessions::SessionTable> sessions;
  std::unique_ptr<RegionTable> regions;
};

}  // namespace kvrail::regions::testing

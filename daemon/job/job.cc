#include "daemon/job/job.h"

namespace kvrail::job {

const char* PriorityClassName(PriorityClass p) {
  switch (p) {
    case PriorityClass::kCritical:
      return "critical";
    case PriorityClass::kNormal:
      return "normal";
    case PriorityClass::kBackground:
      return "background";
  }
  return "normal";
}

}  // namespace kvrail::job

#include "daemon/engine/engine.h"

namespace kvrail::engine {

const char* PriorityClassName(PriorityClass p) {
  switch (p) {
    case PriorityClass::kCritical: return "critical";
    case PriorityClass::kNormal: return "normal";
    case PriorityClass::kBackground: return "background";
  }
  return "normal";
}

}  // namespace kvrail::engine

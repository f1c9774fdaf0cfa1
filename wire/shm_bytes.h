// Internal to //wire: little-endian fields of the shared-memory rings' entries (wire/shm_ring.h,
// wire/submission_queue.h) read and written through memcpy, so that an unaligned or foreign
// entry is never accessed through a typed pointer.
//
// Thread contract: free functions over caller-owned bytes, pure.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvrail::wire::internal {

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(v));
}

}  // namespace kvrail::wire::internal

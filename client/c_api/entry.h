// Internal to //client/c_api: what every C entry point shares - the calling thread's last
// result, the guard that keeps C++ exceptions out of C, and handle <-> number conversion.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/c_api/kvrail.h"

namespace kvrail::c_api {

inline uint64_t HandleOf(const void* handle) { return reinterpret_cast<uintptr_t>(handle); }

template <typename Handle>
Handle* HandleFrom(uint64_t number) {
  return reinterpret_cast<Handle*>(static_cast<uintptr_t>(number));
}

// The calling thread's last result (kvrail_last_error_*).
struct LastError {
  int code = KVRAIL_OK;
  std::string message;
};
// Defined out of line (c_api.cc): a thread_local inside an inline function becomes a GNU
// "unique" symbol, which no version script can make local, so libkvrail.so would export it.
LastError& Last();

inline int Finish(const absl::Status& status) {
  LastError& last = Last();
  last.code = static_cast<int>(status.code());
  last.message = std::string(status.message());
  return last.code;
}

// Runs an entry point's body; a C++ exception (bad_alloc from a huge message, say) becomes
// INTERNAL rather than unwinding into C.
template <typename Body>
int Guard(Body&& body) {
  try {
    return Finish(body());
  } catch (const std::exception& e) {
    return Finish(absl::InternalError(absl::StrCat("kvrail: C++ exception: ", e.what())));
  } catch (...) {
    return Finish(absl::InternalError("kvrail: unknown C++ exception"));
  }
}

inline absl::Status RequireOut(const void* out, const char* name) {
  if (out == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, ": NULL out-parameter"));
  return absl::OkStatus();
}

}  // namespace kvrail::c_api

// How this binary was built, for --version, `kvrail status`, Stats.build_info and the
// kvrail_build_info metric. Header-only; the values come from the compiler of each binary.
#pragma once

#include <string>

namespace kvrail::build {

// The project's version (Stats.version, the peer handshake's software_version).
inline constexpr char kVersion[] = "0.1.0";

// "opt" when built with NDEBUG (bazel -c opt), else "dbg".
inline const char* Mode() {
#ifdef NDEBUG
  return "opt";
#else
  return "dbg";
#endif
}

// The compiler that built this translation unit ("gcc 12.2.0", "clang 14.0.6").
inline std::string Compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("gcc ") + __VERSION__;
#else
  return "unknown";
#endif
}

// "kvraild 0.1.0 (gcc 12.2.0, opt)".
inline std::string Info(const std::string& binary) {
  std::string compiler = Compiler();
  // clang's version string may carry a trailing space or a repository path.
  while (!compiler.empty() && compiler.back() == ' ') compiler.pop_back();
  return binary + " " + kVersion + " (" + compiler + ", " + Mode() + ")";
}

}  // namespace kvrail::build

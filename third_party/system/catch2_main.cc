// Catch2's main and its implementation (session, reporters, matchers), compiled once per build
// configuration and linked into every Catch2 test (deps: //third_party/system:catch2_main). A
// test file that defined CATCH_CONFIG_MAIN itself paid for this in each compile: 15-17 s of CPU
// with GCC -O2 or clang ASan -O0, most of a test file's compile time.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

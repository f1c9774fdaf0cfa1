// Paged KV pools in host buffers registered with a live daemon, filled with a known pattern and
// verified byte for byte (including that bytes outside the destination elements stay poisoned).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/kvrail_client.h"
#include "tests/harness/daemon_process.h"

namespace kvrail::testing {

inline constexpr uint8_t kPoison = 0xAB;

// A kvraild started for one test case (REQUIREd to start) and a client connected to it. The
// destructor closes the client first, then stops the daemon with SIGTERM and checks it exits 0.
struct LiveDaemon {
  TempDir dir;
  DaemonProcess daemon;
  std::unique_ptr<client::Client> client;
  explicit LiveDaemon(const std::vector<std::string>& args = {});
  ~LiveDaemon();
};

struct Pool {
  std::unique_ptr<client::HostBuffer> buffer;
  v1::RegionInfo info;
  v1::PagedKvLayout layout;
  uint64_t id() const { return info.region_id(); }
};

// Submits `spec` and waits (up to 60 s) for its end; REQUIREs that both calls succeed.
v1::TransferStatus RunToEnd(client::Client& c, const v1::TransferSpec& spec);

// Creates, poisons and registers a pool; REQUIREs success.
Pool MakePool(client::Client& c, const v1::PagedKvLayout& layout, bool writable,
              const std::string& name = "pool");

// Writes PatternByte(seed, layer, part, token, head, byte) for tokens [0, tokens) that live in
// `blocks` (token i in blocks[i / tpb]).
void FillPool(Pool& pool, uint32_t seed, const std::vector<uint32_t>& blocks, uint64_t tokens);

// What a transfer should have written into the destination.
struct Expectation {
  uint32_t seed = 1;
  std::vector<uint32_t> dst_blocks;
  uint64_t tokens = 0;
  uint32_t src_layer_begin = 0, dst_layer_begin = 0, num_layers = 0;
  uint32_t src_head_begin = 0, dst_head_begin = 0, num_heads = 0;
};

// Empty when the pool holds exactly the expected bytes and poison everywhere else; otherwise the
// first mismatch, described.
std::string VerifyPool(const Pool& pool, const Expectation& e);

// Counts bytes different from kPoison (for "nothing was written" checks).
uint64_t CountWritten(const Pool& pool);

// The pool shape shared by process_test and its source_client helper (128 MiB per pool).
inline constexpr uint32_t kProcessTestBlocks = 200;
inline constexpr uint32_t kProcessTestLayers = 8;
inline v1::PagedKvLayout ProcessTestLayout() {
  return MakeLayout(kProcessTestLayers, 2, 256, 16, 8, 128, v1::DTYPE_BF16,
                    v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
}

// A permutation of [0, n) taken `count` at a time, deterministic in `seed`.
std::vector<uint32_t> ScatteredBlocks(uint32_t n, uint32_t count, uint32_t seed);

}  // namespace kvrail::testing

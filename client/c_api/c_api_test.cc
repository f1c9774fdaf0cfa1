// The C ABI (kvrail.h) against a live kvraild: host regions, transfers, waits, polls, lists,
// errors with their codes and field names, and misuse (NULL and retired handles, bad bytes,
// wrong struct sizes), which must answer with an error and never crash.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "client/c_api/kvrail.h"
#include "proto/kvrail/v1/admin.pb.h"
#include "proto/kvrail/v1/region.pb.h"
#include "proto/kvrail/v1/transfer.pb.h"
#include "tests/harness/daemon_process.h"

namespace kvrail::c_api {
namespace {

using testing::DaemonProcess;
using testing::TempDir;

// A daemon for one test case and a C client connected to it; closes the client, then stops the
// daemon and checks it exits 0. Not thread-safe.
struct Live {
  TempDir dir;
  DaemonProcess daemon;
  kvrail_client* client = nullptr;
  bool stopped = false;  // the test stopped the daemon itself
  std::string lost_message;
  Live() {
    REQUIRE(daemon.Start(dir.path()));
    REQUIRE(kvrail_connect(daemon.socket().c_str(), 0, &client) == KVRAIL_OK);
    REQUIRE(client != nullptr);
  }
  ~Live() {
    kvrail_close(client);
    if (!stopped) CHECK(daemon.Stop(SIGTERM) == 0);
  }
};

std::string LastMessage() { return kvrail_last_error_message(); }

template <typename T>
std::vector<uint8_t> Bytes(const T& message) {
  std::string s = message.SerializeAsString();
  return std::vector<uint8_t>(s.begin(), s.end());
}

template <typename T>
T Take(uint8_t* bytes, size_t len) {
  T message;
  REQUIRE(message.ParseFromArray(bytes, static_cast<int>(len)));
  kvrail_free(bytes);
  return message;
}

// 2 layers, K and V, 8 blocks of 4 tokens, 2 heads of 8 bf16: NHD, so block b of (layer, part) is
// one contiguous chunk of kChunk bytes.
constexpr uint32_t kLayers = 2, kParts = 2, kBlocks = 8, kTpb = 4, kHeads = 2, kHeadDim = 8;
constexpr uint64_t kChunk = uint64_t{kTpb} * kHeads * kHeadDim * 2;

kvrail_paged_layout Layout() {
  kvrail_paged_layout l{};
  l.struct_size = sizeof(l);
  l.num_layers = kLayers;
  l.num_parts = kParts;
  l.num_blocks = kBlocks;
  l.tokens_per_block = kTpb;
  l.num_heads = kHeads;
  l.head_dim = kHeadDim;
  l.dtype = v1::DTYPE_BF16;
  l.order = v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD;
  return l;
}

uint8_t* Chunk(kvrail_host_buffer* buffer, uint32_t layer, uint32_t part, uint32_t block) {
  auto* base = static_cast<uint8_t*>(kvrail_host_buffer_data(buffer));
  return base + ((uint64_t{layer} * kParts + part) * kBlocks + block) * kChunk;
}

// A registered paged pool; the buffer is freed on destruction (the region stays with the client).
struct Pool {
  kvrail_host_buffer* buffer = nullptr;
  uint64_t region = 0;
  Pool(kvrail_client* client, bool writable, uint8_t fill) {
    const kvrail_paged_layout layout = Layout();
    uint64_t bytes = 0;
    REQUIRE(kvrail_paged_layout_bytes(&layout, &bytes) == KVRAIL_OK);
    REQUIRE(bytes == uint64_t{kLayers} * kParts * kBlocks * kChunk);
    REQUIRE(kvrail_host_buffer_create(bytes, "c_api_test", &buffer) == KVRAIL_OK);
    REQUIRE(kvrail_host_buffer_size(buffer) == bytes);
    std::memset(kvrail_host_buffer_data(buffer), fill, bytes);
    INFO(LastMessage());
    REQUIRE(kvrail_register_paged_host(client, buffer, &layout, writable, "pool", &region) ==
            KVRAIL_OK);
    REQUIRE(region != 0);
  }
  ~Pool() { kvrail_host_buffer_free(buffer); }
};

v1::TransferSpec BlockTransfer(uint64_t src, std::vector<uint32_t> src_blocks, uint64_t dst,
                               std::vector<uint32_t> dst_blocks) {
  v1::TransferSpec spec;
  spec.mutable_src()->set_region_id(src);
  for (uint32_t b : src_blocks) spec.mutable_src()->add_block_ids(b);
  spec.mutable_dst()->set_region_id(dst);
  for (uint32_t b : dst_blocks) spec.mutable_dst()->add_block_ids(b);
  return spec;
}

uint64_t Submit(kvrail_client* client, const v1::TransferSpec& spec) {
  const std::vector<uint8_t> bytes = Bytes(spec);
  uint64_t id = 0;
  INFO(LastMessage());
  REQUIRE(kvrail_submit(client, bytes.data(), bytes.size(), &id, nullptr, nullptr) == KVRAIL_OK);
  REQUIRE(id != 0);
  return id;
}

size_t RegionCount(kvrail_client* client) {
  uint8_t* out = nullptr;
  size_t len = 0;
  REQUIRE(kvrail_list_regions(client, &out, &len) == KVRAIL_OK);
  return Take<v1::ListRegionsResponse>(out, len).regions_size();
}

TEST_CASE("the ABI version of the header is the library's") {
  CHECK(kvrail_abi_version() == KVRAIL_ABI_VERSION);
}

TEST_CASE("blocks move between two host regions; wait returns the status bytes and state") {
  Live live;
  Pool src(live.client, /*writable=*/false, 0);
  Pool dst(live.client, /*writable=*/true, 0xAB);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t p = 0; p < kParts; ++p) {
      for (uint32_t b = 0; b < kBlocks; ++b) {
        std::memset(Chunk(src.buffer, l, p, b), 16 * l + 4 * p + b, kChunk);
      }
    }
  }
  const uint64_t id = Submit(live.client, BlockTransfer(src.region, {1, 3}, dst.region, {6, 0}));
  int32_t state = -1;
  uint8_t* status = nullptr;
  size_t status_len = 0;
  REQUIRE(kvrail_wait(live.client, id, 10000, &state, &status, &status_len) == KVRAIL_OK);
  CHECK(state == KVRAIL_STATE_SUCCEEDED);
  const auto parsed = Take<v1::TransferStatus>(status, status_len);
  CHECK(parsed.transfer_id() == id);
  CHECK(parsed.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(parsed.bytes_done() == 2 * kLayers * kParts * kChunk);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t p = 0; p < kParts; ++p) {
      CHECK(std::memcmp(Chunk(dst.buffer, l, p, 6), Chunk(src.buffer, l, p, 1), kChunk) == 0);
      CHECK(std::memcmp(Chunk(dst.buffer, l, p, 0), Chunk(src.buffer, l, p, 3), kChunk) == 0);
      CHECK(Chunk(dst.buffer, l, p, 2)[0] == 0xAB);  // untouched
    }
  }
  // get and a zero-timeout wait read the same final state.
  REQUIRE(kvrail_get(live.client, id, &state, nullptr, nullptr) == KVRAIL_OK);
  CHECK(state == KVRAIL_STATE_SUCCEEDED);
  REQUIRE(kvrail_wait(live.client, id, 0, &state, nullptr, nullptr) == KVRAIL_OK);
  CHECK(state == KVRAIL_STATE_SUCCEEDED);

  uint8_t* out = nullptr;
  size_t len = 0;
  const int32_t succeeded = KVRAIL_STATE_SUCCEEDED;
  REQUIRE(kvrail_list_transfers(live.client, &succeeded, 1, 0, &out, &len) == KVRAIL_OK);
  CHECK(Take<v1::ListTransfersResponse>(out, len).transfers_size() >= 1);
  REQUIRE(kvrail_get_stats(live.client, &out, &len) == KVRAIL_OK);
  kvrail_free(out);
}

// An engine's own memfd, mapped by the engine: registered by fd, the daemon maps the same pages
// (bytes written after registration move; bytes the daemon writes show in the engine's mapping).
TEST_CASE("register_host_fd: an engine's memfd at an offset, shared without a copy") {
  Live live;
  const kvrail_paged_layout layout = Layout();
  uint64_t bytes = 0;
  REQUIRE(kvrail_paged_layout_bytes(&layout, &bytes) == KVRAIL_OK);
  const uint64_t offset = 3 * 4096 + 100;  // not page aligned: the daemon maps around it
  const int fd = ::memfd_create("engine-pool", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(offset + 2 * bytes)) == 0);
  void* mapped = ::mmap(nullptr, offset + 2 * bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(mapped != MAP_FAILED);
  auto* base = static_cast<uint8_t*>(mapped);
  uint8_t* src_mem = base + offset;
  uint8_t* dst_mem = base + offset + bytes;
  std::memset(dst_mem, 0xAB, bytes);

  v1::RegionSpec spec;
  spec.set_name("engine src");
  v1::PagedKvLayout* pl = spec.mutable_paged_kv();
  pl->set_num_layers(kLayers);
  pl->set_num_parts(kParts);
  pl->set_num_blocks(kBlocks);
  pl->set_tokens_per_block(kTpb);
  pl->set_num_heads(kHeads);
  pl->set_head_dim(kHeadDim);
  pl->set_dtype(v1::DTYPE_BF16);
  pl->set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  std::vector<uint8_t> src_spec = Bytes(spec);
  spec.set_name("engine dst");
  spec.set_writable(true);
  std::vector<uint8_t> dst_spec = Bytes(spec);
  uint64_t src = 0, dst = 0;
  uint8_t* info = nullptr;
  size_t info_len = 0;
  INFO(LastMessage());
  REQUIRE(kvrail_register_host_fd(live.client, fd, offset, bytes, src_spec.data(), src_spec.size(),
                                  &src, &info, &info_len) == KVRAIL_OK);
  const auto parsed = Take<v1::RegionInfo>(info, info_len);
  CHECK(parsed.region_id() == src);
  CHECK(parsed.spec().size_bytes() == bytes);
  CHECK(parsed.spec().memory_kind() == v1::MEMORY_KIND_HOST);
  REQUIRE(kvrail_register_host_fd(live.client, fd, offset + bytes, bytes, dst_spec.data(),
                                  dst_spec.size(), &dst, nullptr, nullptr) == KVRAIL_OK);
  // The engine's fd is its own: closing it leaves the regions valid.
  REQUIRE(::close(fd) == 0);

  // Written after registration: what moves is what the engine's mapping holds now.
  for (uint64_t i = 0; i < bytes; ++i) src_mem[i] = static_cast<uint8_t>(i * 7 + 1);
  const uint64_t id = Submit(live.client, BlockTransfer(src, {2, 5}, dst, {0, 7}));
  int32_t state = -1;
  REQUIRE(kvrail_wait(live.client, id, 10000, &state, nullptr, nullptr) == KVRAIL_OK);
  REQUIRE(state == KVRAIL_STATE_SUCCEEDED);
  auto chunk = [&](uint8_t* pool, uint32_t l, uint32_t p, uint32_t b) {
    return pool + ((uint64_t{l} * kParts + p) * kBlocks + b) * kChunk;
  };
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t p = 0; p < kParts; ++p) {
      CHECK(std::memcmp(chunk(dst_mem, l, p, 0), chunk(src_mem, l, p, 2), kChunk) == 0);
      CHECK(std::memcmp(chunk(dst_mem, l, p, 7), chunk(src_mem, l, p, 5), kChunk) == 0);
      CHECK(chunk(dst_mem, l, p, 1)[0] == 0xAB);
    }
  }
  ::munmap(mapped, offset + 2 * bytes);
}

TEST_CASE("register_host_fd: misuse names fd, offset and bytes") {
  Live live;
  uint64_t region = 7;
  CHECK(kvrail_register_host_fd(live.client, -1, 0, 16, nullptr, 0, &region, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().rfind("fd: ", 0) == 0);
  CHECK(region == 0);
  const int fd = ::memfd_create("small", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 4096) == 0);
  CHECK(kvrail_register_host_fd(live.client, fd, 4096, 16, nullptr, 0, &region, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().rfind("offset: ", 0) == 0);
  CHECK(kvrail_register_host_fd(live.client, fd, 4000, 200, nullptr, 0, &region, nullptr,
                                nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().rfind("bytes: ", 0) == 0);
  CHECK(kvrail_register_host_fd(live.client, fd, 0, 0, nullptr, 0, &region, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().rfind("bytes: ", 0) == 0);
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  CHECK(kvrail_register_host_fd(live.client, pipe_fds[0], 0, 16, nullptr, 0, &region, nullptr,
                                nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().find("not a regular file") != std::string::npos);
  CHECK(kvrail_register_host_fd(nullptr, fd, 0, 16, nullptr, 0, &region, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(kvrail_register_host_fd(live.client, fd, 0, 16, nullptr, 0, nullptr, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  ::close(fd);
  CHECK(RegionCount(live.client) == 0);
}

TEST_CASE("the paged layout's dtype is carried: fp16 into bf16 is refused naming the flag") {
  Live live;
  kvrail_paged_layout fp16 = Layout();
  fp16.dtype = v1::DTYPE_FP16;
  uint64_t bytes = 0;
  REQUIRE(kvrail_paged_layout_bytes(&fp16, &bytes) == KVRAIL_OK);
  kvrail_host_buffer* buffer = nullptr;
  REQUIRE(kvrail_host_buffer_create(bytes, "fp16", &buffer) == KVRAIL_OK);
  uint64_t src = 0;
  REQUIRE(kvrail_register_paged_host(live.client, buffer, &fp16, 0, "fp16", &src) == KVRAIL_OK);
  Pool dst(live.client, /*writable=*/true, 0xAB);  // bf16
  v1::TransferSpec spec = BlockTransfer(src, {0}, dst.region, {1});
  std::vector<uint8_t> data = Bytes(spec);
  uint64_t id = 0;
  CHECK(kvrail_submit(live.client, data.data(), data.size(), &id, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().rfind("spec.reinterpret_dtype: ", 0) == 0);
  spec.set_reinterpret_dtype(true);
  id = Submit(live.client, spec);
  int32_t state = 0;
  REQUIRE(kvrail_wait(live.client, id, 10000, &state, nullptr, nullptr) == KVRAIL_OK);
  CHECK(state == KVRAIL_STATE_SUCCEEDED);
  kvrail_host_buffer_free(buffer);
}

TEST_CASE("daemon errors keep their gRPC code and the message naming the field") {
  Live live;
  Pool src(live.client, false, 0);
  Pool dst(live.client, true, 0);
  const std::vector<uint8_t> bad =
      Bytes(BlockTransfer(src.region, {0, 1}, dst.region, {2, kBlocks}));
  uint64_t id = 7;
  CHECK(kvrail_submit(live.client, bad.data(), bad.size(), &id, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(id == 0);
  CHECK(kvrail_last_error_code() == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "spec.dst.block_ids[1]: block 8 out of range [0, 8)");
  // A success clears it.
  CHECK(kvrail_get_stats(live.client, nullptr, nullptr) == KVRAIL_INVALID_ARGUMENT);  // out NULL
  uint8_t* out = nullptr;
  size_t len = 0;
  REQUIRE(kvrail_get_stats(live.client, &out, &len) == KVRAIL_OK);
  kvrail_free(out);
  CHECK(LastMessage().empty());
  CHECK(kvrail_last_error_code() == KVRAIL_OK);

  int32_t state = -1;
  CHECK(kvrail_get(live.client, 999999, &state, nullptr, nullptr) == KVRAIL_NOT_FOUND);
  CHECK(state == KVRAIL_STATE_UNSPECIFIED);
  CHECK(kvrail_unregister_region(live.client, 424242) == KVRAIL_NOT_FOUND);
  const int32_t bogus = 9;
  CHECK(kvrail_list_transfers(live.client, &bogus, 1, 0, &out, &len) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "states[0]: 9 is not a kvrail.v1.TransferState");
}

TEST_CASE("the last error is per thread") {
  kvrail_client* none = nullptr;
  CHECK(kvrail_session_id(none, nullptr) == KVRAIL_INVALID_ARGUMENT);
  const std::string here = LastMessage();
  std::string there;
  std::thread([&] {
    uint64_t bytes = 0;
    kvrail_paged_layout layout = Layout();
    CHECK(kvrail_paged_layout_bytes(&layout, &bytes) == KVRAIL_OK);
    there = LastMessage();
  }).join();
  CHECK(there.empty());
  CHECK(LastMessage() == here);
  CHECK(here == "out: NULL out-parameter");
}

TEST_CASE("poll: many states in one call; an unknown id is named by its index") {
  Live live;
  Pool src(live.client, false, 1);
  Pool dst(live.client, true, 0);
  std::vector<uint64_t> ids;
  for (uint32_t b = 0; b < 4; ++b) {
    ids.push_back(Submit(live.client, BlockTransfer(src.region, {b}, dst.region, {b})));
  }
  for (uint64_t id : ids) REQUIRE(kvrail_wait(live.client, id, -1, nullptr, nullptr, nullptr) == 0);
  ids.insert(ids.begin() + 2, 888888);  // unknown
  std::vector<int32_t> states(ids.size(), -1), codes(ids.size(), -1);
  CHECK(kvrail_poll(live.client, ids.data(), ids.size(), states.data(), codes.data()) ==
        KVRAIL_NOT_FOUND);
  CHECK(LastMessage().rfind("ids[2]: ", 0) == 0);
  CHECK(states == std::vector<int32_t>{3, 3, 0, 3, 3});
  CHECK(codes == std::vector<int32_t>{0, 0, KVRAIL_NOT_FOUND, 0, 0});
  ids.erase(ids.begin() + 2);
  states.resize(ids.size());
  CHECK(kvrail_poll(live.client, ids.data(), ids.size(), states.data(), nullptr) == KVRAIL_OK);
  CHECK(kvrail_poll(live.client, nullptr, 0, nullptr, nullptr) == KVRAIL_OK);
  CHECK(kvrail_poll(live.client, nullptr, 3, states.data(), nullptr) == KVRAIL_INVALID_ARGUMENT);
}

TEST_CASE("submit_batch: K, V and aux in one call; each answered on its own, named by index") {
  Live live;
  Pool src(live.client, false, 0);
  Pool dst(live.client, true, 0);
  for (uint32_t b = 0; b < kBlocks; ++b) {
    std::memset(Chunk(src.buffer, 0, 0, b), 0x40 + b, kChunk);
  }
  std::vector<std::vector<uint8_t>> bytes;
  for (uint32_t b = 0; b < 3; ++b) {
    bytes.push_back(Bytes(BlockTransfer(src.region, {b}, dst.region, {b + 4})));
  }
  bytes.push_back(Bytes(BlockTransfer(src.region, {0}, 777777, {0})));  // an unknown region
  bytes.push_back(Bytes(BlockTransfer(src.region, {3}, dst.region, {7})));
  std::vector<const uint8_t*> specs;
  std::vector<size_t> lens;
  for (const auto& b : bytes) {
    specs.push_back(b.data());
    lens.push_back(b.size());
  }
  std::vector<uint64_t> ids(specs.size(), 1);
  std::vector<int32_t> codes(specs.size(), -1);
  CHECK(kvrail_submit_batch(live.client, specs.data(), lens.data(), specs.size(), ids.data(),
                            codes.data()) == KVRAIL_NOT_FOUND);
  CHECK(LastMessage().rfind("specs[3]: spec.dst.region_id", 0) == 0);
  CHECK(codes == std::vector<int32_t>{0, 0, 0, KVRAIL_NOT_FOUND, 0});
  CHECK(ids[3] == 0);
  for (size_t i : {0, 1, 2, 4}) {
    REQUIRE(ids[i] != 0);
    int32_t state = -1;
    REQUIRE(kvrail_wait(live.client, ids[i], 10000, &state, nullptr, nullptr) == KVRAIL_OK);
    CHECK(state == KVRAIL_STATE_SUCCEEDED);
  }
  for (uint32_t b = 0; b < 3; ++b) {
    CHECK(std::memcmp(Chunk(dst.buffer, 0, 0, b + 4), Chunk(src.buffer, 0, 0, b), kChunk) == 0);
  }
  CHECK(std::memcmp(Chunk(dst.buffer, 0, 0, 7), Chunk(src.buffer, 0, 0, 3), kChunk) == 0);
  // A malformed spec submits nothing; misuse is named.
  const uint8_t junk[] = {0xff, 0xff, 0xff};
  specs[1] = junk;
  lens[1] = sizeof(junk);
  CHECK(kvrail_submit_batch(live.client, specs.data(), lens.data(), specs.size(), ids.data(),
                            nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().rfind("specs[1]: ", 0) == 0);
  CHECK(ids[0] == 0);
  CHECK(kvrail_submit_batch(live.client, nullptr, lens.data(), 2, ids.data(), nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(kvrail_submit_batch(live.client, nullptr, nullptr, 0, nullptr, nullptr) == KVRAIL_OK);
}

TEST_CASE("layer-wise: a bounded wait returns a non-final status; mark_ready lets it finish") {
  Live live;
  Pool src(live.client, false, 5);
  Pool dst(live.client, true, 0);
  v1::TransferSpec spec = BlockTransfer(src.region, {0}, dst.region, {1});
  spec.set_layerwise(true);
  const uint64_t id = Submit(live.client, spec);
  int32_t state = -1;
  REQUIRE(kvrail_wait(live.client, id, 50, &state, nullptr, nullptr) == KVRAIL_OK);
  CHECK((state == KVRAIL_STATE_QUEUED || state == KVRAIL_STATE_RUNNING));
  REQUIRE(kvrail_mark_ready(live.client, id, 0, kLayers) == KVRAIL_OK);
  REQUIRE(kvrail_wait(live.client, id, -1, &state, nullptr, nullptr) == KVRAIL_OK);
  CHECK(state == KVRAIL_STATE_SUCCEEDED);

  const uint64_t waiting = Submit(live.client, spec);
  REQUIRE(kvrail_cancel(live.client, waiting, &state, nullptr, nullptr) == KVRAIL_OK);
  REQUIRE(kvrail_wait(live.client, waiting, -1, &state, nullptr, nullptr) == KVRAIL_OK);
  CHECK(state == KVRAIL_STATE_CANCELLED);
}

TEST_CASE("closing a client releases its regions; calls after close fail cleanly") {
  Live live;
  const size_t before = RegionCount(live.client);
  kvrail_client* other = nullptr;
  REQUIRE(kvrail_connect(live.daemon.socket().c_str(), 0, &other) == KVRAIL_OK);
  {
    Pool pool(other, true, 0);
    uint64_t session = 0;
    REQUIRE(kvrail_session_id(other, &session) == KVRAIL_OK);
    CHECK(session != 0);
  }
  CHECK(RegionCount(live.client) == before + 1);
  kvrail_close(other);
  kvrail_close(other);  // a second close: a no-op
  kvrail_close(nullptr);
  size_t count = before + 1;
  for (int i = 0; i < 500 && count != before; ++i) {  // the daemon sees the session end
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    count = RegionCount(live.client);
  }
  CHECK(count == before);
  uint64_t session = 5;
  CHECK(kvrail_session_id(other, &session) == KVRAIL_INVALID_ARGUMENT);
  CHECK(session == 0);
  CHECK(LastMessage() == "client: not a live kvrail_client handle (closed, or never issued)");
  int32_t state = 0;
  CHECK(kvrail_wait(other, 1, -1, &state, nullptr, nullptr) == KVRAIL_INVALID_ARGUMENT);
  // A call with nothing to do checks the handle all the same.
  CHECK(kvrail_poll(other, nullptr, 0, nullptr, nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "client: not a live kvrail_client handle (closed, or never issued)");
}

TEST_CASE("misuse answers with INVALID_ARGUMENT naming the argument, never a crash") {
  Live live;
  kvrail_host_buffer* buffer = nullptr;
  CHECK(kvrail_host_buffer_create(0, nullptr, &buffer) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "bytes: must be > 0");
  CHECK(kvrail_host_buffer_create(1024, nullptr, nullptr) == KVRAIL_INVALID_ARGUMENT);
  REQUIRE(kvrail_host_buffer_create(1024, nullptr, &buffer) == KVRAIL_OK);  // < the layout's 4096

  uint64_t region = 0;
  CHECK(kvrail_register_host_buffer(nullptr, buffer, nullptr, 0, &region, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "client: NULL");
  // A buffer handle is not a client handle.
  CHECK(kvrail_register_host_buffer(reinterpret_cast<kvrail_client*>(buffer), buffer, nullptr, 0,
                                    &region, nullptr, nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(kvrail_register_host_buffer(live.client, nullptr, nullptr, 0, &region, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "buffer: NULL");
  uint8_t* info = nullptr;
  CHECK(kvrail_register_host_buffer(live.client, buffer, nullptr, 0, &region, &info, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "info_len: NULL while info is set");

  // Bad bytes: not a message of the expected type.
  const uint8_t garbage[] = {0xFF, 0xFF, 0xFF, 0xFF};
  CHECK(kvrail_register_host_buffer(live.client, buffer, garbage, sizeof(garbage), &region, nullptr,
                                    nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "spec: 4 bytes are not a serialized kvrail.v1.RegionSpec");
  uint64_t id = 0;
  CHECK(kvrail_submit(live.client, garbage, sizeof(garbage), &id, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "spec: 4 bytes are not a serialized kvrail.v1.TransferSpec");
  CHECK(kvrail_submit(live.client, nullptr, 12, &id, nullptr, nullptr) == KVRAIL_INVALID_ARGUMENT);

  // Layouts: the struct size is checked; values are the validator's (layout/paged_layout.h).
  kvrail_paged_layout layout = Layout();
  layout.struct_size = 40;
  CHECK(kvrail_register_paged_host(live.client, buffer, &layout, 1, nullptr, &region) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().rfind("layout.struct_size: 40, this library", 0) == 0);
  layout = Layout();
  layout.dtype = 99;
  uint64_t bytes = 0;
  CHECK(kvrail_paged_layout_bytes(&layout, &bytes) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "layout.dtype: unknown or unspecified dtype 99");
  CHECK(kvrail_paged_layout_check(&layout, 0, 0, &bytes) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "layout.dtype: unknown or unspecified dtype 99");
  layout = Layout();
  CHECK(kvrail_paged_layout_check(&layout, 0, 4, &bytes) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "flags: unknown bits 4");
  CHECK(kvrail_paged_layout_check(&layout, 0, KVRAIL_LAYOUT_PER_LAYER, nullptr) == KVRAIL_OK);
  layout.dtype = 99;
  CHECK(kvrail_paged_layout_bytes(nullptr, &bytes) == KVRAIL_INVALID_ARGUMENT);
  // Too small a buffer for the layout: the daemon's answer.
  layout = Layout();
  CHECK(kvrail_register_paged_host(live.client, buffer, &layout, 1, nullptr, &region) ==
        KVRAIL_INVALID_ARGUMENT);
  INFO(LastMessage());
  CHECK(LastMessage().find("1024") != std::string::npos);

  // A host pointer is not device memory (with or without a GPU).
  CHECK(kvrail_register_cuda(live.client, kvrail_host_buffer_data(buffer), 1024, nullptr, 0,
                             &region, nullptr, nullptr) != KVRAIL_OK);
  CHECK(kvrail_register_cuda(live.client, nullptr, 1024, nullptr, 0, &region, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);

  // Free: NULL and a second free are no-ops; a freed handle reads as NULL / 0.
  kvrail_host_buffer_free(buffer);
  kvrail_host_buffer_free(buffer);
  kvrail_host_buffer_free(nullptr);
  CHECK(kvrail_host_buffer_data(buffer) == nullptr);
  CHECK(kvrail_host_buffer_size(buffer) == 0);
  CHECK(LastMessage() == "buffer: not a live kvrail_host_buffer handle (freed, or never issued)");
  CHECK(kvrail_register_host_buffer(live.client, buffer, nullptr, 0, &region, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
}

TEST_CASE("this wave's entry points: misuse is named, a stopped daemon is session lost") {
  Live live;
  uint8_t* out = nullptr;
  size_t out_len = 0;
  // Notifications.
  CHECK(kvrail_poll_notifications(nullptr, 0, 0, &out, &out_len) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "client: NULL");
  CHECK(kvrail_poll_notifications(live.client, 0, 60001, &out, &out_len) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "timeout_ms: 60001 is outside [0, 60000]");
  CHECK(kvrail_poll_notifications(live.client, 0, -1, &out, &out_len) == KVRAIL_INVALID_ARGUMENT);
  REQUIRE(kvrail_poll_notifications(live.client, 0, 1, &out, &out_len) == KVRAIL_OK);
  v1::NotificationPollResponse none;
  REQUIRE(none.ParseFromArray(out, static_cast<int>(out_len)));
  CHECK(none.notifications_size() == 0);
  kvrail_free(out);
  out = nullptr;
  // Filtered lists: bad bytes are named.
  const uint8_t garbage[] = {0xFF, 0xFF, 0xFF, 0xFF};
  CHECK(kvrail_list_transfers_filtered(live.client, garbage, sizeof(garbage), &out, &out_len) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "request: 4 bytes are not a serialized kvrail.v1.ListTransfersRequest");
  REQUIRE(kvrail_list_transfers_filtered(live.client, nullptr, 0, &out, &out_len) == KVRAIL_OK);
  kvrail_free(out);
  // Per-layer registration: NULL arrays, freed buffers, NULL layer pointers.
  uint64_t region = 0;
  CHECK(kvrail_register_host_layers(live.client, nullptr, nullptr, 2, nullptr, 0, &region, nullptr,
                                    nullptr) == KVRAIL_INVALID_ARGUMENT);
  kvrail_host_buffer* buffer = nullptr;
  REQUIRE(kvrail_host_buffer_create(4096, nullptr, &buffer) == KVRAIL_OK);
  kvrail_host_buffer* layers[2] = {buffer, buffer};
  kvrail_host_buffer_free(buffer);
  CHECK(kvrail_register_host_layers(live.client, layers, nullptr, 2, nullptr, 0, &region, nullptr,
                                    nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().rfind("buffers[0]: ", 0) == 0);
  const void* ptrs[2] = {garbage, nullptr};
  CHECK(kvrail_register_cuda_layers(live.client, ptrs, 2, 4, nullptr, 0, &region, nullptr,
                                    nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "layer_ptrs[1]: NULL");
  // Block ids as arrays: NULL with a count is named.
  uint64_t id = 0;
  CHECK(kvrail_submit_blocks(live.client, nullptr, 0, nullptr, 3, nullptr, 0, &id, nullptr,
                             nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "src_ids: NULL with src_count > 0");
  CHECK(kvrail_submit_blocks(live.client, garbage, sizeof(garbage), nullptr, 0, nullptr, 0, &id,
                             nullptr, nullptr) == KVRAIL_INVALID_ARGUMENT);
  // Session lost: not lost while the daemon runs; NULL out-parameter named.
  int lost = -1;
  CHECK(kvrail_session_lost(live.client, nullptr) == KVRAIL_INVALID_ARGUMENT);
  REQUIRE(kvrail_session_lost(live.client, &lost) == KVRAIL_OK);
  CHECK(lost == 0);
  CHECK(kvrail_on_session_lost(nullptr, nullptr, nullptr) == KVRAIL_INVALID_ARGUMENT);
  static std::atomic<int> calls{0};
  static std::atomic<int> code{0};
  calls = 0;
  REQUIRE(kvrail_on_session_lost(
              live.client,
              [](void* user, int c, const char* message) {
                code = c;
                calls.fetch_add(1);
                *static_cast<std::string*>(user) = message;
              },
              &live.lost_message) == KVRAIL_OK);
  uint64_t session = 0;
  REQUIRE(kvrail_session_id(live.client, &session) == KVRAIL_OK);  // opens the session
  CHECK(live.daemon.Stop(SIGTERM) == 0);
  for (int i = 0; i < 500 && calls.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(calls.load() == 1);
  CHECK(code.load() == KVRAIL_FAILED_PRECONDITION);
  CHECK(live.lost_message.rfind("session lost: ", 0) == 0);
  REQUIRE(kvrail_session_lost(live.client, &lost) == KVRAIL_OK);
  CHECK(lost == 1);
  CHECK(kvrail_session_id(live.client, &session) == KVRAIL_FAILED_PRECONDITION);
  CHECK(LastMessage().rfind("session lost: ", 0) == 0);
  // The daemon is gone: a reset cannot adopt a new instance.
  CHECK(kvrail_reset_session(live.client) == KVRAIL_UNAVAILABLE);
  REQUIRE(kvrail_on_session_lost(live.client, nullptr, nullptr) == KVRAIL_OK);
  CHECK(calls.load() == 1);  // once per loss
  live.stopped = true;
}

TEST_CASE("the fixed-size hot path: submit and end in structs, ends taken many at once") {
  Live live;
  Pool src(live.client, /*writable=*/false, 7);
  Pool dst(live.client, /*writable=*/true, 0);
  v1::TransferSpec shape;
  shape.mutable_src()->set_region_id(src.region);
  shape.mutable_dst()->set_region_id(dst.region);
  const std::vector<uint8_t> spec = Bytes(shape);
  const uint32_t src_ids[1] = {2}, dst_ids[1] = {5};

  // Misuse is named: NULL and unknown-size structs, NULL ids, a closed or NULL client.
  kvrail_submitted submitted{};
  CHECK(kvrail_submit_blocks_short(live.client, spec.data(), spec.size(), src_ids, 1, dst_ids, 1,
                                   nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "submitted: NULL out-parameter");
  submitted.struct_size = 8;
  CHECK(kvrail_submit_blocks_short(live.client, spec.data(), spec.size(), src_ids, 1, dst_ids, 1,
                                   &submitted) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().rfind("submitted.struct_size: 8, this library", 0) == 0);
  submitted.struct_size = sizeof(submitted);
  CHECK(kvrail_submit_blocks_short(nullptr, spec.data(), spec.size(), src_ids, 1, dst_ids, 1,
                                   &submitted) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "client: NULL");
  CHECK(kvrail_submit_blocks_short(live.client, spec.data(), spec.size(), nullptr, 1, dst_ids, 1,
                                   &submitted) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "src_ids: NULL with src_count > 0");
  const uint8_t garbage[] = {0xFF, 0xFF, 0xFF, 0xFF};
  CHECK(kvrail_submit_blocks_short(live.client, garbage, sizeof(garbage), src_ids, 1, dst_ids, 1,
                                   &submitted) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "spec: 4 bytes are not a serialized kvrail.v1.TransferSpec");
  CHECK(submitted.transfer_id == 0);
  kvrail_transfer_end end{};
  CHECK(kvrail_wait_end_short(live.client, 1, 0, nullptr, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "end: NULL out-parameter");
  CHECK(kvrail_wait_end_short(live.client, 1, 0, &end, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().rfind("end.struct_size: 0, this library", 0) == 0);
  end.struct_size = sizeof(end);
  uint8_t* status = nullptr;
  CHECK(kvrail_wait_end_short(live.client, 1, 0, &end, &status, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "status_len: NULL while status is set");
  size_t count = 7;
  kvrail_transfer_end ends[4] = {};
  CHECK(kvrail_take_ends(live.client, ends, 4, nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "count: NULL out-parameter");
  CHECK(kvrail_take_ends(live.client, nullptr, 4, &count) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "ends: NULL with max > 0");
  CHECK(count == 0);
  CHECK(kvrail_take_ends(live.client, ends, 4, &count) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().rfind("ends[0].struct_size: 0, this library", 0) == 0);
  ends[0].struct_size = sizeof(kvrail_transfer_end);
  CHECK(kvrail_take_ends(nullptr, ends, 4, &count) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "client: NULL");

  // A submit answered in the struct, its end read in the struct (no status bytes: nothing more).
  REQUIRE(kvrail_submit_blocks_short(live.client, spec.data(), spec.size(), src_ids, 1, dst_ids, 1,
                                     &submitted) == KVRAIL_OK);
  CHECK(submitted.transfer_id != 0);
  CHECK(submitted.bytes_total == kLayers * kParts * kChunk);
  CHECK(submitted.tiles_total >= 1);
  CHECK(submitted.deduplicated == 0);
  CHECK(submitted.followed == 1);
  size_t status_len = 0;
  REQUIRE(kvrail_wait_end_short(live.client, submitted.transfer_id, -1, &end, &status,
                                &status_len) == KVRAIL_OK);
  CHECK(end.transfer_id == submitted.transfer_id);
  CHECK(end.state == KVRAIL_STATE_SUCCEEDED);
  CHECK(end.flags == 0);
  CHECK(end.bytes_done == submitted.bytes_total);
  CHECK(end.finished_unix_us > 0);
  CHECK(status == nullptr);
  CHECK(std::memcmp(Chunk(dst.buffer, 1, 1, 5), Chunk(src.buffer, 1, 1, 2), kChunk) == 0);
  // An unknown transfer is the daemon's answer, named.
  CHECK(kvrail_wait_end_short(live.client, 987654321, 0, &end, nullptr, nullptr) ==
        KVRAIL_NOT_FOUND);

  // Armed: three ends taken in one call, with their states and counts; then none.
  REQUIRE(kvrail_arm_completions(live.client, 1) == KVRAIL_OK);
  std::vector<uint64_t> ids;
  for (uint32_t b = 0; b < 3; ++b) {
    const uint32_t s[1] = {b}, d[1] = {b + 4};
    REQUIRE(kvrail_submit_blocks_short(live.client, spec.data(), spec.size(), s, 1, d, 1,
                                       &submitted) == KVRAIL_OK);
    ids.push_back(submitted.transfer_id);
  }
  for (uint64_t id : ids) {
    REQUIRE(kvrail_wait_end_short(live.client, id, -1, &end, nullptr, nullptr) == KVRAIL_OK);
  }
  std::vector<uint64_t> taken;
  for (int tries = 0; tries < 100 && taken.size() < ids.size(); ++tries) {
    REQUIRE(kvrail_take_ends(live.client, ends, 2, &count) == KVRAIL_OK);  // 2: call again
    for (size_t i = 0; i < count; ++i) {
      CHECK(ends[i].struct_size == sizeof(kvrail_transfer_end));
      CHECK(ends[i].state == KVRAIL_STATE_SUCCEEDED);
      CHECK(ends[i].flags == 0);
      CHECK(ends[i].bytes_done == kLayers * kParts * kChunk);
      CHECK(ends[i].finished_unix_us > 0);
      taken.push_back(ends[i].transfer_id);
    }
  }
  std::sort(taken.begin(), taken.end());  // in the order they ended
  CHECK(taken == ids);
  REQUIRE(kvrail_take_ends(live.client, ends, 4, &count) == KVRAIL_OK);
  CHECK(count == 0);
  // `max` is the caller's array, never a size to allocate: a huge one with nothing pending takes
  // nothing (it once threw out of an allocation of max ids).
  REQUIRE(kvrail_take_ends(live.client, ends, SIZE_MAX / sizeof(kvrail_transfer_end), &count) ==
          KVRAIL_OK);
  CHECK(count == 0);
  REQUIRE(kvrail_arm_completions(live.client, 0) == KVRAIL_OK);
  // A closed client answers misuse, never a crash.
  kvrail_close(live.client);
  CHECK(kvrail_take_ends(live.client, ends, 4, &count) == KVRAIL_INVALID_ARGUMENT);
  CHECK(kvrail_submit_blocks_short(live.client, spec.data(), spec.size(), src_ids, 1, dst_ids, 1,
                                   &submitted) == KVRAIL_INVALID_ARGUMENT);
  live.client = nullptr;
}

TEST_CASE("a kept spec submitted with new ids; an end's status in the caller's struct") {
  Live live;
  Pool src(live.client, /*writable=*/false, 0);
  Pool dst(live.client, /*writable=*/true, 0xAB);
  for (uint32_t b = 0; b < kBlocks; ++b) std::memset(Chunk(src.buffer, 1, 1, b), b + 1, kChunk);
  v1::TransferSpec shape;
  shape.mutable_src()->set_region_id(src.region);
  shape.mutable_dst()->set_region_id(dst.region);
  const std::vector<uint8_t> spec = Bytes(shape);

  // Misuse is named: NULL out, a spec that does not parse, NULL or unknown-size structs, NULL ids.
  kvrail_spec* kept = nullptr;
  CHECK(kvrail_spec_create(live.client, spec.data(), spec.size(), nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "out: NULL out-parameter");
  const uint8_t garbage[] = {0xFF, 0xFF, 0xFF, 0xFF};
  CHECK(kvrail_spec_create(live.client, garbage, sizeof(garbage), &kept) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "spec: 4 bytes are not a serialized kvrail.v1.TransferSpec");
  CHECK(kvrail_spec_create(nullptr, spec.data(), spec.size(), &kept) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "client: NULL");
  CHECK(kept == nullptr);
  REQUIRE(kvrail_spec_create(live.client, spec.data(), spec.size(), &kept) == KVRAIL_OK);
  REQUIRE(kept != nullptr);
  const uint32_t ids[2] = {3, 6};  // source block 3 into destination block 6
  kvrail_spec_submit submit{};
  submit.src_count = 1;
  submit.dst_count = 1;
  submit.ids = ids;
  CHECK(kvrail_submit_spec(nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "submit: NULL out-parameter");
  CHECK(kvrail_submit_spec(&submit) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().rfind("submit.struct_size: 0, this library", 0) == 0);
  submit.struct_size = sizeof(submit);
  CHECK(kvrail_submit_spec(&submit) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "spec: NULL");
  submit.spec = kept;
  submit.ids = nullptr;
  CHECK(kvrail_submit_spec(&submit) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "ids: NULL with src_count + dst_count > 0");
  // A bad id is the daemon's answer, naming it, as for any submit.
  const uint32_t bad[2] = {3, kBlocks};
  submit.ids = bad;
  CHECK(kvrail_submit_spec(&submit) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().find("block_ids[0]") != std::string::npos);
  CHECK(submit.submitted.transfer_id == 0);
  kvrail_end_wait wait{};
  wait.client = live.client;
  wait.transfer_id = 1;
  CHECK(kvrail_wait_end_into(nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "wait: NULL out-parameter");
  CHECK(kvrail_wait_end_into(&wait) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().rfind("wait.struct_size: 0, this library", 0) == 0);
  wait.struct_size = sizeof(wait);
  wait.client = nullptr;
  CHECK(kvrail_wait_end_into(&wait) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "client: NULL");
  wait.client = live.client;
  wait.timeout_ms = -1;

  // Submitted from the kept spec (its ids each time), the end read into the struct: the same
  // status kvrail_wait_end has, no allocation; the bytes landed where the ids say.
  for (uint32_t b = 0; b < 3; ++b) {
    const uint32_t pair[2] = {b, b + 4};
    submit.ids = pair;
    REQUIRE(kvrail_submit_spec(&submit) == KVRAIL_OK);
    CHECK(submit.submitted.struct_size == sizeof(kvrail_submitted));
    CHECK(submit.submitted.transfer_id != 0);
    CHECK(submit.submitted.bytes_total == kLayers * kParts * kChunk);
    CHECK(submit.submitted.followed == 1);
    // A host transfer this small runs inline, so its end came before the submit's answer:
    // `end` holds it, as kvrail_wait_end_into below reads it.
    CHECK(submit.end.struct_size == sizeof(kvrail_transfer_end));
    CHECK(submit.end.state == v1::TRANSFER_STATE_SUCCEEDED);
    CHECK(submit.end.transfer_id == submit.submitted.transfer_id);
    CHECK(submit.end.flags == 0);
    CHECK(submit.end.bytes_done == submit.submitted.bytes_total);
    CHECK(submit.end.finished_unix_us > 0);
    v1::TransferStatus carried;
    REQUIRE(carried.ParseFromArray(submit.end_status, static_cast<int>(submit.end_len)));
    CHECK(carried.transfer_id() == submit.end.transfer_id);
    CHECK(carried.state() == v1::TRANSFER_STATE_SUCCEEDED);
    wait.transfer_id = submit.submitted.transfer_id;
    REQUIRE(kvrail_wait_end_into(&wait) == KVRAIL_OK);
    CHECK(wait.heap == nullptr);
    REQUIRE(wait.len > 0);
    REQUIRE(wait.len <= KVRAIL_STATUS_INLINE);
    v1::TransferStatus status;
    REQUIRE(status.ParseFromArray(wait.data, static_cast<int>(wait.len)));
    CHECK(status.transfer_id() == wait.transfer_id);
    CHECK(status.state() == v1::TRANSFER_STATE_SUCCEEDED);
    CHECK(status.bytes_done() == submit.submitted.bytes_total);
    int32_t state = 0;
    uint8_t* bytes = nullptr;
    size_t len = 0;
    REQUIRE(kvrail_wait_end(live.client, wait.transfer_id, -1, &state, &bytes, &len) == KVRAIL_OK);
    CHECK(Take<v1::TransferStatus>(bytes, len).SerializeAsString() == status.SerializeAsString());
    CHECK(std::memcmp(Chunk(dst.buffer, 1, 1, b + 4), Chunk(src.buffer, 1, 1, b), kChunk) == 0);
    CHECK(status.finished_unix_us() == submit.end.finished_unix_us);
    CHECK(carried.SerializeAsString() == status.SerializeAsString());
  }
  // A caller built before `end` existed: its size without it is accepted, and the library
  // writes nothing past it.
  {
    kvrail_spec_submit older = submit;
    constexpr size_t kTail = sizeof(kvrail_spec_submit) - offsetof(kvrail_spec_submit, end);
    std::memset(&older.end, 0xAB, kTail);
    older.struct_size = offsetof(kvrail_spec_submit, end);
    const uint32_t pair[2] = {7, 0};
    older.ids = pair;
    REQUIRE(kvrail_submit_spec(&older) == KVRAIL_OK);
    CHECK(older.submitted.transfer_id != 0);
    const auto* tail = reinterpret_cast<const uint8_t*>(&older.end);
    CHECK(std::all_of(tail, tail + kTail, [](uint8_t b) { return b == 0xAB; }));
    older.struct_size = offsetof(kvrail_spec_submit, end) + 4;
    CHECK(kvrail_submit_spec(&older) == KVRAIL_INVALID_ARGUMENT);
    CHECK(LastMessage().rfind("submit.struct_size: ", 0) == 0);
  }
  // A status longer than the struct's data (the daemon's, with the spec and its long label)
  // comes in heap, whole.
  v1::TransferSpec labelled = shape;
  labelled.set_label(std::string(300, 'L'));
  labelled.set_digest(true);
  const std::vector<uint8_t> long_spec = Bytes(labelled);
  kvrail_spec* long_kept = nullptr;
  REQUIRE(kvrail_spec_create(live.client, long_spec.data(), long_spec.size(), &long_kept) ==
          KVRAIL_OK);
  submit.spec = long_kept;
  submit.ids = ids;
  REQUIRE(kvrail_submit_spec(&submit) == KVRAIL_OK);
  wait.transfer_id = submit.submitted.transfer_id;
  REQUIRE(kvrail_wait_end_into(&wait) == KVRAIL_OK);
  REQUIRE(wait.heap != nullptr);
  REQUIRE(wait.len > KVRAIL_STATUS_INLINE);
  const auto long_status = Take<v1::TransferStatus>(wait.heap, wait.len);
  CHECK(long_status.state() == v1::TRANSFER_STATE_SUCCEEDED);
  CHECK(long_status.spec().label() == labelled.label());
  // An unknown transfer is the daemon's answer, the struct's answer left empty.
  wait.transfer_id = 987654321;
  wait.timeout_ms = 0;
  CHECK(kvrail_wait_end_into(&wait) == KVRAIL_NOT_FOUND);
  CHECK(wait.len == 0);
  CHECK(wait.heap == nullptr);

  // Freed: named on every later use; NULL frees nothing. A spec whose client was closed is named.
  REQUIRE(kvrail_spec_free(long_kept) == KVRAIL_OK);
  CHECK(kvrail_spec_free(long_kept) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "spec: not a live kvrail_spec handle (freed, or never issued)");
  CHECK(kvrail_submit_spec(&submit) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "spec: not a live kvrail_spec handle (freed, or never issued)");
  CHECK(kvrail_spec_free(nullptr) == KVRAIL_OK);
  kvrail_close(live.client);
  live.client = nullptr;
  submit.spec = kept;
  CHECK(kvrail_submit_spec(&submit) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "spec: its client was closed");
  CHECK(kvrail_spec_free(kept) == KVRAIL_OK);
}

TEST_CASE("prepared: posted many times with new ids; misuse and bad ids named; released") {
  Live live;
  Pool src(live.client, /*writable=*/false, 0);
  Pool dst(live.client, /*writable=*/true, 0xAB);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t p = 0; p < kParts; ++p) {
      for (uint32_t b = 0; b < kBlocks; ++b) {
        std::memset(Chunk(src.buffer, l, p, b), 16 * l + 4 * p + b + 1, kChunk);
      }
    }
  }
  const std::vector<uint8_t> shape = Bytes(BlockTransfer(src.region, {}, dst.region, {}));
  kvrail_prepared* prepared = nullptr;
  uint8_t* out = nullptr;
  size_t len = 0;
  INFO(LastMessage());
  REQUIRE(kvrail_prepare(live.client, shape.data(), shape.size(), 1, 0, &prepared, &out, &len) ==
          KVRAIL_OK);
  REQUIRE(prepared != nullptr);
  const auto info = Take<v1::PrepareTransferResponse>(out, len);
  CHECK(info.src_block_count() == 1);
  CHECK(info.dst_block_count() == 1);
  CHECK(info.bytes_total() == kLayers * kParts * kChunk);
  // Three posts, new ids each time; block 2 stays untouched.
  const uint32_t moves[][2] = {{5, 0}, {7, 3}, {0, 6}};
  for (const auto& m : moves) {
    uint64_t id = 0;
    REQUIRE(kvrail_post(prepared, &m[0], 1, &m[1], 1, &id, nullptr, nullptr) == KVRAIL_OK);
    int32_t state = 0;
    REQUIRE(kvrail_wait(live.client, id, 10000, &state, nullptr, nullptr) == KVRAIL_OK);
    CHECK(state == KVRAIL_STATE_SUCCEEDED);
  }
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t p = 0; p < kParts; ++p) {
      for (const auto& m : moves) {
        CHECK(std::memcmp(Chunk(dst.buffer, l, p, m[1]), Chunk(src.buffer, l, p, m[0]), kChunk) ==
              0);
      }
      CHECK(Chunk(dst.buffer, l, p, 2)[0] == 0xAB);
    }
  }
  // A bad id is the daemon's error naming it; misuse names the argument.
  const uint32_t big = kBlocks, one = 1;
  uint64_t id = 7;
  CHECK(kvrail_post(prepared, &big, 1, &one, 1, &id, nullptr, nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "post.src_block_ids[0]: block 8 out of range [0, 8)");
  CHECK(id == 0);
  const uint32_t two[2] = {1, 1};  // a count the array really holds (the ABI reads them all)
  CHECK(kvrail_post(prepared, &one, 1, two, 2, &id, nullptr, nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "post.dst_block_ids: 2 ids, the prepared transfer takes 1");
  CHECK(kvrail_post(prepared, nullptr, 1, &one, 1, &id, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "src_ids: NULL with src_count > 0");
  CHECK(kvrail_post(prepared, &one, 1, &one, 1, nullptr, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "transfer_id: NULL out-parameter");
  CHECK(kvrail_post(nullptr, &one, 1, &one, 1, &id, nullptr, nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "prepared: NULL");
  CHECK(kvrail_prepare(live.client, shape.data(), shape.size(), 1, 0, nullptr, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "prepared: NULL out-parameter");
  kvrail_prepared* again = nullptr;
  CHECK(kvrail_prepare(nullptr, shape.data(), shape.size(), 1, 0, &again, nullptr, nullptr) ==
        KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage() == "client: NULL");
  // Released: the handle is retired (a second release and a post name it), nothing crashes.
  CHECK(kvrail_prepared_release(prepared) == KVRAIL_OK);
  CHECK(kvrail_prepared_release(prepared) == KVRAIL_INVALID_ARGUMENT);
  CHECK(LastMessage().rfind("prepared: not a live kvrail_prepared handle", 0) == 0);
  CHECK(kvrail_post(prepared, &one, 1, &one, 1, &id, nullptr, nullptr) == KVRAIL_INVALID_ARGUMENT);
  CHECK(kvrail_prepared_release(nullptr) == KVRAIL_OK);
}

TEST_CASE("connecting to a socket nobody serves is UNAVAILABLE naming it") {
  TempDir dir;
  const std::string socket = dir.path() + "/nobody.sock";
  kvrail_client* client = reinterpret_cast<kvrail_client*>(1);
  CHECK(kvrail_connect(socket.c_str(), 200, &client) == KVRAIL_UNAVAILABLE);
  CHECK(client == nullptr);
  CHECK(LastMessage().find(socket) != std::string::npos);
}

}  // namespace
}  // namespace kvrail::c_api

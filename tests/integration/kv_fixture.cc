#include "tests/integration/kv_fixture.h"

#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"

namespace kvrail::testing {

LiveDaemon::LiveDaemon(const std::vector<std::string>& args) {
  REQUIRE(daemon.Start(dir.path(), args));
  auto c = client::Client::Connect(daemon.socket());
  REQUIRE(c.ok());
  client = *std::move(c);
}

LiveDaemon::~LiveDaemon() {
  client.reset();
  CHECK(daemon.Stop(SIGTERM) == 0);
}

v1::TransferStatus RunToEnd(client::Client& c, const v1::TransferSpec& spec) {
  auto submitted = c.Submit(spec);
  INFO(submitted.status().ToString());
  REQUIRE(submitted.ok());
  auto status = c.Wait(submitted->transfer_id(), absl::Seconds(60));
  REQUIRE(status.ok());
  return *status;
}

Pool MakePool(client::Client& c, const v1::PagedKvLayout& layout, bool writable,
              const std::string& name) {
  Pool pool;
  pool.layout = layout;
  const uint64_t bytes = LayoutBytes(layout);
  REQUIRE(bytes > 0);
  auto buffer = c.CreateHostBuffer(bytes);
  REQUIRE(buffer.ok());
  pool.buffer = *std::move(buffer);
  std::memset(pool.buffer->data(), kPoison, bytes);
  v1::RegionSpec spec;
  spec.set_name(name);
  spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  spec.set_size_bytes(bytes);
  spec.set_writable(writable);
  *spec.mutable_paged_kv() = layout;
  auto info = c.RegisterHostBuffer(*pool.buffer, spec);
  INFO(info.status().ToString());
  REQUIRE(info.ok());
  pool.info = *info;
  return pool;
}

static uint32_t VecBytes(const v1::PagedKvLayout& l) {
  return l.head_dim() * client::DTypeSize(l.dtype());
}

void FillPool(Pool& pool, uint32_t seed, const std::vector<uint32_t>& blocks, uint64_t tokens) {
  const auto& l = pool.layout;
  const uint32_t vec = VecBytes(l);
  for (uint32_t layer = 0; layer < l.num_layers(); ++layer) {
    for (uint32_t part = 0; part < l.num_parts(); ++part) {
      for (uint64_t t = 0; t < tokens; ++t) {
        const uint32_t block = blocks[t / l.tokens_per_block()];
        const uint32_t slot = t % l.tokens_per_block();
        for (uint32_t h = 0; h < l.num_heads(); ++h) {
          uint8_t* p = pool.buffer->data() + ElementOffset(l, layer, part, block, slot, h);
          for (uint32_t b = 0; b < vec; ++b) p[b] = PatternByte(seed, layer, part, t, h, b);
        }
      }
    }
  }
}

std::string VerifyPool(const Pool& pool, const Expectation& e) {
  const auto& l = pool.layout;
  const uint32_t vec = VecBytes(l);
  std::vector<bool> expected_written(pool.buffer->size(), false);
  for (uint32_t li = 0; li < e.num_layers; ++li) {
    for (uint32_t part = 0; part < l.num_parts(); ++part) {
      for (uint64_t t = 0; t < e.tokens; ++t) {
        const uint32_t block = e.dst_blocks[t / l.tokens_per_block()];
        const uint32_t slot = t % l.tokens_per_block();
        for (uint32_t hi = 0; hi < e.num_heads; ++hi) {
          const uint64_t off =
              ElementOffset(l, e.dst_layer_begin + li, part, block, slot, e.dst_head_begin + hi);
          const uint8_t* p = pool.buffer->data() + off;
          for (uint32_t b = 0; b < vec; ++b) {
            const uint8_t want =
                PatternByte(e.seed, e.src_layer_begin + li, part, t, e.src_head_begin + hi, b);
            if (p[b] != want) {
              return absl::StrCat("mismatch at layer ", li, " part ", part, " token ", t, " head ",
                                  hi, " byte ", b, ": got ", p[b], " want ", want);
            }
            expected_written[off + b] = true;
          }
        }
      }
    }
  }
  for (size_t i = 0; i < pool.buffer->size(); ++i) {
    if (!expected_written[i] && pool.buffer->data()[i] != kPoison) {
      return absl::StrCat("byte ", i, " outside the destination elements was written");
    }
  }
  return "";
}

uint64_t CountWritten(const Pool& pool) {
  uint64_t n = 0;
  for (size_t i = 0; i < pool.buffer->size(); ++i) n += pool.buffer->data()[i] != kPoison;
  return n;
}

std::vector<uint32_t> ScatteredBlocks(uint32_t n, uint32_t count, uint32_t seed) {
  std::vector<uint32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(count);
  return ids;
}

}  // namespace kvrail::testing

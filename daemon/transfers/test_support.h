// Test helpers for the transfers module: host regions registered in a real RegionTable (memfd
// backed, over a real SessionTable and Grants), a stand-in region (a lease, a remote source), and
// bytes / paged specs.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/unique_fd.h"
#include "daemon/access/access.h"
#include "daemon/regions/regions.h"
#include "daemon/sessions/sessions.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::transfers::testing {

// Registers host regions with a RegionTable of its own (over a SessionTable and Grants of its
// own). Thread-compatible. Aborts on failure (a broken fixture, not a finding).
class TestRegions {
 public:
  explicit TestRegions(Clock* clock = Clock::Real())
      : sessions_(sessions::SessionTable::Create()),
        table_(regions::RegionTable::Create(clock, sessions_.get())),
        grants_(access::Grants::Create(clock, sessions_.get(), table_.get())),
        session_(sessions_->BeginSession()) {}
  regions::RegionTable* table() const { return table_.get(); }
  sessions::SessionTable* sessions() const { return sessions_.get(); }
  access::Grants* grants() const { return grants_.get(); }
  // The session the regions are registered with unless a test names another.
  uint64_t session() const { return session_; }
  // Begins another session of the table (for regions owned by different clients).
  uint64_t NewSession() { return sessions_->BeginSession(); }

  std::shared_ptr<regions::Region> Bytes(uint64_t size, bool writable, uint64_t session = 0) {
    v1::RegionSpec spec;
    spec.set_name("bytes");
    spec.mutable_bytes();
    return Register(spec, size, writable, session);
  }
  // `blocks` blocks of 16 tokens x 1 head x 8 dims (bf16): 256 bytes per element, 2 parts.
  // `blocks` blocks of `layers` layers (16 tokens x 1 head x 8 dims, bf16) owned by `session`.
  std::shared_ptr<regions::Region> PagedLayers(uint32_t blocks, uint32_t layers, bool writable,
                                               uint64_t session) {
    v1::RegionSpec spec;
    spec.set_name("paged layers");
    auto* l = spec.mutable_paged_kv();
    l->set_num_layers(layers);
    l->set_num_parts(2);
    l->set_num_blocks(blocks);
    l->set_tokens_per_block(16);
    l->set_num_heads(1);
    l->set_head_dim(8);
    l->set_dtype(v1::DTYPE_BF16);
    l->set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
    return Register(spec, uint64_t{2} * layers * blocks * 256, writable, session);
  }
  std::shared_ptr<regions::Region> Paged(uint32_t blocks, bool writable) {
    return PagedLayers(blocks, 1, writable, 0);
  }

 private:
  std::shared_ptr<regions::Region> Register(v1::RegionSpec spec, uint64_t size, bool writable,
                                            uint64_t session = 0) {
    if (session == 0) session = session_;
    UniqueFd fd(::memfd_create("transfers_test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) std::abort();
    auto token = sessions_->AddFd(session, std::move(fd));
    if (!token.ok()) std::abort();
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
    spec.set_size_bytes(size);
    spec.set_writable(writable);
    spec.mutable_share()->set_fd_token(*token);
    auto region = table_->Register(spec, session);
    if (!region.ok()) {
      fprintf(stderr, "%s\n", region.status().ToString().c_str());
      std::abort();
    }
    return *region;
  }

  // In this order: each outlives the tables that hook it.
  std::unique_ptr<sessions::SessionTable> sessions_;
  std::unique_ptr<regions::RegionTable> table_;
  std::unique_ptr<access::Grants> grants_;
  uint64_t session_;
};

// A region that is not in any table: a remote lease or a sender's source. data() is null unless
// given memory. Thread-safe (immutable but for the use count).
class StandInRegion final : public regions::Region {
 public:
  explicit StandInRegion(const std::shared_ptr<regions::Region>& like, uint8_t* data = nullptr)
      : spec_(like->spec()), view_(like->view()), data_(data) {}
  uint64_t id() const override { return spec_.share().offset() + 424242; }
  uint64_t session_id() const override { return 0; }
  uint8_t* data() const override { return data_; }
  absl::StatusOr<uint8_t*> DeviceAddress(int) const override {
    return absl::FailedPreconditionError("stand-in");
  }
  const v1::RegionSpec& spec() const override { return spec_; }
  const planner::RegionView& view() const override { return view_; }
  v1::RegionInfo Info() const override { return v1::RegionInfo(); }
  void AcquireUse() override {}
  void ReleaseUse() override {}

 private:
  const v1::RegionSpec spec_;
  const planner::RegionView view_;
  uint8_t* const data_;
};

inline v1::TransferSpec BytesSpec(uint64_t src, uint64_t dst, uint64_t bytes) {
  v1::TransferSpec spec;
  spec.mutable_src()->set_region_id(src);
  spec.mutable_dst()->set_region_id(dst);
  spec.set_num_bytes(bytes);
  return spec;
}

inline v1::TransferSpec BlockSpec(uint64_t src, const std::vector<uint32_t>& src_blocks,
                                  uint64_t dst, const std::vector<uint32_t>& dst_blocks) {
  v1::TransferSpec spec;
  spec.mutable_src()->set_region_id(src);
  spec.mutable_dst()->set_region_id(dst);
  for (uint32_t b : src_blocks) spec.mutable_src()->add_block_ids(b);
  for (uint32_t b : dst_blocks) spec.mutable_dst()->add_block_ids(b);
  return spec;
}

}  // namespace kvrail::transfers::testing

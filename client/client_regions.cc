// Client's regions part (client_impl.h lists the parts): host buffers, region registration, and
// the library's own block-table region with its done words.
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "client/client_impl.h"
#include "client/completion_table.h"
#include "client/kvrail_client.h"
#include "proto/kvrail/v1/transfer.grpc.pb.h"
#include "wire/session_wire.h"

namespace kvrail::client {

// --- HostBuffer ----------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<HostBuffer>> HostBuffer::Create(size_t bytes,
                                                               const std::string& name) {
  if (bytes == 0) return absl::InvalidArgumentError("host buffer size must be > 0");
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoError("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoError(absl::StrCat("ftruncate(memfd, ", bytes, ")"));
  }
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (data == MAP_FAILED) return ErrnoError(absl::StrCat("mmap(memfd, ", bytes, ")"));
  return std::unique_ptr<HostBuffer>(
      new HostBuffer(fd.Release(), static_cast<uint8_t*>(data), bytes));
}

HostBuffer::~HostBuffer() {
  ::munmap(data_, size_);
  ::close(fd_);
}

absl::StatusOr<std::unique_ptr<HostBuffer>> Client::CreateHostBuffer(size_t bytes) {
  return HostBuffer::Create(bytes, "kvrail-host-buffer");
}

absl::StatusOr<v1::RegionInfo> Client::RegisterHostBuffer(const HostBuffer& buffer,
                                                          v1::RegionSpec spec) {
  const uint64_t offset = spec.share().offset();
  if (offset >= buffer.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.share.offset ", offset, " is beyond the host buffer (", buffer.size(), " bytes)"));
  }
  if (spec.memory_kind() == v1::MEMORY_KIND_UNSPECIFIED) {
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  }
  if (spec.memory_kind() != v1::MEMORY_KIND_HOST) {
    return absl::InvalidArgumentError("spec.memory_kind: a host buffer is MEMORY_KIND_HOST");
  }
  if (spec.size_bytes() == 0) spec.set_size_bytes(buffer.size() - offset);
  if (spec.layout_case() == v1::RegionSpec::LAYOUT_NOT_SET) spec.mutable_bytes();

  for (int attempt = 0;; ++attempt) {
    KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<wire::SessionConnection> session,
                            impl_->Session());
    KVRAIL_ASSIGN_OR_RETURN(std::string token, session->SendFd(buffer.fd()));
    v1::RegionSpec shared = spec;
    shared.mutable_share()->set_fd_token(token);  // single-use: a retry passes the fd again
    absl::StatusOr<v1::RegionInfo> info = RegisterRegion(std::move(shared), session->session_id());
    if (info.ok() || attempt > 0 || !YieldTableRegion(info.status())) return info;
  }
}

bool Client::YieldTableRegion(const absl::Status& failed) {
  if (failed.code() != absl::StatusCode::kResourceExhausted ||
      !absl::StrContains(failed.message(), "max_regions_per_")) {
    return false;
  }
  // Held: a Submit is using the region, or the failed registration was the region's own.
  if (!impl_->table_mu_.TryLock()) return false;
  const uint64_t region = impl_->table_region_;
  impl_->table_region_ = 0;
  impl_->RetireTableBufferLocked();
  impl_->table_mu_.Unlock();
  return region != 0 && UnregisterRegion(region).ok();
}

absl::StatusOr<v1::RegionInfo> Client::RegisterHostLayers(const std::vector<HostLayer>& layers,
                                                          v1::RegionSpec spec) {
  if (layers.empty()) return absl::InvalidArgumentError("layers: empty");
  if (spec.memory_kind() == v1::MEMORY_KIND_UNSPECIFIED) {
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  }
  if (spec.size_bytes() == 0 && spec.has_paged_kv()) {
    v1::PagedKvLayout one_layer = spec.paged_kv();
    one_layer.set_num_layers(1);
    KVRAIL_ASSIGN_OR_RETURN(const uint64_t bytes, PagedLayoutBytes(one_layer));
    spec.set_size_bytes(bytes);
  }
  spec.clear_share();
  spec.clear_layer_shares();
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].buffer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("layers[", i, "].buffer: NULL"));
    }
  }
  for (int attempt = 0;; ++attempt) {
    KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<wire::SessionConnection> session,
                            impl_->Session());
    v1::RegionSpec shared = spec;
    for (size_t i = 0; i < layers.size(); ++i) {
      KVRAIL_ASSIGN_OR_RETURN(std::string token, session->SendFd(layers[i].buffer->fd()));
      v1::RegionShare* share = shared.add_layer_shares();
      share->set_fd_token(token);
      share->set_offset(layers[i].offset);
    }
    absl::StatusOr<v1::RegionInfo> info = RegisterRegion(std::move(shared), session->session_id());
    if (info.ok() || attempt > 0 || !YieldTableRegion(info.status())) return info;
  }
}

absl::StatusOr<v1::RegionInfo> Client::RegisterHostFd(int fd, uint64_t offset, uint64_t bytes,
                                                      v1::RegionSpec spec) {
  if (fd < 0) return absl::InvalidArgumentError(absl::StrCat("fd: ", fd, " is not a descriptor"));
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(absl::StrCat("fd: fstat(", fd, ")"));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd: ", fd, " is not a regular file (a memfd or a /dev/shm object is shared by fd)"));
  }
  if (bytes == 0) return absl::InvalidArgumentError("bytes: must be > 0");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (offset >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offset: ", offset, " is at or beyond the end of fd ", fd, " (", size, " bytes)"));
  }
  if (bytes > size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes: [", offset, ", ", offset + bytes, ") does not fit fd ", fd, " (", size, " bytes)"));
  }
  if (spec.memory_kind() == v1::MEMORY_KIND_UNSPECIFIED) {
    spec.set_memory_kind(v1::MEMORY_KIND_HOST);
  }
  if (spec.memory_kind() != v1::MEMORY_KIND_HOST) {
    return absl::InvalidArgumentError("spec.memory_kind: memory shared by fd is MEMORY_KIND_HOST");
  }
  spec.set_size_bytes(bytes);
  if (spec.layout_case() == v1::RegionSpec::LAYOUT_NOT_SET) spec.mutable_bytes();
  spec.clear_layer_shares();
  for (int attempt = 0;; ++attempt) {
    KVRAIL_ASSIGN_OR_RETURN(const std::shared_ptr<wire::SessionConnection> session,
                            impl_->Session());
    KVRAIL_ASSIGN_OR_RETURN(std::string token, session->SendFd(fd));
    v1::RegionSpec shared = spec;
    shared.mutable_share()->set_fd_token(token);  // single-use: a retry passes the fd again
    shared.mutable_share()->set_offset(offset);
    absl::StatusOr<v1::RegionInfo> info = RegisterRegion(std::move(shared), session->session_id());
    if (info.ok() || attempt > 0 || !YieldTableRegion(info.status())) return info;
  }
}

absl::StatusOr<v1::RegionInfo> Client::RegisterRegion(v1::RegionSpec spec, uint64_t session_id) {
  if (spec.share().via_case() == v1::RegionShare::kShmName) {
    if (spec.memory_kind() == v1::MEMORY_KIND_UNSPECIFIED) {
      spec.set_memory_kind(v1::MEMORY_KIND_HOST);
    }
    // The object is opened here, with this process's rights, and its fd passed over the session
    // socket: kvraild opens nothing by name for the library (docs/security.md, "Memory").
    const std::string name = spec.share().shm_name();
    UniqueFd fd(::shm_open(name.c_str(), (spec.writable() ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0));
    if (!fd.valid()) return ErrnoError(absl::StrCat("spec.share.shm_name: shm_open(", name, ")"));
    if (spec.size_bytes() == 0) {
      struct stat st;
      if (::fstat(fd.get(), &st) != 0) return ErrnoError("fstat(shm)");
      const uint64_t size = static_cast<uint64_t>(st.st_size);
      if (spec.share().offset() >= size) {
        return absl::InvalidArgumentError(absl::StrCat("spec.share.offset ", spec.share().offset(),
                                                       " is beyond shm object (", size, " bytes)"));
      }
      spec.set_size_bytes(size - spec.share().offset());
    }
    // Without a session (a TCP target) the name goes as it is: kvraild then refuses it unless
    // the caller's uid owns the object, which it cannot know over TCP.
    absl::StatusOr<std::shared_ptr<wire::SessionConnection>> session = impl_->Session();
    if (session.ok()) {
      KVRAIL_ASSIGN_OR_RETURN(std::string token, (*session)->SendFd(fd.get()));
      spec.mutable_share()->set_fd_token(token);  // keeps share.offset
      session_id = (*session)->session_id();
    }
  }
  v1::RegisterRegionRequest request;
  *request.mutable_spec() = std::move(spec);
  request.set_session_id(session_id);
  KVRAIL_ASSIGN_OR_RETURN(
      v1::RegisterRegionResponse response,
      impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::RegisterRegion, request));
  return std::move(*response.mutable_region());
}

absl::Status Client::UnregisterRegion(uint64_t region_id) {
  v1::UnregisterRegionRequest request;
  request.set_region_id(region_id);
  return impl_->Unary(*impl_->transfer_, &v1::Transfer::Stub::UnregisterRegion, request).status();
}

// --- The block-table region ----------------------------------------------------------------

void Client::Impl::RetireTableBufferLocked() {
  absl::MutexLock lock(&done_mu_);
  if (table_buffer_ != nullptr) retired_tables_.push_back(std::move(table_buffer_));
  done_words_ = nullptr;
  done_region_ = 0;
  if (done_for_ != nullptr) done_for_->EnableDoneWords(nullptr, 0, 0);
  done_for_ = nullptr;
}

absl::Status Client::PrepareTableBuffer(uint64_t need) {
  impl_->table_mu_.AssertHeld();
  // The done words come first, the tables after them.
  need += kDoneWordsBytes;
  if (impl_->table_buffer_ != nullptr && impl_->table_buffer_->size() >= need) {
    return absl::OkStatus();
  }
  if (impl_->table_region_ != 0) (void)UnregisterRegion(impl_->table_region_);
  impl_->table_region_ = 0;
  impl_->RetireTableBufferLocked();
  uint64_t size = kBlockTableBufferBytes;
  while (size < need) size *= 2;
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<HostBuffer> buffer,
                          HostBuffer::Create(size, "kvrail-block-tables"));
  // Touch every page now (the daemon maps the same pages): the first Submit then writes into
  // memory that is already there.
  std::memset(buffer->data(), 0, buffer->size());
  v1::RegionSpec region;
  region.set_name(kBlockTableRegionName);
  region.set_library_region(true);  // the daemon's mark of the library's own region (not the name)
  region.set_writable(true);        // the GPU stores the done words (TransferSpec.done_word)
  KVRAIL_ASSIGN_OR_RETURN(const v1::RegionInfo info, RegisterHostBuffer(*buffer, region));
  impl_->table_buffer_ = std::move(buffer);
  impl_->table_region_ = info.region_id();
  absl::MutexLock lock(&impl_->done_mu_);
  impl_->done_words_ = reinterpret_cast<uint64_t*>(impl_->table_buffer_->data());
  impl_->done_region_ = info.region_id();
  return absl::OkStatus();
}

bool Client::EnableDoneWords(CompletionTable* completions) {
  {
    absl::MutexLock lock(&impl_->done_mu_);
    if (impl_->done_region_ != 0 && impl_->done_for_ == completions) return true;
  }
  // No block-table region yet (KVRAIL_BLOCK_TABLE_BUFFER=lazy, or it was yielded): made now,
  // unless a Submit holds it (then this transfer goes without a word).
  if (impl_->table_mu_.TryLock()) {
    if (impl_->table_buffer_ == nullptr) (void)PrepareTableBuffer(0);
    impl_->table_mu_.Unlock();
  }
  absl::MutexLock lock(&impl_->done_mu_);
  if (impl_->done_region_ == 0) return false;
  if (impl_->done_for_ != completions) {
    completions->EnableDoneWords(impl_->done_words_, kDoneWords, impl_->done_region_);
    impl_->done_for_ = completions;
  }
  return true;
}

}  // namespace kvrail::client

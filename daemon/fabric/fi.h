// Internal to the fabric module: RAII wrappers over libfabric handles (fid_fabric, fid_domain,
// fid_av, fid_cq, fid_ep, fid_mr) and one "NIC": an RDM endpoint with FI_RMA bound to one local
// address. libfabric return codes become absl::Status at the call site (fi_strerror text).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvrail::fabric {

// Status from a negative libfabric return code: UNAVAILABLE for transport failures, INTERNAL
// otherwise; the message is "<what>: <fi_strerror> (<code>)".
absl::Status FiError(const char* what, ssize_t code);

// Closes any fid on destruction.
struct FidCloser {
  void operator()(fid* f) const;
};
template <typename T>
struct FiDeleter {
  void operator()(T* p) const {
    if (p != nullptr) FidCloser()(&p->fid);
  }
};
template <typename T>
using FiPtr = std::unique_ptr<T, FiDeleter<T>>;

struct FiInfoDeleter {
  void operator()(fi_info* p) const { fi_freeinfo(p); }
};
using FiInfoPtr = std::unique_ptr<fi_info, FiInfoDeleter>;

// A registered memory region; deregistered on destruction.
class MemoryRegion {
 public:
  MemoryRegion(FiPtr<fid_mr> mr, uint8_t* base, uint64_t size, bool virt_addr)
      : mr_(std::move(mr)), base_(base), size_(size), virt_addr_(virt_addr) {}
  void* desc() const { return fi_mr_desc(mr_.get()); }
  uint64_t key() const { return fi_mr_key(mr_.get()); }
  uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }
  // The address a peer names for byte 0 of this region: its virtual address when the provider
  // uses FI_MR_VIRT_ADDR, else 0 (offset-based addressing).
  uint64_t remote_base() const { return virt_addr_ ? reinterpret_cast<uint64_t>(base_) : 0; }

 private:
  FiPtr<fid_mr> mr_;
  uint8_t* base_;
  uint64_t size_;
  bool virt_addr_;
};

// One NIC: fabric + domain + address vector + completion queue + RDM endpoint (FI_RMA, remote CQ
// data). Thread contract: Open/RegisterMemory/InsertAddress/RemoveAddress may be called from any
// thread (serialized by the caller: the owner's mutex); data calls (WriteData, InjectWriteData,
// ReadCompletions) are made by the one proxy thread that owns the NIC, plus Signal from anyone.
class Nic {
 public:
  struct Options {
    std::string provider = "tcp;ofi_rxm";  // also accepts "verbs;ofi_rxm", "efa"
    std::string address;                   // local IPv4 address to bind ("10.0.0.1"); "" = any
    std::string name;                      // for humans ("nic0@10.0.0.1")
    // Ask for FI_HMEM (device-memory registration) and use it when the provider offers it.
    bool hmem = false;
  };
  static absl::StatusOr<std::unique_ptr<Nic>> Open(const Options& options);
  ~Nic();

  const std::string& name() const { return name_; }
  const std::string& provider() const { return provider_; }
  const std::string& domain_name() const { return domain_name_; }
  // fi_getname bytes of the endpoint: what peers insert into their address vector.
  const std::string& address() const { return address_; }
  size_t inject_size() const { return inject_size_; }
  // Whether completion reads can block (a wait object), so an idle proxy sleeps in the kernel.
  bool can_wait() const { return can_wait_; }

  // Registers [base, base+size) with `access` (FI_WRITE | FI_READ for a local source only; add
  // FI_REMOTE_WRITE | FI_REMOTE_READ for a peer's target) once, at start. `requested_key` is the
  // key unless the provider picks keys (FI_MR_PROV_KEY): read it back with MemoryRegion::key. A
  // requested key already used in the domain is ALREADY_EXISTS (retry with another).
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(uint8_t* base, uint64_t size,
                                                               uint64_t requested_key,
                                                               uint64_t access);
  // Whether the provider picks the registration keys (FI_MR_PROV_KEY) rather than taking ours.
  bool provider_keys() const { return prov_key_; }
  // FI_HMEM: whether this endpoint registers device memory: Options.hmem was
  // set and the provider offers it (fi_getinfo asked with caps FI_HMEM and mr_mode FI_MR_HMEM
  // first, without them when no endpoint offers them). tcp;ofi_rxm has none here.
  bool hmem() const { return hmem_; }
  // Registers CUDA device memory [base, base+size) of GPU `cuda_device` (fi_mr_regattr with
  // iface FI_HMEM_CUDA, device.cuda = cuda_device), so the NIC reads tiles straight from (or
  // writes them straight into) device memory; `requested_key` and `access` as RegisterMemory.
  // FAILED_PRECONDITION naming the provider when !hmem(). Written to the providers' documented
  // semantics (fi_mr(3), fi_getinfo(3) FI_HMEM); never run here: no provider with FI_HMEM.
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterDeviceMemory(uint8_t* base, uint64_t size,
                                                                     int cuda_device,
                                                                     uint64_t requested_key,
                                                                     uint64_t access);
  absl::StatusOr<fi_addr_t> InsertAddress(const std::string& raw);
  void RemoveAddress(fi_addr_t addr);

  // fi_writedata; returns -FI_EAGAIN (as the int) when the provider queue is full, 0 when posted.
  ssize_t WriteData(const void* buf, size_t len, void* desc, uint64_t data, fi_addr_t dest,
                    uint64_t remote_addr, uint64_t key, void* context);
  // fi_inject_writedata (len <= inject_size); no local completion.
  ssize_t InjectWriteData(const void* buf, size_t len, uint64_t data, fi_addr_t dest,
                          uint64_t remote_addr, uint64_t key);
  // Reads up to `max` completions (fi_cq_data_entry). Returns the count, 0 when none, or a
  // negative code; -FI_EAVAIL means an error entry is waiting: ReadError then.
  ssize_t ReadCompletions(fi_cq_data_entry* entries, size_t max);
  // Blocks up to `timeout_ms` for completions (falls back to polling when !can_wait()).
  ssize_t WaitCompletions(fi_cq_data_entry* entries, size_t max, int timeout_ms);
  // Reads one error entry; returns its op context and status.
  absl::Status ReadError(void** context);
  // Wakes a WaitCompletions sleeper (after a command was queued).
  void Signal();

 private:
  Nic() = default;

  std::string name_, provider_, domain_name_, address_;
  size_t inject_size_ = 0;
  bool can_wait_ = false;
  bool virt_addr_ = false;
  bool prov_key_ = false;
  bool hmem_ = false;
  // After fid_mr creation: binds/enables it where FI_MR_ENDPOINT asks and wraps it.
  absl::StatusOr<std::unique_ptr<MemoryRegion>> FinishRegistration(fid_mr* mr, uint8_t* base,
                                                                   uint64_t size);
  FiInfoPtr info_;
  FiPtr<fid_fabric> fabric_;
  FiPtr<fid_domain> domain_;
  FiPtr<fid_av> av_;
  FiPtr<fid_cq> cq_;
  FiPtr<fid_ep> ep_;
};

}  // namespace kvrail::fabric

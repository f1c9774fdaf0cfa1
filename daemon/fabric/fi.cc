#include "daemon/fabric/fi.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvrail::fabric {

absl::Status FiError(const char* what, ssize_t code) {
  const int c = static_cast<int>(code < 0 ? -code : code);
  std::string message = absl::StrCat(what, ": ", fi_strerror(c), " (", c, ")");
  switch (c) {
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_ENETDOWN:
    case FI_ETIMEDOUT:
    case FI_EIO:
    case FI_ECANCELED:
      return absl::UnavailableError(message);
    case FI_ENODATA:
      return absl::NotFoundError(message);
    default:
      return absl::InternalError(message);
  }
}

void FidCloser::operator()(fid* f) const {
  if (f != nullptr) fi_close(f);
}

absl::StatusOr<std::unique_ptr<Nic>> Nic::Open(const Options& options) {
  FiInfoPtr hints(fi_allocinfo());
  if (!hints) return absl::ResourceExhaustedError("fi_allocinfo failed");
  hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
  hints->ep_attr->type = FI_EP_RDM;
  hints->mode = FI_CONTEXT;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->fabric_attr->prov_name = strdup(options.provider.c_str());
  sockaddr_in src{};
  if (!options.address.empty()) {
    src.sin_family = AF_INET;
    src.sin_port = 0;
    if (inet_pton(AF_INET, options.address.c_str(), &src.sin_addr) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("fabric.nics: '", options.address, "' is not an IPv4 address"));
    }
    hints->addr_format = FI_SOCKADDR_IN;
    hints->src_addr = malloc(sizeof(src));
    std::memcpy(hints->src_addr, &src, sizeof(src));
    hints->src_addrlen = sizeof(src);
  }
  fi_info* raw = nullptr;
  // FI_HMEM (device memory registration: the NIC reads and writes GPU memory directly): asked
  // for only when options.hmem, first with it and, when no endpoint offers it (-FI_ENODATA; tcp
  // here), again without it. Not asked for by default: with FI_HMEM a provider may treat every
  // buffer as possibly device memory (other protocols, per-buffer pointer queries), and nothing
  // in the data path registers device memory yet.
  int rc = -FI_ENODATA;
  bool hmem = false;
  if (options.hmem) {
    hints->caps |= FI_HMEM;
    hints->domain_attr->mr_mode |= FI_MR_HMEM;
    rc = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints.get(), &raw);
    hmem = rc == 0 && raw != nullptr && (raw->caps & FI_HMEM) != 0;
    if (!hmem && raw != nullptr) {
      fi_freeinfo(raw);
      raw = nullptr;
    }
    hints->caps &= ~FI_HMEM;
    hints->domain_attr->mr_mode &= ~FI_MR_HMEM;
  }
  if (!hmem) rc = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints.get(), &raw);
  if (rc != 0) {
    return absl::FailedPreconditionError(absl::StrCat("fabric.provider: no '", options.provider,
                                                      "' RDM endpoint with FI_RMA on '",
                                                      options.address, "': ", fi_strerror(-rc)));
  }
  std::unique_ptr<Nic> nic(new Nic());
  nic->info_.reset(raw);
  fi_info* info = raw;
  nic->name_ = options.name;
  nic->provider_ = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : options.provider;
  nic->domain_name_ = info->domain_attr->name ? info->domain_attr->name : "";
  nic->inject_size_ = info->tx_attr->inject_size;
  // Remote addresses: virtual addresses when the provider reports FI_MR_VIRT_ADDR (verbs, efa),
  // else offsets from the registration's start (tcp;ofi_rxm between processes, as libfabric
  // specifies for mr_mode without FI_MR_VIRT_ADDR).
  nic->virt_addr_ = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
  nic->prov_key_ = (info->domain_attr->mr_mode & FI_MR_PROV_KEY) != 0;
  nic->hmem_ = hmem;
  if (info->domain_attr->cq_data_size < 8) {
    return absl::FailedPreconditionError(
        absl::StrCat("fabric.provider: '", nic->provider_, "' carries only ",
                     info->domain_attr->cq_data_size, " bytes of immediate data; kvrail needs 8"));
  }

  fid_fabric* fabric = nullptr;
  rc = fi_fabric(info->fabric_attr, &fabric, nullptr);
  if (rc != 0) return FiError("fi_fabric", rc);
  nic->fabric_.reset(fabric);
  fid_domain* domain = nullptr;
  rc = fi_domain(fabric, info, &domain, nullptr);
  if (rc != 0) return FiError("fi_domain", rc);
  nic->domain_.reset(domain);

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  fid_av* av = nullptr;
  rc = fi_av_open(domain, &av_attr, &av, nullptr);
  if (rc != 0) return FiError("fi_av_open", rc);
  nic->av_.reset(av);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.size = 1024;
  cq_attr.wait_obj = FI_WAIT_UNSPEC;
  fid_cq* cq = nullptr;
  rc = fi_cq_open(domain, &cq_attr, &cq, nullptr);
  if (rc != 0) {
    cq_attr.wait_obj = FI_WAIT_NONE;  // providers without wait objects: the proxy polls
    rc = fi_cq_open(domain, &cq_attr, &cq, nullptr);
    if (rc != 0) return FiError("fi_cq_open", rc);
  } else {
    nic->can_wait_ = true;
  }
  nic->cq_.reset(cq);

  fid_ep* ep = nullptr;
  rc = fi_endpoint(domain, info, &ep, nullptr);
  if (rc != 0) return FiError("fi_endpoint", rc);
  nic->ep_.reset(ep);
  rc = fi_ep_bind(ep, &av->fid, 0);
  if (rc != 0) return FiError("fi_ep_bind(av)", rc);
  rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV);
  if (rc != 0) return FiError("fi_ep_bind(cq)", rc);
  rc = fi_enable(ep);
  if (rc != 0) return FiError("fi_enable", rc);

  char name[256];
  size_t len = sizeof(name);
  rc = fi_getname(&ep->fid, name, &len);
  if (rc != 0) return FiError("fi_getname", rc);
  nic->address_.assign(name, len);
  return nic;
}

Nic::~Nic() = default;

absl::StatusOr<std::unique_ptr<MemoryRegion>> Nic::RegisterMemory(uint8_t* base, uint64_t size,
                                                                  uint64_t requested_key,
                                                                  uint64_t access) {
  fid_mr* mr = nullptr;
  int rc = fi_mr_reg(domain_.get(), base, size, access, 0, prov_key_ ? 0 : requested_key, 0, &mr,
                     nullptr);
  if (rc == -FI_ENOKEY) {
    return absl::AlreadyExistsError(absl::StrCat("fi_mr_reg: key ", requested_key, " in use"));
  }
  if (rc != 0) return FiError("fi_mr_reg", rc);
  return FinishRegistration(mr, base, size);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Nic::RegisterDeviceMemory(
    uint8_t* base, uint64_t size, int cuda_device, uint64_t requested_key, uint64_t access) {
  if (!hmem_) {
    return absl::FailedPreconditionError(
        absl::StrCat("fabric.provider: '", provider_,
                     "' offers no FI_HMEM: GPU memory cannot be registered "
                     "with it (GPU regions travel through host staging)"));
  }
  iovec iov{base, size};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = access;
  attr.requested_key = prov_key_ ? 0 : requested_key;
  attr.iface = FI_HMEM_CUDA;
  attr.device.cuda = cuda_device;
  fid_mr* mr = nullptr;
  int rc = fi_mr_regattr(domain_.get(), &attr, 0, &mr);
  if (rc == -FI_ENOKEY) {
    return absl::AlreadyExistsError(absl::StrCat("fi_mr_regattr: key ", requested_key, " in use"));
  }
  if (rc != 0) return FiError("fi_mr_regattr(FI_HMEM_CUDA)", rc);
  return FinishRegistration(mr, base, size);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Nic::FinishRegistration(fid_mr* mr, uint8_t* base,
                                                                      uint64_t size) {
  FiPtr<fid_mr> owned(mr);
  int rc = 0;
  if (info_->domain_attr->mr_mode & FI_MR_ENDPOINT) {
    rc = fi_mr_bind(mr, &ep_->fid, 0);
    if (rc != 0) return FiError("fi_mr_bind", rc);
    rc = fi_mr_enable(mr);
    if (rc != 0) return FiError("fi_mr_enable", rc);
  }
  return std::make_unique<MemoryRegion>(std::move(owned), base, size, virt_addr_);
}

absl::StatusOr<fi_addr_t> Nic::InsertAddress(const std::string& raw) {
  fi_addr_t addr = FI_ADDR_UNSPEC;
  int rc = fi_av_insert(av_.get(), raw.data(), 1, &addr, 0, nullptr);
  if (rc != 1) return FiError("fi_av_insert", rc < 0 ? rc : -FI_EINVAL);
  return addr;
}

void Nic::RemoveAddress(fi_addr_t addr) { fi_av_remove(av_.get(), &addr, 1, 0); }

ssize_t Nic::WriteData(const void* buf, size_t len, void* desc, uint64_t data, fi_addr_t dest,
                       uint64_t remote_addr, uint64_t key, void* context) {
  return fi_writedata(ep_.get(), buf, len, desc, data, dest, remote_addr, key, context);
}

ssize_t Nic::InjectWriteData(const void* buf, size_t len, uint64_t data, fi_addr_t dest,
                             uint64_t remote_addr, uint64_t key) {
  return fi_inject_writedata(ep_.get(), buf, len, data, dest, remote_addr, key);
}

ssize_t Nic::ReadCompletions(fi_cq_data_entry* entries, size_t max) {
  ssize_t n = fi_cq_read(cq_.get(), entries, max);
  return n == -FI_EAGAIN ? 0 : n;
}

ssize_t Nic::WaitCompletions(fi_cq_data_entry* entries, size_t max, int timeout_ms) {
  if (!can_wait_) return ReadCompletions(entries, max);
  ssize_t n = fi_cq_sread(cq_.get(), entries, max, nullptr, timeout_ms);
  return n == -FI_EAGAIN ? 0 : n;
}

absl::Status Nic::ReadError(void** context) {
  fi_cq_err_entry err{};
  ssize_t rc = fi_cq_readerr(cq_.get(), &err, 0);
  if (rc < 0) return FiError("fi_cq_readerr", rc);
  *context = err.op_context;
  char buf[256];
  const char* detail = fi_cq_strerror(cq_.get(), err.prov_errno, err.err_data, buf, sizeof(buf));
  return FiError(
      absl::StrCat("completion error on ", name_, " (", detail ? detail : "", ")").c_str(),
      -err.err);
}

void Nic::Signal() {
  if (can_wait_) fi_cq_signal(cq_.get());
}

}  // namespace kvrail::fabric

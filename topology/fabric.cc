// libfabric: which providers/domains offer RDM endpoints with RMA (what the fabric module will
// open). No provider is an answer (a note), not an error.
#include <rdma/fabric.h>

#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "topology/discover_internal.h"

namespace kvrail::topology::internal {

void ProbeFabric(::kvrail::v1::TopologyDesc* desc) {
  fi_info* hints = fi_allocinfo();
  if (hints == nullptr) {
    desc->add_notes("libfabric: fi_allocinfo failed");
    return;
  }
  hints->caps = FI_RMA;
  hints->ep_attr->type = FI_EP_RDM;
  fi_info* info = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, hints, &info);
  fi_freeinfo(hints);
  if (rc != 0) {
    desc->add_notes(
        absl::StrCat("libfabric: no RDM+RMA provider (fi_getinfo: ", fi_strerror(-rc), ")"));
    return;
  }
  // fi_getinfo lists one entry per provider/domain/address format; keep each triple once.
  std::set<std::tuple<std::string, std::string, std::string>> seen;
  for (fi_info* cur = info; cur != nullptr; cur = cur->next) {
    std::string provider =
        cur->fabric_attr && cur->fabric_attr->prov_name ? cur->fabric_attr->prov_name : "";
    std::string domain = cur->domain_attr && cur->domain_attr->name ? cur->domain_attr->name : "";
    std::string fabric = cur->fabric_attr && cur->fabric_attr->name ? cur->fabric_attr->name : "";
    if (!seen.insert({provider, domain, fabric}).second) continue;
    auto* entry = desc->add_fabric_domains();
    entry->set_provider(provider);
    entry->set_domain(domain);
    entry->set_fabric(fabric);
  }
  fi_freeinfo(info);
}

}  // namespace kvrail::topology::internal

// NVML, loaded with dlopen("libnvidia-ml.so.1") at run time so the daemon starts on machines
// without the NVIDIA driver. We declare only the few entry points we call (signatures from the
// public NVML API reference); nvml.h is not needed to build.
#include <dlfcn.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "topology/discover_internal.h"

namespace kvrail::topology::internal {
namespace {

using nvmlReturn_t = int;  // NVML_SUCCESS == 0
using nvmlDevice_t = struct NvmlDeviceOpaque*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr unsigned kNvmlMaxLinks = 18;      // NVML_NVLINK_MAX_LINKS
constexpr int kNvmlP2pCapsRead = 0;         // NVML_P2P_CAPS_INDEX_READ
constexpr int kNvmlP2pCapsWrite = 1;        // NVML_P2P_CAPS_INDEX_WRITE
constexpr int kNvmlP2pStatusOk = 0;         // NVML_P2P_STATUS_OK
constexpr int kNvmlNvLinkDeviceSwitch = 2;  // NVML_NVLINK_DEVICE_TYPE_SWITCH

struct NvmlPciInfo {  // nvmlPciInfo_t
  char bus_id_legacy[16];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pci_device_id;
  unsigned pci_subsystem_id;
  char bus_id[32];
};

struct NvmlMemory {  // nvmlMemory_t
  unsigned long long total, free, used;
};

struct Nvml {
  void* lib = nullptr;
  nvmlReturn_t (*Init)() = nullptr;
  nvmlReturn_t (*Shutdown)() = nullptr;
  const char* (*ErrorString)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*GetCount)(unsigned*) = nullptr;
  nvmlReturn_t (*GetHandle)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*GetPciInfo)(nvmlDevice_t, NvmlPciInfo*) = nullptr;
  nvmlReturn_t (*GetName)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*GetUuid)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*GetMemory)(nvmlDevice_t, NvmlMemory*) = nullptr;
  nvmlReturn_t (*GetCc)(nvmlDevice_t, int*, int*) = nullptr;
  nvmlReturn_t (*GetMigMode)(nvmlDevice_t, unsigned*, unsigned*) = nullptr;
  nvmlReturn_t (*GetNvLinkState)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*GetNvLinkRemotePci)(nvmlDevice_t, unsigned, NvmlPciInfo*) = nullptr;
  nvmlReturn_t (*GetNvLinkRemoteType)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*GetP2PStatus)(nvmlDevice_t, nvmlDevice_t, int, int*) = nullptr;
  nvmlReturn_t (*GetDriverVersion)(char*, unsigned) = nullptr;

  template <typename F>
  void Bind(F* fn, const char* name) {
    *fn = reinterpret_cast<F>(dlsym(lib, name));
  }
  std::string Error(nvmlReturn_t r) const {
    return ErrorString != nullptr ? ErrorString(r) : absl::StrCat("NVML error ", r);
  }
};

}  // namespace

void ProbeNvml(GpuFacts* facts) {
  Nvml nvml;
  nvml.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nvml.lib == nullptr) {
    facts->notes.push_back(absl::StrCat("NVML: not loaded (", dlerror(), ")"));
    return;
  }
  nvml.Bind(&nvml.Init, "nvmlInit_v2");
  nvml.Bind(&nvml.Shutdown, "nvmlShutdown");
  nvml.Bind(&nvml.ErrorString, "nvmlErrorString");
  nvml.Bind(&nvml.GetCount, "nvmlDeviceGetCount_v2");
  nvml.Bind(&nvml.GetHandle, "nvmlDeviceGetHandleByIndex_v2");
  nvml.Bind(&nvml.GetPciInfo, "nvmlDeviceGetPciInfo_v3");
  nvml.Bind(&nvml.GetName, "nvmlDeviceGetName");
  nvml.Bind(&nvml.GetUuid, "nvmlDeviceGetUUID");
  nvml.Bind(&nvml.GetMemory, "nvmlDeviceGetMemoryInfo");
  nvml.Bind(&nvml.GetCc, "nvmlDeviceGetCudaComputeCapability");
  nvml.Bind(&nvml.GetMigMode, "nvmlDeviceGetMigMode");
  nvml.Bind(&nvml.GetNvLinkState, "nvmlDeviceGetNvLinkState");
  nvml.Bind(&nvml.GetNvLinkRemotePci, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  nvml.Bind(&nvml.GetNvLinkRemoteType, "nvmlDeviceGetNvLinkRemoteDeviceType");
  nvml.Bind(&nvml.GetP2PStatus, "nvmlDeviceGetP2PStatus");
  nvml.Bind(&nvml.GetDriverVersion, "nvmlSystemGetDriverVersion");
  if (nvml.Init == nullptr || nvml.GetCount == nullptr || nvml.GetHandle == nullptr ||
      nvml.GetPciInfo == nullptr) {
    facts->notes.push_back("NVML: library lacks nvmlInit_v2/GetCount/GetHandle/GetPciInfo_v3");
    dlclose(nvml.lib);
    return;
  }
  nvmlReturn_t r = nvml.Init();
  if (r != kNvmlSuccess) {
    facts->notes.push_back(absl::StrCat("NVML: nvmlInit failed (", nvml.Error(r), ")"));
    dlclose(nvml.lib);
    return;
  }
  char version[96] = {0};
  if (nvml.GetDriverVersion && nvml.GetDriverVersion(version, sizeof(version)) == kNvmlSuccess) {
    facts->driver_version = version;
  }
  unsigned count = 0;
  if ((r = nvml.GetCount(&count)) != kNvmlSuccess) {
    facts->notes.push_back(absl::StrCat("NVML: nvmlDeviceGetCount failed (", nvml.Error(r), ")"));
    count = 0;
  }
  std::vector<nvmlDevice_t> handles;
  std::vector<std::string> buses;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    NvmlPciInfo pci{};
    if (nvml.GetHandle(i, &dev) != kNvmlSuccess || nvml.GetPciInfo(dev, &pci) != kNvmlSuccess) {
      facts->notes.push_back(absl::StrCat("NVML: device ", i, " not readable"));
      continue;
    }
    std::string bus = NormalizeBusId(pci.bus_id);
    handles.push_back(dev);
    buses.push_back(bus);
    auto* gpu = FindOrAddGpu(facts, bus);
    AddSource(gpu, "nvml");
    char text[128] = {0};
    if (nvml.GetName && nvml.GetName(dev, text, sizeof(text)) == kNvmlSuccess) gpu->set_name(text);
    if (nvml.GetUuid && nvml.GetUuid(dev, text, sizeof(text)) == kNvmlSuccess) gpu->set_uuid(text);
    NvmlMemory mem{};
    if (nvml.GetMemory && nvml.GetMemory(dev, &mem) == kNvmlSuccess)
      gpu->set_memory_bytes(mem.total);
    int major = 0, minor = 0;
    if (nvml.GetCc && nvml.GetCc(dev, &major, &minor) == kNvmlSuccess) {
      gpu->set_compute_capability_major(major);
      gpu->set_compute_capability_minor(minor);
    }
    unsigned mig = 0, pending = 0;
    if (nvml.GetMigMode && nvml.GetMigMode(dev, &mig, &pending) == kNvmlSuccess) {
      gpu->set_mig_enabled(mig != 0);
    }
  }
  // NVLinks: per GPU, active links grouped by the remote end. A remote that is an NVSwitch
  // connects the GPU to every other GPU with switch links.
  std::vector<int> switch_links(handles.size(), 0);
  std::map<PairKey, int> direct;
  bool any_nvlink_api = nvml.GetNvLinkState != nullptr && nvml.GetNvLinkRemotePci != nullptr;
  for (size_t i = 0; any_nvlink_api && i < handles.size(); ++i) {
    for (unsigned link = 0; link < kNvmlMaxLinks; ++link) {
      int active = 0;
      if (nvml.GetNvLinkState(handles[i], link, &active) != kNvmlSuccess || !active) continue;
      int type = -1;
      if (nvml.GetNvLinkRemoteType &&
          nvml.GetNvLinkRemoteType(handles[i], link, &type) == kNvmlSuccess &&
          type == kNvmlNvLinkDeviceSwitch) {
        ++switch_links[i];
        continue;
      }
      NvmlPciInfo remote{};
      if (nvml.GetNvLinkRemotePci(handles[i], link, &remote) != kNvmlSuccess) continue;
      std::string rbus = NormalizeBusId(remote.bus_id);
      bool is_gpu = false;
      for (const auto& b : buses) is_gpu = is_gpu || b == rbus;
      if (!is_gpu) {
        ++switch_links[i];  // remote end is not one of our GPUs: an NVSwitch
      } else if (buses[i] < rbus) {
        ++direct[MakePairKey(buses[i], rbus)];  // each link once, seen from the lower bus id
      }
    }
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    for (size_t j = i + 1; j < handles.size(); ++j) {
      PairFacts& pair = facts->pairs[MakePairKey(buses[i], buses[j])];
      int via_direct = direct[MakePairKey(buses[i], buses[j])];
      int via_switch = std::min(switch_links[i], switch_links[j]);
      pair.nvlink_count = std::max(pair.nvlink_count, via_direct + via_switch);
      pair.nvswitch = pair.nvswitch || via_switch > 0;
      if (nvml.GetP2PStatus) {
        int read = -1, write = -1;
        if (nvml.GetP2PStatus(handles[i], handles[j], kNvmlP2pCapsRead, &read) == kNvmlSuccess &&
            nvml.GetP2PStatus(handles[i], handles[j], kNvmlP2pCapsWrite, &write) == kNvmlSuccess) {
          pair.p2p_known = true;
          pair.p2p = pair.p2p || (read == kNvmlP2pStatusOk && write == kNvmlP2pStatusOk);
        }
      }
    }
  }
  if (nvml.Shutdown) nvml.Shutdown();
  dlclose(nvml.lib);
}

}  // namespace kvrail::topology::internal

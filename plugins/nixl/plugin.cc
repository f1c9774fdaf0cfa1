// The entry points NIXL's plugin manager looks up in libplugin_KVRAIL.so.
#include <exception>
#include <new>

#include "plugins/nixl/kvrail_engine.h"
#include "plugins/nixl/nixl_abi.h"

namespace kvrail::nixl {
namespace {

nixlBackendEngine* CreateEngine(const nixlBackendInitParams* init_params) {
  if (init_params == nullptr || init_params->customParams == nullptr) return nullptr;
  try {
    return new KvrailEngine(init_params);
  } catch (const std::exception&) {
    return nullptr;  // no exception crosses into the agent
  }
}

void DestroyEngine(nixlBackendEngine* engine) { delete engine; }

const char* PluginName() { return kBackendName; }
const char* PluginVersion() { return kBackendVersion; }
nixl_b_params_t BackendOptions() { return DefaultOptions(); }
nixl_mem_list_t BackendMems() { return {DRAM_SEG, VRAM_SEG}; }

nixlBackendPlugin plugin_record = {kNixlPluginApiVersion, CreateEngine,   DestroyEngine, PluginName,
                                   PluginVersion,         BackendOptions, BackendMems};

}  // namespace
}  // namespace kvrail::nixl

extern "C" {
__attribute__((visibility("default"))) nixlBackendPlugin* nixl_plugin_init() {
  return &kvrail::nixl::plugin_record;
}
__attribute__((visibility("default"))) void nixl_plugin_fini() {}
}

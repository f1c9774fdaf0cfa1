// The backend plugin ABI of NIXL 1.5.1 (PyPI wheel nixl-cu13 1.5.1), declared here from the
// API's documented semantics so that kvrail's backend builds without NIXL's sources.
//
// What must match the wheel's libnixl.so exactly, and how it was checked (tests/nixl/abi_check.sh
// repeats the checks on the installed wheel):
// - The plugin entry points: extern "C" nixl_plugin_init() returning a NixlBackendPlugin* whose
//   api_version is 1, and nixl_plugin_fini(). libnixl dlopens libplugin_<NAME>.so from
//   $NIXL_PLUGIN_DIR (RTLD_NOW | RTLD_LOCAL).
// - The virtual method order of the engine base class (27 slots after the two destructor
//   entries), read from the vtables in the wheel's libplugin_POSIX.so and libplugin_UCX.so.
// - The data layout of the engine base class (the agent reads initErr and the telemetry vector
//   through inline accessors): backend type at +0x08, custom params at +0x28, telemetry vector
//   at +0x60, its mutex at +0x78, initErr at +0xa0, localAgent at +0xa8, enableTelemetry at
//   +0xc8; read from the inlined base constructor in libplugin_POSIX.so.
// - The init params layout (localAgent +0x00, type +0x20, customParams* +0x40, enableProgTh
//   +0x48, pthrDelay +0x50, syncMode +0x58, enableTelemetry +0x5c).
// - Descriptor lists: {vptr, nixl_mem_t type, std::vector<T>}; a meta descriptor is {addr, len,
//   devId, metadata pointer}; a blob descriptor is {addr, len, devId, std::string metaInfo}.
// - libstdc++'s C++11 string ABI (std::__cxx11::basic_string in every mangled name).
// The class and enum names are NIXL's own: they appear in mangled names and type_info that the
// agent and the plugin share (e.g. a dynamic_cast of an engine), so they are not renamed.
//
// Only what the plugin uses is declared: inline accessors, and virtual methods in their slots.
// Nothing here has a definition in libnixl that the plugin would call, so the plugin does not
// link against NIXL at all.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

// --- Enums and typedefs (nixl_types.h's values) ---------------------------------------------
enum nixl_mem_t { DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG };

enum nixl_xfer_op_t { NIXL_READ, NIXL_WRITE };

enum nixl_status_t {
  NIXL_IN_PROG = 1,
  NIXL_SUCCESS = 0,
  NIXL_ERR_NOT_POSTED = -1,
  NIXL_ERR_INVALID_PARAM = -2,
  NIXL_ERR_BACKEND = -3,
  NIXL_ERR_NOT_FOUND = -4,
  NIXL_ERR_MISMATCH = -5,
  NIXL_ERR_NOT_ALLOWED = -6,
  NIXL_ERR_REPOST_ACTIVE = -7,
  NIXL_ERR_UNKNOWN = -8,
  NIXL_ERR_NOT_SUPPORTED = -9,
  NIXL_ERR_REMOTE_DISCONNECT = -10,
  NIXL_ERR_CANCELED = -11,
  NIXL_ERR_NO_TELEMETRY = -12,
};

enum class nixl_thread_sync_t {
  NIXL_THREAD_SYNC_NONE,
  NIXL_THREAD_SYNC_STRICT,
  NIXL_THREAD_SYNC_RW
};

enum class nixl_cost_t { ANALYTICAL_BACKEND = 0 };

using nixl_backend_t = std::string;
using nixl_blob_t = std::string;
using nixl_mem_list_t = std::vector<nixl_mem_t>;
using nixl_b_params_t = std::unordered_map<std::string, std::string>;
using nixl_query_resp_t = std::optional<nixl_b_params_t>;
using nixlMemViewH = void*;
// (remote agent name, message) pairs handed to the agent by getNotifs.
using notif_list_t = std::vector<std::pair<std::string, std::string>>;

// The agent's optional arguments; only passed through (by pointer) to estimateXferCost.
struct nixlAgentOptionalArgs;
using nixl_opt_args_t = nixlAgentOptionalArgs;

// --- Descriptors (nixl_descriptors.h) ---------------------------------------------------------
class nixlBasicDesc {
 public:
  uintptr_t addr = 0;
  size_t len = 0;
  uint64_t devId = 0;
};

class nixlBlobDesc : public nixlBasicDesc {
 public:
  nixl_blob_t metaInfo;
};

class nixlBackendMD;

class nixlMetaDesc : public nixlBasicDesc {
 public:
  nixlBackendMD* metadataP = nullptr;
};

struct nixlRemoteMetaDesc : public nixlMetaDesc {
  std::string remoteAgent;
};

// Read-only use: the agent builds the lists; the plugin reads them through inline accessors.
template <class T>
class nixlDescList {
 public:
  virtual ~nixlDescList() = default;
  nixl_mem_t getType() const { return type; }
  int descCount() const { return static_cast<int>(descs.size()); }
  const T& operator[](size_t index) const { return descs[index]; }

 protected:
  nixl_mem_t type;
  std::vector<T> descs;
};

using nixl_meta_dlist_t = nixlDescList<nixlMetaDesc>;
using nixl_remote_meta_dlist_t = nixlDescList<nixlRemoteMetaDesc>;
using nixl_reg_dlist_t = nixlDescList<nixlBlobDesc>;

// --- Backend auxiliaries (backend_aux.h) ------------------------------------------------------
struct nixlBackendOptionalArgs {
  nixl_blob_t notifMsg;  // the notification a postXfer asks for, when hasNotif
  bool hasNotif = false;
  nixl_blob_t customParam;
};
using nixl_opt_b_args_t = nixlBackendOptionalArgs;

class nixlBackendInitParams {
 public:
  std::string localAgent;
  nixl_backend_t type;
  nixl_b_params_t* customParams = nullptr;
  bool enableProgTh = false;
  uint64_t pthrDelay = 0;  // microseconds
  nixl_thread_sync_t syncMode;
  bool enableTelemetry_ = false;
};

// Base of a backend's transfer handle (the agent only stores and passes the pointer).
class nixlBackendReqH {
 public:
  nixlBackendReqH() = default;
  virtual ~nixlBackendReqH() = default;
};

// Base of a backend's per-registration metadata.
class nixlBackendMD {
 public:
  explicit nixlBackendMD(bool is_private) : isPrivateMD(is_private) {}
  virtual ~nixlBackendMD() = default;

 protected:
  bool isPrivateMD;
};

// An element of the telemetry vector; the plugin never adds one (it keeps the vector empty), it
// only has to give the vector the right type.
struct nixlTelemetryEvent {
  int eventType;
  uint64_t value;
};

// --- The engine base class (backend_engine.h) -------------------------------------------------
// Thread contract: as NIXL's - the agent may call the const transfer methods (prepXfer, postXfer,
// checkXfer, releaseReqH, genNotif) from several threads at once; an implementation guards its
// own shared state.
class nixlBackendEngine {
 private:
  nixl_backend_t backendType;
  nixl_b_params_t customParams;
  std::vector<nixlTelemetryEvent> telemetryEvents_;
  std::mutex telemetryEventsMutex_;

 protected:
  bool initErr = false;
  const std::string localAgent;
  const bool enableTelemetry_;

  nixl_status_t getInitParam(const std::string& key, std::string& value) const {
    const auto iter = customParams.find(key);
    if (iter == customParams.end()) return NIXL_ERR_INVALID_PARAM;
    value = iter->second;
    return NIXL_SUCCESS;
  }

 public:
  explicit nixlBackendEngine(const nixlBackendInitParams* init_params)
      : backendType(init_params->type),
        customParams(*init_params->customParams),
        localAgent(init_params->localAgent),
        enableTelemetry_(init_params->enableTelemetry_) {}
  nixlBackendEngine(const nixlBackendEngine&) = delete;
  nixlBackendEngine& operator=(const nixlBackendEngine&) = delete;

  // Slots 0-1.
  virtual ~nixlBackendEngine() = default;

  bool getInitErr() const noexcept { return initErr; }
  const nixl_backend_t& getType() const noexcept { return backendType; }
  const nixl_b_params_t& getCustomParams() const noexcept { return customParams; }

  // Slots 2-5.
  virtual bool supportsRemote() const = 0;
  virtual bool supportsLocal() const = 0;
  virtual bool supportsNotif() const = 0;
  virtual nixl_mem_list_t getSupportedMems() const = 0;

  // Slots 6-14.
  virtual nixl_status_t registerMem(const nixlBlobDesc& mem, const nixl_mem_t& nixl_mem,
                                    nixlBackendMD*& out) = 0;
  virtual nixl_status_t deregisterMem(nixlBackendMD* meta) = 0;
  virtual nixl_status_t connect(const std::string& remote_agent) = 0;
  virtual nixl_status_t disconnect(const std::string& remote_agent) = 0;
  virtual nixl_status_t unloadMD(nixlBackendMD* input) = 0;
  virtual nixl_status_t prepXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                                 const nixl_meta_dlist_t& remote, const std::string& remote_agent,
                                 nixlBackendReqH*& handle,
                                 const nixl_opt_b_args_t* opt_args = nullptr) const = 0;
  virtual nixl_status_t postXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                                 const nixl_meta_dlist_t& remote, const std::string& remote_agent,
                                 nixlBackendReqH*& handle,
                                 const nixl_opt_b_args_t* opt_args = nullptr) const = 0;
  virtual nixl_status_t checkXfer(nixlBackendReqH* handle) const = 0;
  virtual nixl_status_t releaseReqH(nixlBackendReqH* handle) const = 0;

  // Slots 15-17: memory views (device-initiated APIs); not offered.
  virtual nixl_status_t prepMemView(const nixl_remote_meta_dlist_t&, nixlMemViewH&,
                                    const nixl_opt_b_args_t* = nullptr) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }
  virtual nixl_status_t prepMemView(const nixl_meta_dlist_t&, nixlMemViewH&,
                                    const nixl_opt_b_args_t* = nullptr) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }
  virtual void releaseMemView(nixlMemViewH) const {}

  // Slots 18-21: metadata exchange with remote agents.
  virtual nixl_status_t getPublicData(const nixlBackendMD*, std::string&) const {
    return NIXL_ERR_BACKEND;
  }
  virtual nixl_status_t getConnInfo(std::string&) const { return NIXL_ERR_BACKEND; }
  virtual nixl_status_t loadRemoteConnInfo(const std::string&, const std::string&) {
    return NIXL_ERR_BACKEND;
  }
  virtual nixl_status_t loadRemoteMD(const nixlBlobDesc&, const nixl_mem_t&, const std::string&,
                                     nixlBackendMD*&) {
    return NIXL_ERR_BACKEND;
  }

  // Slot 22: local (same agent) transfers.
  virtual nixl_status_t loadLocalMD(nixlBackendMD*, nixlBackendMD*&) { return NIXL_ERR_BACKEND; }

  // Slots 23-24: notifications.
  virtual nixl_status_t getNotifs(notif_list_t&) { return NIXL_ERR_BACKEND; }
  virtual nixl_status_t genNotif(const std::string&, const std::string&) const {
    return NIXL_ERR_BACKEND;
  }

  // Slots 25-26: optional queries.
  virtual nixl_status_t queryMem(const nixl_reg_dlist_t&, std::vector<nixl_query_resp_t>&) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }
  virtual nixl_status_t estimateXferCost(const nixl_xfer_op_t&, const nixl_meta_dlist_t&,
                                         const nixl_meta_dlist_t&, const std::string&,
                                         nixlBackendReqH* const&, std::chrono::microseconds&,
                                         std::chrono::microseconds&, nixl_cost_t&,
                                         const nixl_opt_args_t* = nullptr) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }
};

// --- The plugin record (backend_plugin.h) -----------------------------------------------------
inline constexpr int kNixlPluginApiVersion = 1;

class nixlBackendPlugin {
 public:
  int api_version;
  nixlBackendEngine* (*create_engine)(const nixlBackendInitParams* init_params);
  void (*destroy_engine)(nixlBackendEngine* engine);
  const char* (*get_plugin_name)();
  const char* (*get_plugin_version)();
  nixl_b_params_t (*get_backend_options)();
  nixl_mem_list_t (*get_backend_mems)();
};

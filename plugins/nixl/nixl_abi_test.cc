// nixl_abi.h against the facts read from the nixl-cu13 1.5.1 wheel's binaries (the offsets its
// inlined base constructor writes, the vtable slots of its engines; tests/nixl/abi_check.py reads
// the same slots from the installed wheel).
#include "plugins/nixl/nixl_abi.h"

#include <cstring>

#include "catch2/catch.hpp"

namespace {

// Exposes the protected fields' addresses.
class Probe : public nixlBackendEngine {
 public:
  using nixlBackendEngine::nixlBackendEngine;
  bool supportsRemote() const override { return true; }
  bool supportsLocal() const override { return true; }
  bool supportsNotif() const override { return true; }
  nixl_mem_list_t getSupportedMems() const override { return {}; }
  nixl_status_t registerMem(const nixlBlobDesc&, const nixl_mem_t&, nixlBackendMD*&) override {
    return NIXL_SUCCESS;
  }
  nixl_status_t deregisterMem(nixlBackendMD*) override { return NIXL_SUCCESS; }
  nixl_status_t connect(const std::string&) override { return NIXL_SUCCESS; }
  nixl_status_t disconnect(const std::string&) override { return NIXL_SUCCESS; }
  nixl_status_t unloadMD(nixlBackendMD*) override { return NIXL_SUCCESS; }
  nixl_status_t prepXfer(const nixl_xfer_op_t&, const nixl_meta_dlist_t&, const nixl_meta_dlist_t&,
                         const std::string&, nixlBackendReqH*&,
                         const nixl_opt_b_args_t*) const override {
    return NIXL_SUCCESS;
  }
  nixl_status_t postXfer(const nixl_xfer_op_t&, const nixl_meta_dlist_t&, const nixl_meta_dlist_t&,
                         const std::string&, nixlBackendReqH*&,
                         const nixl_opt_b_args_t*) const override {
    return NIXL_SUCCESS;
  }
  nixl_status_t checkXfer(nixlBackendReqH*) const override { return NIXL_SUCCESS; }
  nixl_status_t releaseReqH(nixlBackendReqH*) const override { return NIXL_SUCCESS; }

  size_t Offset(const void* field) const {
    return static_cast<size_t>(static_cast<const char*>(field) -
                               reinterpret_cast<const char*>(this));
  }
  size_t InitErrOffset() const { return Offset(&initErr); }
  size_t LocalAgentOffset() const { return Offset(&localAgent); }
  size_t TelemetryFlagOffset() const { return Offset(&enableTelemetry_); }
  size_t TypeOffset() const { return Offset(&getType()); }
  size_t ParamsOffset() const { return Offset(&getCustomParams()); }
};

// The Itanium C++ ABI's pointer to a virtual member function: 1 + the byte offset of its slot
// from the vtable's address point.
template <typename F>
size_t Slot(F member) {
  uintptr_t raw = 0;
  static_assert(sizeof(F) >= sizeof(raw));
  std::memcpy(&raw, &member, sizeof(raw));
  REQUIRE((raw & 1) == 1);
  return (raw - 1) / sizeof(void*);
}

TEST_CASE("the engine base's data layout is the wheel's") {
  nixl_b_params_t params{{"k", "v"}};
  nixlBackendInitParams init;
  init.localAgent = "agent";
  init.type = "KVRAIL";
  init.customParams = &params;
  Probe probe(&init);
  CHECK(probe.TypeOffset() == 0x08);
  CHECK(probe.ParamsOffset() == 0x28);
  CHECK(probe.InitErrOffset() == 0xa0);
  CHECK(probe.LocalAgentOffset() == 0xa8);
  CHECK(probe.TelemetryFlagOffset() == 0xc8);
  CHECK(probe.getCustomParams().at("k") == "v");
}

TEST_CASE("the init params' layout is the wheel's") {
  nixlBackendInitParams init;
  const auto* base = reinterpret_cast<const char*>(&init);
  CHECK(reinterpret_cast<const char*>(&init.type) - base == 0x20);
  CHECK(reinterpret_cast<const char*>(&init.customParams) - base == 0x40);
  CHECK(reinterpret_cast<const char*>(&init.enableProgTh) - base == 0x48);
  CHECK(reinterpret_cast<const char*>(&init.pthrDelay) - base == 0x50);
  CHECK(reinterpret_cast<const char*>(&init.syncMode) - base == 0x58);
  CHECK(reinterpret_cast<const char*>(&init.enableTelemetry_) - base == 0x5c);
}

TEST_CASE("descriptors and lists have the wheel's layout") {
  CHECK(sizeof(nixlMetaDesc) == 32);
  CHECK(offsetof(nixlMetaDesc, metadataP) == 24);
  CHECK(sizeof(nixlBlobDesc) == 24 + sizeof(std::string));
  CHECK(sizeof(nixlDescList<nixlMetaDesc>) == 8 + 8 + sizeof(std::vector<nixlMetaDesc>));
  CHECK(sizeof(nixlBackendOptionalArgs) == 2 * sizeof(std::string) + 8);
}

TEST_CASE("virtual methods sit in the wheel's slots (as tests/nixl/abi_check.py reads them)") {
  using E = nixlBackendEngine;
  CHECK(Slot(&E::supportsRemote) == 2);
  CHECK(Slot(&E::getSupportedMems) == 5);
  CHECK(Slot(&E::registerMem) == 6);
  CHECK(Slot(&E::deregisterMem) == 7);
  CHECK(Slot(&E::unloadMD) == 10);
  CHECK(Slot(&E::prepXfer) == 11);
  CHECK(Slot(&E::postXfer) == 12);
  CHECK(Slot(&E::checkXfer) == 13);
  CHECK(Slot(&E::releaseReqH) == 14);
  CHECK(Slot(&E::releaseMemView) == 17);
  CHECK(Slot(&E::getPublicData) == 18);
  CHECK(Slot(&E::getConnInfo) == 19);
  CHECK(Slot(&E::loadRemoteConnInfo) == 20);
  CHECK(Slot(&E::loadRemoteMD) == 21);
  CHECK(Slot(&E::loadLocalMD) == 22);
  CHECK(Slot(&E::getNotifs) == 23);
  CHECK(Slot(&E::genNotif) == 24);
  CHECK(Slot(&E::queryMem) == 25);
  CHECK(Slot(&E::estimateXferCost) == 26);
}

TEST_CASE("the plugin record has the agent's field order") {
  CHECK(offsetof(nixlBackendPlugin, create_engine) == 8);
  CHECK(offsetof(nixlBackendPlugin, get_backend_mems) == 48);
  CHECK(kNixlPluginApiVersion == 1);
}

}  // namespace

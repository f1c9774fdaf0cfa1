// Test helpers over the machine descriptions in topology/fixtures (tests only; the library
// //topology:test_fixtures carries //topology:fixtures as data). Thread contract: pure
// functions, any thread.
#pragma once

#include <catch2/catch.hpp>
#include <string>

#include "topology/topology.h"

namespace kvrail::topology::testing {

// The fixture topology/fixtures/<name>.textproto; fails the test when it does not load.
inline v1::TopologyDesc FixtureDesc(const std::string& name) {
  auto desc = LoadTopologyFile("topology/fixtures/" + name + ".textproto");
  INFO(desc.status().ToString());
  REQUIRE(desc.ok());
  return *desc;
}

// The desc without the NIC `name` (and its PCI function): a node whose GPU lost its own NIC.
// Fails the test when the desc has no such NIC.
inline v1::TopologyDesc WithoutNic(v1::TopologyDesc desc, const std::string& name) {
  std::string bus;
  for (int i = 0; i < desc.nics_size(); ++i) {
    if (desc.nics(i).name() == name) {
      bus = desc.nics(i).pci_bus_id();
      desc.mutable_nics()->DeleteSubrange(i, 1);
      break;
    }
  }
  REQUIRE(!bus.empty());
  for (int i = 0; i < desc.pci_devices_size(); ++i) {
    if (desc.pci_devices(i).bus_id() == bus) {
      desc.mutable_pci_devices()->DeleteSubrange(i, 1);
      break;
    }
  }
  return desc;
}

}  // namespace kvrail::topology::testing

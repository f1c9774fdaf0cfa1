// Replay: textproto round trips, clear errors, JSON.
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>

#include "google/protobuf/util/message_differencer.h"
#include "topology/topology.h"

namespace kvrail::topology {
namespace {

TEST_CASE("every fixture round-trips through DumpTopology") {
  for (const char* name : {"dgx_h100", "p5_48xlarge", "pcie_4gpu", "pcie_8gpu_1nic", "h200_1gpu",
                           "h200_2gpu", "cpu_only"}) {
    INFO(name);
    absl::StatusOr<TopologyDesc> desc =
        LoadTopologyFile(std::string("topology/fixtures/") + name + ".textproto");
    REQUIRE(desc.ok());
    absl::StatusOr<TopologyDesc> again = ParseTopology(DumpTopology(*desc), "dump");
    REQUIRE(again.ok());
    REQUIRE(google::protobuf::util::MessageDifferencer::Equals(*desc, *again));
    REQUIRE(DumpTopology(*again) == DumpTopology(*desc));
  }
}

TEST_CASE("a syntax error names the file, line and column") {
  absl::StatusOr<TopologyDesc> desc =
      ParseTopology("hostname: \"x\"\ngpus {\n  index: 0\n  bogus_field: 3\n}\n", "bad.textproto");
  REQUIRE(absl::IsInvalidArgument(desc.status()));
  INFO(desc.status().message());
  REQUIRE(std::string(desc.status().message()).rfind("bad.textproto:4:", 0) == 0);
  REQUIRE(std::string(desc.status().message()).find("bogus_field") != std::string::npos);
}

TEST_CASE("a missing file is NotFound and named") {
  absl::StatusOr<TopologyDesc> desc = LoadTopologyFile("topology/fixtures/no_such.textproto");
  REQUIRE(absl::IsNotFound(desc.status()));
  REQUIRE(std::string(desc.status().message()).find("no_such.textproto") != std::string::npos);
}

TEST_CASE("inconsistent descs are rejected with the file name") {
  REQUIRE(absl::IsInvalidArgument(ParseTopology("gpus { index: 1 }", "f.textproto").status()));
  REQUIRE(absl::IsInvalidArgument(
      ParseTopology("gpus { index: 0 } gpu_links { gpu_a: 0 gpu_b: 1 }", "f").status()));
  REQUIRE(absl::IsInvalidArgument(
      ParseTopology("nics { name: \"a\" } nics { name: \"a\" }", "f").status()));
  absl::Status s =
      ParseTopology("pci_devices { bus_id: \"0000:01:00.0\" parent_bus_id: \"0000:00:01.0\" }",
                    "tree.textproto")
          .status();
  REQUIRE(absl::IsInvalidArgument(s));
  REQUIRE(std::string(s.message()).find("tree.textproto") != std::string::npos);
}

TEST_CASE("TopologyToJson holds both messages with proto field names") {
  absl::StatusOr<TopologyDesc> desc = LoadTopologyFile("topology/fixtures/h200_2gpu.textproto");
  REQUIRE(desc.ok());
  absl::StatusOr<std::string> json = TopologyToJson(*desc, ComputeGraph(*desc));
  REQUIRE(json.ok());
  REQUIRE(json->find("\"desc\"") != std::string::npos);
  REQUIRE(json->find("\"graph\"") != std::string::npos);
  REQUIRE(json->find("\"PATH_NV\"") != std::string::npos);
  REQUIRE(json->find("\"nvlink_count\": 18") != std::string::npos);
  REQUIRE(json->find("TRANSFER_PATH_NVLINK_P2P") != std::string::npos);
}

}  // namespace
}  // namespace kvrail::topology

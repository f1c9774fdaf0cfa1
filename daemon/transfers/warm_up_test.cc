// The first transfer: making the manager builds what the first Submit would build after
// its "submitted" stamp (the generated descriptors behind v1::Path_Name, ~350-450 us on the
// build machine). Alone in its binary: nothing else in the process may have built them first.
#include <catch2/catch.hpp>

#include "daemon/transfers/manager_fixture.h"
#include "google/protobuf/descriptor.h"

namespace kvrail::transfers::testing {
namespace {

bool TransferProtoBuilt() {
  return google::protobuf::DescriptorPool::generated_pool()->InternalIsFileLoaded(
      "proto/kvrail/v1/transfer.proto");
}

TEST_CASE("making the transfer manager builds the descriptors the first Submit would build") {
  REQUIRE_FALSE(TransferProtoBuilt());  // the test means something only from a cold process
  ManagerFixture f;
  CHECK(TransferProtoBuilt());
  // And the first transfer still runs as any other.
  const uint64_t id = f.Submit(2);
  f.engine.RunAll();
  CHECK(f.Get(id).state() == v1::TRANSFER_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace kvrail::transfers::testing

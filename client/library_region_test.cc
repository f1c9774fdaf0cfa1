// Client::ListRegions leaves library regions out by RegionSpec.library_region (field 150), never by
// name (a tenant's region named "client block tables" is listed). Against an older kvraild that
// does not know field 150 the client's own block-table region is still left out: that daemon
// keeps the spec it was given, the unknown field included (C++ protobuf keeps unknown fields in
// proto3 since 3.5), and answers ListRegions with it (RegionInfoOf copies the spec). Here the
// older daemon's view of region.proto (RegionSpec without field 150) carries the spec through.
#include <catch2/catch.hpp>
#include <memory>

#include "client/kvrail_client.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "proto/kvrail/v1/region.pb.h"

namespace kvrail::client {
namespace {

namespace pb = google::protobuf;

// Adds `file` and its imports to `pool` as an older daemon knew them: RegionSpec without 150.
const pb::FileDescriptor* AddWithoutLibraryRegion(const pb::FileDescriptor* file,
                                                  pb::DescriptorPool* pool) {
  if (const pb::FileDescriptor* there = pool->FindFileByName(file->name())) return there;
  for (int i = 0; i < file->dependency_count(); ++i) {
    if (AddWithoutLibraryRegion(file->dependency(i), pool) == nullptr) return nullptr;
  }
  pb::FileDescriptorProto proto;
  file->CopyTo(&proto);
  for (pb::DescriptorProto& message : *proto.mutable_message_type()) {
    if (message.name() != "RegionSpec") continue;
    auto* fields = message.mutable_field();
    for (int i = fields->size() - 1; i >= 0; --i) {
      if (fields->Get(i).number() == 150) fields->DeleteSubrange(i, 1);
    }
  }
  return pool->BuildFile(proto);
}

TEST_CASE("an older daemon that does not know library_region still lists the client's flag") {
  pb::DescriptorPool pool;
  REQUIRE(AddWithoutLibraryRegion(v1::RegionInfo::descriptor()->file(), &pool) != nullptr);
  const pb::Descriptor* old_spec = pool.FindMessageTypeByName("kvrail.v1.RegionSpec");
  const pb::Descriptor* old_info = pool.FindMessageTypeByName("kvrail.v1.RegionInfo");
  REQUIRE(old_spec != nullptr);
  REQUIRE(old_info != nullptr);
  REQUIRE(old_spec->FindFieldByNumber(150) == nullptr);
  pb::DynamicMessageFactory factory(&pool);

  // The block-table region's spec as the client registers it (Client::PrepareTableBuffer).
  v1::RegionSpec sent;
  sent.set_name(kBlockTableRegionName);
  sent.set_library_region(true);
  sent.set_memory_kind(v1::MEMORY_KIND_HOST);
  sent.set_size_bytes(kBlockTableBufferBytes);
  sent.mutable_bytes();
  // The older daemon parses it (150 is an unknown field there) and keeps it as the region's spec,
  std::unique_ptr<pb::Message> kept(factory.GetPrototype(old_spec)->New());
  REQUIRE(kept->ParseFromString(sent.SerializeAsString()));
  CHECK(kept->GetReflection()->GetUnknownFields(*kept).field_count() == 1);
  // then answers ListRegions with RegionInfo.spec copied from it.
  std::unique_ptr<pb::Message> info(factory.GetPrototype(old_info)->New());
  const pb::FieldDescriptor* spec_field = old_info->FindFieldByName("spec");
  REQUIRE(spec_field != nullptr);
  info->GetReflection()->MutableMessage(info.get(), spec_field, &factory)->CopyFrom(*kept);

  v1::RegionInfo listed;
  REQUIRE(listed.ParseFromString(info->SerializeAsString()));
  CHECK(listed.spec().library_region());  // what ListRegions leaves out
  CHECK(listed.spec().name() == kBlockTableRegionName);
}

}  // namespace
}  // namespace kvrail::client

#include "proto/kvrail/v1/spec_copy.h"

#include <google/protobuf/util/message_differencer.h>

#include <catch2/catch.hpp>

namespace kvrail::v1 {
namespace {

// Sets every singular scalar/string/enum field of `m` (recursing into messages) to a non-default
// value, so a field the copier forgets shows as a difference.
void FillAll(google::protobuf::Message* m, int depth = 0) {
  using google::protobuf::FieldDescriptor;
  const auto* d = m->GetDescriptor();
  const auto* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_UINT32) r->AddUInt32(m, f, 7 + i);
      continue;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(m, f, 11 + i);
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(m, f, 1000 + i);
        break;
      case FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(m, f, 3 + i);
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        r->SetInt64(m, f, 5 + i);
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(m, f, true);
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        r->SetString(m, f, "x" + f->name());
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        r->SetEnum(m, f, f->enum_type()->value(f->enum_type()->value_count() - 1));
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (depth < 2) FillAll(r->MutableMessage(m, f), depth + 1);
        break;
      default:
        break;
    }
  }
}

TEST_CASE("WithoutBlockTables keeps every field but the block tables") {
  TransferSpec full;
  FillAll(&full);
  REQUIRE(full.src().block_ids_size() == 1);
  REQUIRE(!full.src().block_ids_le32().empty());
  REQUIRE(full.src().has_block_table());
  const TransferSpec light = WithoutBlockTables(full);
  CHECK(light.src().block_ids_size() == 0);
  CHECK(light.dst().block_ids_le32().empty());
  CHECK(!light.dst().has_block_table());
  TransferSpec expected = full;
  for (TransferEndpoint* ep : {expected.mutable_src(), expected.mutable_dst()}) {
    ep->clear_block_ids();
    ep->clear_block_ids_le32();
    ep->clear_block_table();
  }
  std::string diff;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  CHECK(differ.Compare(expected, light));
  INFO(diff);
  CHECK(diff.empty());
}

TEST_CASE("WithoutBlockTables of an empty spec is empty") {
  CHECK(WithoutBlockTables(TransferSpec()).ByteSizeLong() == 0);
}

}  // namespace
}  // namespace kvrail::v1

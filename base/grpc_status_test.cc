// ToGrpcStatus / FromGrpcStatus keep the code number and the message, both ways, for every code.
#include "base/grpc_status.h"

#include <catch2/catch.hpp>
#include <string>

namespace kvrail {
namespace {

// Moved here from tools/kvrail/block_list_test.cc with the conversion itself.
TEST_CASE("FromGrpcStatus keeps code number and message") {
  auto s = FromGrpcStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "spec.dst: bad"));
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "spec.dst: bad");
  CHECK(FromGrpcStatus(grpc::Status::OK).ok());
  CHECK(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "x")).code() ==
        absl::StatusCode::kUnavailable);
}

TEST_CASE("ToGrpcStatus keeps code number and message") {
  const grpc::Status s = ToGrpcStatus(absl::FailedPreconditionError("spec.dst.node_id: 'b'"));
  CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(s.error_message() == "spec.dst.node_id: 'b'");
  CHECK(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST_CASE("every code survives the round trip both ways") {
  for (int code = 1; code <= static_cast<int>(absl::StatusCode::kUnauthenticated); ++code) {
    INFO("code " << code);
    const absl::Status status(static_cast<absl::StatusCode>(code),
                              "message " + std::to_string(code));
    const grpc::Status wire = ToGrpcStatus(status);
    CHECK(static_cast<int>(wire.error_code()) == code);
    CHECK(wire.error_message() == "message " + std::to_string(code));
    CHECK(FromGrpcStatus(wire) == status);
    const grpc::Status direct(static_cast<grpc::StatusCode>(code), "m");
    CHECK(ToGrpcStatus(FromGrpcStatus(direct)).error_code() == direct.error_code());
    CHECK(ToGrpcStatus(FromGrpcStatus(direct)).error_message() == "m");
  }
}

}  // namespace
}  // namespace kvrail

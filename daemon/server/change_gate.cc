#include "daemon/server/change_gate.h"

#include <chrono>
#include <utility>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "spdlog/spdlog.h"
#include "wire/session_wire.h"

namespace kvrail::server {

ChangeGate::Mode ChangeGate::Enter() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](Mode* mode) { return *mode != Mode::kHold; }, &mode_));
  if (mode_ == Mode::kServe) ++running_;
  return mode_;
}

void ChangeGate::Leave() {
  absl::MutexLock lock(&mu_);
  --running_;
}

void ChangeGate::Hold() {
  absl::MutexLock lock(&mu_);
  if (mode_ == Mode::kForward) return;
  mode_ = Mode::kHold;
  mu_.Await(absl::Condition(
      +[](int* running) { return *running == 0; }, &running_));
}

void ChangeGate::Resume() {
  absl::MutexLock lock(&mu_);
  if (mode_ == Mode::kHold) mode_ = Mode::kServe;
}

void ChangeGate::Forward(const std::string& grpc_target) {
  std::shared_ptr<v1::Transfer::Stub> stub;
  if (!grpc_target.empty()) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);
    args.SetMaxSendMessageSize(256 << 20);
    auto channel = grpc::CreateCustomChannel(grpc_target, grpc::InsecureChannelCredentials(), args);
    // Connected now: the successor's socket is about to be renamed into place, and this
    // connection is what stays.
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(2))) {
      spdlog::warn(
          "handover: cannot reach the successor at {}; changes still arriving here are "
          "refused",
          grpc_target);
    }
    stub = v1::Transfer::NewStub(channel);
  }
  absl::MutexLock lock(&mu_);
  successor_ = std::move(stub);
  mode_ = Mode::kForward;
}

bool ChangeGate::forwarding() {
  absl::MutexLock lock(&mu_);
  return mode_ == Mode::kForward;
}

v1::Transfer::Stub* ChangeGate::successor() {
  absl::MutexLock lock(&mu_);
  return successor_.get();
}

void PrepareForwardedCall(const grpc::ServerContextBase& context, grpc::ClientContext* out) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(wire::kSessionMetadataKey);
  if (it != metadata.end()) {
    out->AddMetadata(wire::kSessionMetadataKey, std::string(it->second.data(), it->second.size()));
  }
  out->set_deadline(context.deadline());
}

}  // namespace kvrail::server

// Test support for the fabric's peer tests (testonly): a Peer service that only counts the hellos
// it gets (and refuses them), and that service listening on a loopback port. Thread contract:
// CountingPeer is called on gRPC's threads (the count is atomic); CountingPeerServer is built and
// ended on one thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "proto/kvrail/peer/v1/peer.grpc.pb.h"

namespace kvrail::fabric::testing {

namespace peer_v1 = ::kvrail::peer::v1;

// A minimal Peer service that counts the hellos it gets (and refuses them).
class CountingPeer final : public peer_v1::Peer::Service {
 public:
  grpc::Status Hello(grpc::ServerContext*, const peer_v1::HelloRequest*,
                     peer_v1::HelloResponse*) override {
    ++hellos;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "counting only");
  }
  std::atomic<int> hellos{0};
};

// A CountingPeer on 127.0.0.1, port 0 (`address` names the port it got); shut down when destroyed.
struct CountingPeerServer {
  CountingPeer service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  CountingPeerServer() {
    int port = 0;
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    server = b.BuildAndStart();
    REQUIRE((server != nullptr && port > 0));
    address = absl::StrCat("127.0.0.1:", port);
  }
  ~CountingPeerServer() { server->Shutdown(); }
};

}  // namespace kvrail::fabric::testing

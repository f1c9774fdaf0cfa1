#include "tests/tls/peer_calls.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/time/clock.h"

namespace kvrail::testing {

namespace peer_v1 = ::kvrail::peer::v1;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

NsDaemonOptions TlsDaemonOptions(TestCa* ca) {
  NsDaemonOptions options;
  options.nics = 1;
  options.ca = ca;
  return options;
}

std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address, TestCa& ca,
                                          const std::string& server_node, TestCa* issuer,
                                          const std::string& cert) {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ReadFile(ca.ca_file());
  if (issuer != nullptr) {
    auto issued = issuer->Issue(cert);
    REQUIRE(issued.ok());
    options.pem_cert_chain = ReadFile(issued->cert_file);
    options.pem_private_key = ReadFile(issued->key_file);
  }
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(server_node);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(options), args);
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return context;
}

bool Says(const grpc::Status& status, grpc::StatusCode code, const std::string& text) {
  const bool says =
      status.error_code() == code && status.error_message().find(text) != std::string::npos;
  if (!says) {
    UNSCOPED_INFO("code " << status.error_code() << ": " << status.error_message()
                          << " (expected code " << code << " and '" << text << "')");
  }
  return says;
}

peer_v1::HelloRequest HelloAs(const std::string& node) {
  peer_v1::HelloRequest request;
  peer_v1::PeerHello* hello = request.mutable_hello();
  hello->set_version(1);
  hello->set_node_id(node);
  hello->set_boot_id(12345);
  hello->set_provider("tcp;ofi_rxm");
  hello->set_slots(8);
  hello->set_slot_bytes(1 << 20);
  peer_v1::PeerNic* nic = hello->add_nics();
  nic->set_name("nic0");
  nic->set_fabric_address(std::string(16, '\0'));
  return request;
}

bool PeerUp(NsDaemon& node, const std::string& peer, absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  do {
    auto peers = node.client->ListPeers();
    if (peers.ok()) {
      for (const auto& p : peers->peers()) {
        if (p.node_id() == peer && p.state() == v1::PEER_STATE_UP) return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (absl::Now() < until);
  return false;
}

}  // namespace kvrail::testing

#include "daemon/server/caller.h"

#include <optional>
#include <string>
#include <utility>

#include "wire/session_wire.h"

namespace kvrail::server {

absl::StatusOr<sessions::Caller> CallerFromMetadata(const grpc::ServerContextBase& context,
                                                    const sessions::SessionTable& sessions) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(wire::kSessionMetadataKey);
  if (it == metadata.end()) return sessions::Caller{};
  const absl::string_view value(it->second.data(), it->second.size());
  std::optional<std::pair<uint64_t, std::string>> parsed = wire::ParseSessionMetadata(value);
  if (!parsed.has_value()) {
    return absl::UnauthenticatedError("kvrail-session: not \"<session id>.<secret>\"");
  }
  return sessions.Authenticate(parsed->first, parsed->second);
}

bool IsLocal(const grpc::ServerContextBase& context) {
  return context.peer().rfind("unix:", 0) == 0;
}

}  // namespace kvrail::server

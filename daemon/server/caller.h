// Who is calling a gRPC service of kvraild (docs/security.md): the session a call's
// `kvrail-session` metadata names (wire/session_wire.h), checked against the session table.
// Used by the Transfer and Admin services.
#pragma once

#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"
#include "daemon/sessions/sessions.h"

namespace kvrail::server {

// Anonymous (session 0) without the metadata; UNAUTHENTICATED when it is malformed or names no
// open session with that secret. Thread-safe.
absl::StatusOr<sessions::Caller> CallerFromMetadata(const grpc::ServerContextBase& context,
                                                    const sessions::SessionTable& sessions);

// Whether the call arrived on a unix socket (gRPC's peer "unix:...").
bool IsLocal(const grpc::ServerContextBase& context);

}  // namespace kvrail::server

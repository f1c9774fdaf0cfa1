// Copies of a TransferSpec without its block tables, and error messages renamed between table
// encodings. A large transfer's tables are megabytes
// (262k ids = 1 MiB per side) and live in the plan once accepted; copying them again for a record
// or a request costs page faults as much as bytes. Pure; thread-compatible.
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::v1 {

// `spec` with src/dst block_ids, block_ids_le32 and block_table left out; every other field kept.
TransferSpec WithoutBlockTables(const TransferSpec& spec);

// An error message about field `from` ("spec.src.block_ids_le32[3]: ...") rewritten to name `to`
// instead, for layers that changed a table's encoding on the caller's behalf; other messages are
// returned as they are.
std::string RenameField(absl::string_view message, absl::string_view from, absl::string_view to);

}  // namespace kvrail::v1

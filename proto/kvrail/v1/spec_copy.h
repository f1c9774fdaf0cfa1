// Copies of a TransferSpec without its block tables. A large transfer's tables are megabytes
// (262k ids = 1 MiB per side) and live in the plan once accepted; copying them again for a record
// or a request costs page faults as much as bytes. Pure; thread-compatible.
#pragma once

#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::v1 {

// `spec` with src/dst block_ids, block_ids_le32 and block_table left out; every other field kept.
TransferSpec WithoutBlockTables(const TransferSpec& spec);

}  // namespace kvrail::v1

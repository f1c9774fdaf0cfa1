// How much of a transfer's status an end's listener is given (TransferManager::WhenEnded,
// Record::WhenEnded, Options::on_finished). Building the whole status copies the spec (block
// ids, labels, the notification) at every end, on the thread that ends the transfer: for a small
// host transfer run inline that is the admitting thread, before the submit is acknowledged.
#pragma once

namespace kvrail::transfers {

enum class StatusDetail {
  // Everything Get answers: the spec, path_reason, nics and link included.
  kWhole,
  // The end: transfer_id, state, error_code and error_message, bytes and tiles (total, done),
  // layers_done, path, engine, the digest when the spec asked for one, and the received,
  // submitted, started and finished times; of the spec only its priority. What a completion
  // queue's entry, the metrics and the log line read.
  kEnd,
};

}  // namespace kvrail::transfers

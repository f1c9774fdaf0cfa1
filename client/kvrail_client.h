// kvrail client library: talks to the node's kvraild over gRPC (unix socket or TCP) and shares
// host memory with it through the session socket (wire/session_wire.h has that protocol). This is
// the library's one public header.
//
// Typical use (a prefill process exporting its KV pool):
//   KVRAIL_ASSIGN_OR_RETURN(auto client, Client::Connect(DefaultTarget()));
//   KVRAIL_ASSIGN_OR_RETURN(auto pool, client->CreateHostBuffer(bytes));
//   RegionSpec spec; *spec.mutable_paged_kv() = layout;
//   KVRAIL_ASSIGN_OR_RETURN(RegionInfo region, client->RegisterHostBuffer(*pool, spec));
// The region lives as long as `client` (its session socket) does, or until UnregisterRegion.
//
// Errors: every call returns absl::Status / StatusOr; daemon errors keep their gRPC code number
// and message. Nothing here throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/kvrail/v1/admin.pb.h"
#include "proto/kvrail/v1/region.pb.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::client {

class CompletionTable;

// Socket used when none is given: $KVRAIL_SOCKET if set and non-empty, else kDefaultSocket.
inline constexpr char kDefaultSocket[] = "/run/kvrail/kvrail.sock";
std::string DefaultTarget();

// How a Client works, each field with the environment variable that sets it. FromEnvironment is
// the one place the library reads the environment; Connect(target) applies it, Connect(options)
// takes the caller's. Defaults are the field initializers; an unparsable number keeps them.
struct ClientOptions {
  // KVRAIL_SOCKET (when set and non-empty): the daemon Connect talks to (see Connect).
  std::string target = kDefaultSocket;
  // KVRAIL_SUBMIT_VIA=grpc sets false: transfers within the node are submitted and waited for
  // over gRPC rather than the session socket.
  bool submit_via_session = true;
  // KVRAIL_ANSWER_SPIN_US: how long an exchange on the session socket (SUBMIT, WAIT) polls for
  // its answer before it sleeps (0: never polls); a critical transfer's answer then costs no
  // thread wake-up.
  absl::Duration answer_spin = absl::Microseconds(200);
  // KVRAIL_COMPLETION_QUEUE=0 sets false: no completion queue (waits go by packets / gRPC).
  bool completion_queue = true;
  // KVRAIL_COMPLETION_SPIN_US: how long a wait polls the completion queue before it sleeps
  // (adaptive: halved while the ends take longer). 200 us covers a 16 MiB GPU transfer (~50-70
  // us on one GPU), whose end a 50 us spin slept through; past its first 20 us the spin yields
  // its CPU at each look, and where a yield loses the CPU to a busy thread it stops and the wait
  // sleeps (base/spin_pause.h), so a long one costs a busy machine little.
  absl::Duration completion_spin = absl::Microseconds(200);
  // KVRAIL_COMPLETION_QUEUE_ENTRIES: the queue's capacity (a power of 2, 8..1048576). A
  // transfer whose end finds it full is read the old way.
  uint32_t completion_queue_entries = 4096;
  // KVRAIL_GPU_DONE_WORD=0 sets false: transfers submitted on the session carry no done word
  // (TransferSpec.done_word), so their end is seen only from the daemon's completion. On: a
  // GPU transfer's end is seen from the word its last kernel's stream stores (done, poll and
  // waits read it first), before the daemon's completion arrives.
  bool gpu_done_word = true;
  // KVRAIL_SUBMISSION_QUEUE=0 sets false: no submission queue (submits go by SUBMIT packets).
  // With one, a transfer within the node is written into shared memory kvraild reads (a batch in
  // one write) and answered there, without a socket round trip; a request larger than an entry
  // (4080 bytes serialized) or one that finds the queue full goes by packet.
  bool submission_queue = true;
  // KVRAIL_SUBMISSION_SPIN_US: how long a submit polls for its acknowledgement before it sleeps
  // (adaptive, as completion_spin).
  absl::Duration submission_spin = absl::Microseconds(50);
  // KVRAIL_SUBMISSION_QUEUE_SLOTS: the submission ring's 64-byte slots (a power of 2,
  // 128..1048576; a request takes 1 to 64 of them); a quarter as many requests may be in flight
  // (the acknowledgement ring's entries).
  uint32_t submission_queue_slots = 1024;
  // KVRAIL_BLOCK_TABLE_BUFFER=lazy sets false: the block-table region (see Submit) is made by
  // the first Submit that needs it rather than by Connect.
  bool eager_block_table = true;
  // false: Connect opens no session; until a call needs one (Submit, RegisterRegion, SessionId)
  // the client is anonymous and sees only what anyone may (stats, health): a probe. No
  // environment variable: the caller's choice (the CLI's health).
  bool open_session = true;

  // The defaults with the process environment's overrides.
  static ClientOptions FromEnvironment();
  // The same over `getenv` (a variable's value, or null when unset): a replayable environment.
  static ClientOptions FromEnvironment(const std::function<const char*(const char*)>& getenv);
};

// Host memory that can be shared with kvraild: an anonymous memfd, sized with ftruncate and
// mapped MAP_SHARED, so the daemon's mapping of the same fd sees the same pages.
// Thread contract: the object is immutable after creation; the bytes behind data() may be read
// and written from any thread, with the caller ordering its own accesses against transfers
// (a transfer's completion, observed through Wait/Watch, happens-after the daemon's writes).
class HostBuffer {
 public:
  // `bytes` must be > 0. `name` only labels the memfd (visible in /proc/PID/fd).
  static absl::StatusOr<std::unique_ptr<HostBuffer>> Create(size_t bytes,
                                                            const std::string& name = "kvrail");
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // The memfd; owned by the buffer (close-on-exec). Passed to the daemon by RegisterHostBuffer.
  int fd() const { return fd_; }

 private:
  HostBuffer(int fd, uint8_t* data, size_t size) : fd_(fd), data_(data), size_(size) {}
  const int fd_;
  uint8_t* const data_;
  const size_t size_;
};

// The name of the host region a client library registers for large block tables (Submit), for
// humans only: what marks the region as the library's is RegionSpec.library_region (the daemon
// limits such regions; a region merely named so is an ordinary region).
inline constexpr char kBlockTableRegionName[] = "client block tables";
// The session's done words (ClientOptions::gpu_done_word): this many 64-bit words at the start of
// the block-table region (a library region; the tables follow them).
inline constexpr uint32_t kDoneWords = 4096;
inline constexpr uint64_t kDoneWordsBytes = uint64_t{8} * kDoneWords;
// Its size when Connect creates it (room for 262144 ids; grown in powers of two when needed).
inline constexpr uint64_t kBlockTableBufferBytes = uint64_t{1} << 20;

class Client;

// A prepared transfer (Client::Prepare): a transfer's shape the daemon validated and planned once,
// posted many times with new block ids; a post checks only its ids (and that the regions and
// grants still hold). Move-only; releases the daemon's prepared transfer when destroyed (the
// transfers posted from it run on). Must not outlive its Client. Thread contract: Post may be
// called concurrently; moving, Release and destruction need the caller's exclusion.
class PreparedTransfer {
 public:
  PreparedTransfer(PreparedTransfer&& other) noexcept;
  PreparedTransfer& operator=(PreparedTransfer&& other) noexcept;
  PreparedTransfer(const PreparedTransfer&) = delete;
  PreparedTransfer& operator=(const PreparedTransfer&) = delete;
  ~PreparedTransfer();

  // The daemon's prepared id (0 once released or moved from).
  uint64_t id() const { return id_; }
  // What each post moves, and the id counts it takes (PrepareTransferResponse).
  const v1::PrepareTransferResponse& info() const { return info_; }
  // One transfer of this shape with these ids (exactly info().src_block_count() and
  // dst_block_count() of them), answered as Client::Submit; wait for it as for a submitted one.
  // Over the session socket within the node ("POST"), else PostTransfer. FAILED_PRECONDITION
  // once released.
  absl::StatusOr<v1::SubmitTransferResponse> Post(const std::vector<uint32_t>& src_block_ids,
                                                  const std::vector<uint32_t>& dst_block_ids);
  absl::StatusOr<v1::SubmitTransferResponse> Post(const uint32_t* src_block_ids, size_t src_count,
                                                  const uint32_t* dst_block_ids, size_t dst_count);
  // Releases it now, with the daemon's answer (the destructor ignores it). OK when released, also
  // when it had ended already (its region unregistered, its session gone).
  absl::Status Release();

 private:
  friend class Client;
  PreparedTransfer(Client* client, v1::PrepareTransferResponse info)
      : client_(client), id_(info.prepared_id()), info_(std::move(info)) {}
  Client* client_ = nullptr;
  uint64_t id_ = 0;
  v1::PrepareTransferResponse info_;
};

// A connection to one kvraild.
// Thread contract: every method may be called concurrently from any thread (gRPC stubs are
// thread-safe; the lazily opened session socket is guarded internally). Watch blocks its caller
// and runs the callback on the calling thread.
class Client {
 public:
  // `target`: a unix socket path ("/run/kvrail/kvrail.sock", or "unix:PATH") or "host:port".
  // Probes the daemon with GetStats (deadline `probe_timeout`); UNAVAILABLE naming the socket
  // when it does not answer.
  // The options are ClientOptions::FromEnvironment() with `target`.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& target = DefaultTarget(), absl::Duration probe_timeout = absl::Seconds(3));
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options, absl::Duration probe_timeout = absl::Seconds(3));
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // What Connect was given, and the gRPC target derived from it ("unix:/path" or "host:port").
  const std::string& target() const;
  const std::string& grpc_target() const;
  // The unix socket path; empty for TCP targets (which cannot share host buffers).
  const std::string& unix_socket_path() const;

  // --- Host memory -------------------------------------------------------------------------
  absl::StatusOr<std::unique_ptr<HostBuffer>> CreateHostBuffer(size_t bytes);
  // Opens the session socket on first use and returns its id. Regions registered with it are
  // released by the daemon when this Client is destroyed (or the process dies).
  absl::StatusOr<uint64_t> SessionId();
  // Passes `fd` (still owned by the caller) over the session socket and returns its token, for a
  // RegionShare that names fds (fd_token, cuda_vmm chunks). The token is single-use and belongs
  // to this client's session. FAILED_PRECONDITION for TCP targets.
  absl::StatusOr<std::string> ShareFd(int fd);
  // Passes buffer.fd() over the session socket, then RegisterRegion with the token and the
  // session id. Fills spec.share (fd_token; offset kept), memory_kind = HOST when unspecified,
  // size_bytes = buffer.size() - share.offset when zero, and a bytes layout when none is set.
  // FAILED_PRECONDITION for TCP targets.
  absl::StatusOr<v1::RegionInfo> RegisterHostBuffer(const HostBuffer& buffer, v1::RegionSpec spec);

  // One layer of a per-layer host region: its memory starts at `offset` of `buffer`.
  struct HostLayer {
    const HostBuffer* buffer = nullptr;
    uint64_t offset = 0;
  };
  // A per-layer region (RegionSpec.layer_shares) over host memory, one layer per entry, each
  // buffer's fd passed over the session socket (once per layer, so layers may share a buffer).
  // `spec` gives the paged layout (layer_stride 0), name and writable; size_bytes (one layer's
  // span) defaults to the layout's extent. INVALID_ARGUMENT naming layers[i] for a null buffer.
  absl::StatusOr<v1::RegionInfo> RegisterHostLayers(const std::vector<HostLayer>& layers,
                                                    v1::RegionSpec spec);

  // Host memory the caller already has, registered without a copy: [offset, offset + bytes) of
  // `fd` (a memfd or a /dev/shm object; still owned by the caller, which may close it after
  // this returns: the daemon holds its own reference and maps the same pages). Fills spec.share
  // (fd_token, offset), memory_kind = HOST when unspecified, size_bytes = `bytes`, and a bytes
  // layout when none is set. INVALID_ARGUMENT naming fd / offset / bytes when the range does not
  // lie in the file; the daemon refuses what is not a regular tmpfs file (naming
  // spec.share.fd_token). FAILED_PRECONDITION for TCP targets.
  absl::StatusOr<v1::RegionInfo> RegisterHostFd(int fd, uint64_t offset, uint64_t bytes,
                                                v1::RegionSpec spec);

  // --- Transfer service ----------------------------------------------------------------------
  // Passes `spec` through, except for POSIX shm regions (share.shm_name set): the library opens
  // the object itself (read-write when spec.writable), with this process's rights, and passes
  // its fd over the session socket (share becomes fd_token, offset kept); memory_kind HOST when
  // unspecified, and size_bytes = the shm object's size - offset when zero. The daemon never
  // opens the name for the library (docs/security.md, "Memory").
  absl::StatusOr<v1::RegionInfo> RegisterRegion(v1::RegionSpec spec, uint64_t session_id = 0);
  absl::Status UnregisterRegion(uint64_t region_id);
  // Block tables of 8192+ ids travel through a host region of this client's session (a 1 MiB
  // one created and registered by Connect, or on first use when that failed or
  // ClientOptions::eager_block_table is false; named kBlockTableRegionName, grown as needed, not
  // listed by ListRegions, given up when RegisterHostBuffer / RegisterHostLayers would otherwise
  // fail on max_regions_per_session or _uid) on unix sockets, else as
  // block_ids_le32 from 1024 ids; a spec that already sets block_table or both encodings goes
  // as it is. Thread-safe; large submits from several threads take turns on the table region.
  // On a unix socket, a transfer within this node is submitted over the session socket (one
  // round trip, same validation and errors as the SubmitTransfer RPC, which is used otherwise,
  // for a daemon without it, or with ClientOptions::submit_via_session false).
  absl::StatusOr<v1::SubmitTransferResponse> Submit(const v1::TransferSpec& spec);
  // Several transfers at once (the K, V and auxiliary state of one chunk, several ranks): with
  // a submission queue, those within the node whose requests fit an entry are written in one
  // write (one publish, one wake-up of kvraild at most) and answered there; the rest go one by
  // one as Submit sends them. results[i] is specs[i]'s answer, each on its own: one refused
  // transfer refuses none of the others.
  std::vector<absl::StatusOr<v1::SubmitTransferResponse>> SubmitBatch(
      const std::vector<v1::TransferSpec>& specs);
  // Prepares `shape` (a TransferSpec without block ids; PrepareTransferRequest says what it may
  // hold) for posts of `src_block_count` source and `dst_block_count` destination ids (0: as many
  // as the tokens need). Opens the session (prepared transfers are the session's). Errors name
  // the field as Submit's.
  absl::StatusOr<PreparedTransfer> Prepare(const v1::TransferSpec& shape, uint32_t src_block_count,
                                           uint32_t dst_block_count = 0);
  // The calls PreparedTransfer makes (for the C ABI, which keeps prepared ids in its own table).
  absl::StatusOr<v1::PrepareTransferResponse> PrepareRequest(
      const v1::PrepareTransferRequest& request);
  absl::StatusOr<v1::SubmitTransferResponse> PostPrepared(const v1::PostTransferRequest& request);
  absl::Status ReleasePrepared(uint64_t prepared_id);
  // Requests sent through the submission queue, and those it handed back to packets (too big,
  // or the queue full), since Connect: for tests and benchmarks (0, 0 without a queue).
  std::pair<uint64_t, uint64_t> SubmissionQueueCounts();
  absl::StatusOr<v1::TransferStatus> Get(uint64_t transfer_id);
  // Blocks until the transfer ends or `timeout` passes (zero or infinite: until it ends); on
  // timeout the current (non-final) status is returned. On a unix socket the wait goes over a
  // session connection ("WAIT", answered by the daemon when the transfer ends), else WaitTransfer.
  // A transfer submitted over the session socket ends in the session's completion queue
  // (shared memory the daemon writes, mapped when the session opens unless
  // ClientOptions::completion_queue is false): the wait reads it there without a call, polling
  // for up to ClientOptions::completion_spin (adaptive) before it sleeps. Such a status carries
  // transfer_id, state, error_code, bytes_total, bytes_done and finished_unix_us (Get has the
  // rest); one with an error message or a digest is read from the daemon in full.
  absl::StatusOr<v1::TransferStatus> Wait(uint64_t transfer_id,
                                          absl::Duration timeout = absl::ZeroDuration());
  // The transfer's end as the completion queue (or its done word) tells it, without a call
  // when the queue holds it: transfer_id, state, error_code, bytes_total, bytes_done and
  // finished_unix_us (0 for an end seen in the done word); path, engine, phases and the rest of
  // the status come with Wait or Get. Waits as Wait does (zero or infinite timeout: until it
  // ends; on timeout the current status from Get). A transfer the queue does not follow, one it
  // missed, and an end that has more to say (an error message, a digest) are Wait's.
  absl::StatusOr<v1::TransferStatus> WaitEnd(uint64_t transfer_id,
                                             absl::Duration timeout = absl::ZeroDuration());
  // Without waiting and without a call: the end WaitEnd would return, when the completion queue
  // (or the done word) holds it already and it says no more than those fields; nullopt while
  // the transfer runs, and for whatever WaitEnd would read from the daemon. A host transfer
  // small enough to run inline has usually ended by the time its submit returns.
  std::optional<v1::TransferStatus> EndIfSeen(uint64_t transfer_id);
  // Without a call: states[i] for ids[i] as the completion queue knows it - the final state of
  // an ended transfer, TRANSFER_STATE_RUNNING for one it follows that has not ended, and
  // TRANSFER_STATE_UNSPECIFIED for what it cannot tell (not submitted over the session, older
  // than it remembers, or missed when the queue was full): ask Get for those.
  void LocalStates(const uint64_t* ids, size_t count, int32_t* states);
  // The completion queue's eventfd for an event loop (-1 without a queue). While armed, the
  // daemon rings it for every completion; ArmCompletions also clears it and drains the queue.
  int CompletionFd();
  // Whether transfer `id`'s end will be (or was) read from the completion queue.
  bool FollowsCompletion(uint64_t transfer_id);
  void ArmCompletions(bool armed);
  // While armed: ids of transfers whose end came (or that the queue missed: read those the old
  // way) since the last call, at most `max`; clears the eventfd.
  size_t TakeCompletions(uint64_t* ids, size_t max);
  // For tests and benchmarks: transfer ends this client saw first in their done word
  // (ClientOptions::gpu_done_word), before the daemon's completion.
  uint64_t DoneWordHits();
  // Cancels the transfer (ended ones answer with their final status: a cancel may be repeated)
  // and returns its status. On a unix socket it goes as a CANCEL packet on the session's
  // connection (one round trip, after every SUBMIT sent on it), else CancelTransfer over gRPC.
  absl::StatusOr<v1::TransferStatus> Cancel(uint64_t transfer_id);
  // Layers [layer_begin, layer_begin + layer_count) of a layer-wise transfer are written.
  absl::Status MarkReady(uint64_t transfer_id, uint32_t layer_begin, uint32_t layer_count = 1);
  // Streams the transfer's events to `on_event` until the stream ends (after the final state)
  // and returns the last status seen. Returning false from `on_event` stops watching early.
  absl::StatusOr<v1::TransferStatus> Watch(
      uint64_t transfer_id, const std::function<bool(const v1::TransferEvent&)>& on_event,
      uint32_t min_interval_ms = 0);

  // --- Grants (docs/security.md) -------------------------------------------------------------
  // Lets another party read (access READ: a transfer's source, ready flags) or write (WRITE: a
  // destination, arrival flags) region `region_id`, which this client's session must own: the
  // returned token goes to that party out of band and into its TransferEndpoint.grant /
  // FlagArray.grant. `ttl` zero: 10 minutes. Layers [layer_begin, layer_end) (both 0: all).
  absl::StatusOr<v1::Grant> CreateGrant(uint64_t region_id, v1::GrantAccess access,
                                        absl::Duration ttl = absl::ZeroDuration(),
                                        uint32_t layer_begin = 0, uint32_t layer_end = 0);
  absl::Status RevokeGrant(const std::string& token);
  // Lets the daemon of node `peer_node` (in this daemon's peer directory) write into region
  // `region_id` of this daemon, which this client's session must own: what a decode worker does
  // before a prefill node pushes into its pool (Transfer.ExportRegion). Returns the lease.
  absl::StatusOr<v1::RegionLease> ExportRegion(uint64_t region_id, const std::string& peer_node);

  // --- Notifications (TransferSpec.notification) ---------------------------------------------
  // Notifications queued for this client's session (opened on first use), oldest first: up to
  // `max` (0: 256), waiting up to `timeout` (at most 60 s; zero: do not wait) for the first.
  // Submit fills TransferSpec.session_id with this session when one is open, so a client is
  // not notified of its own transfers.
  absl::StatusOr<std::vector<v1::Notification>> PollNotifications(
      uint32_t max = 0, absl::Duration timeout = absl::ZeroDuration());
  // Streams this session's notifications to `on_notification` until it returns false, the
  // session ends (OK) or the stream fails.
  absl::Status WatchNotifications(
      const std::function<bool(const v1::Notification&)>& on_notification);

  // --- Session lost ----------------------------------------------------------------------------
  // When kvraild stops or restarts, every region this client registered is gone. The client
  // finds out when the daemon closes its session socket (a monitor thread watches it once the
  // session is open), when a new session names another daemon instance than Connect saw
  // (Stats.lineage_id), or when a call fails with NOT_FOUND / UNAVAILABLE and the daemon's
  // lineage turns out to have changed (a hot restart keeps it: nothing is lost then). From then on
  // calls that use the session, and calls that fail, return FAILED_PRECONDITION "session lost: ..."
  // until ResetSession.
  bool session_lost() const;
  // The daemon lineage this client's session belongs to (Stats.lineage_id, which a hot restart
  // keeps; Stats.instance_id from daemons without it; "" from older daemons).
  std::string instance_id() const;
  // Called once per loss, on the thread that found it (the monitor thread, or a caller's), with
  // the "session lost" status. Must not call ResetSession or destroy the client itself.
  void OnSessionLost(std::function<void(const absl::Status&)> callback);
  // Drops the lost session (if any) and adopts the daemon's current instance; the next call
  // opens a new session, under which regions must be registered again. Right after a restart it
  // waits (up to Connect's probe_timeout) for the daemon to answer, however recently calls
  // failed to reach it. UNAVAILABLE when the daemon does not answer. Safe to call while other
  // threads use the session: they finish on the old session.
  absl::Status ResetSession();

  // --- Admin service -------------------------------------------------------------------------
  // Every region of the daemon the caller may see, except the client libraries' own block-table
  // regions (RegionSpec.library_region, any session's; not recognized by name) unless
  // `include_library_regions`.
  absl::StatusOr<v1::ListRegionsResponse> ListRegions(bool include_library_regions = false);
  // `states` empty: all; `limit` 0: the daemon's default (100).
  absl::StatusOr<v1::ListTransfersResponse> ListTransfers(
      const std::vector<v1::TransferState>& states = {}, uint32_t limit = 0);
  // Every filter of ListTransfersRequest (states, limit, region_id, label, idempotency_key).
  absl::StatusOr<v1::ListTransfersResponse> ListTransfers(const v1::ListTransfersRequest& request);
  absl::StatusOr<v1::ListPeersResponse> ListPeers();
  absl::StatusOr<v1::Stats> GetStats();
  absl::StatusOr<v1::GetTopologyResponse> GetTopology();

 private:
  // `with_done_word`: a word for the GPU-written completion is attached (when the client has
  // done words and the caller set none). `queue` false: never through the submission queue
  // (what it handed back goes by packet).
  absl::StatusOr<v1::SubmitTransferResponse> SubmitRequest(v1::SubmitTransferRequest request,
                                                           bool with_done_word = true,
                                                           bool queue = true);
  // The session's done words for `completions` (registered on first use); false without them.
  bool EnableDoneWords(CompletionTable* completions);
  // The request Submit sends for `spec` (the session filled in, small block tables compacted),
  // or nullopt when its tables go through the block-table region (Submit's own path).
  std::optional<v1::SubmitTransferRequest> PlainRequest(const v1::TransferSpec& spec);
  // Requests through the submission queue (those within the node, on a unix socket), each with
  // a done word as SubmitRequest attaches one; results[i] nullopt for those it did not take
  // (their requests as given).
  // (A single Submit allocates nothing for the batch's bookkeeping.)
  using QueuedResults =
      absl::InlinedVector<std::optional<absl::StatusOr<v1::SubmitTransferResponse>>, 4>;
  QueuedResults SubmitQueued(absl::Span<v1::SubmitTransferRequest* const> requests,
                             bool with_done_word = true);
  // Wait by a WAIT packet or WaitTransfer (without the completion queue).
  absl::StatusOr<v1::TransferStatus> WaitByCall(uint64_t transfer_id, absl::Duration timeout);
  // Makes the block-table region hold `need` bytes (creates / grows and registers it); the
  // caller holds impl_->table_mu_.
  absl::Status PrepareTableBuffer(uint64_t need);
  // After a registration refused for max_regions_per_session / _uid: unregisters the block-table
  // region (when it is not in use) so the caller's region can take its place; true when it did.
  bool YieldTableRegion(const absl::Status& failed);
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// --- Layout and spec helpers (pure; thread-safe) ------------------------------------------------
// For laying out a KV pool in a host buffer and building transfers of its blocks.

// Bytes of one element of `dtype`; 0 for DTYPE_UNSPECIFIED or unknown values.
uint32_t DTypeSize(v1::DType dtype);

// Paged layouts are checked by the validator kvraild's planner uses (layout/paged_layout.h): the
// same layouts are valid, and an error is INVALID_ARGUMENT "paged_kv.<field>: ..." naming the
// field the daemon would name.
//
// Checks `layout` and returns the bytes a region needs to hold it: offset_bytes + the end of its
// highest-addressed element (of one layer when `per_layer`, a RegionSpec.layer_shares region).
// `region_bytes`, when given, is what it must fit (one layer's span when `per_layer`).
absl::StatusOr<uint64_t> CheckPagedLayout(const v1::PagedKvLayout& layout,
                                          std::optional<uint64_t> region_bytes = std::nullopt,
                                          bool per_layer = false);
// The byte strides of a checked layout: the explicit ones when any is non-zero, else derived,
// densely packed, from `order`.
struct PagedStrides {
  uint64_t layer = 0, part = 0, block = 0, token = 0, head = 0;
  uint32_t dtype_size = 0;
};
absl::StatusOr<PagedStrides> ResolveStrides(const v1::PagedKvLayout& layout);
// CheckPagedLayout(layout): the bytes a region needs to hold `layout`.
absl::StatusOr<uint64_t> PagedLayoutBytes(const v1::PagedKvLayout& layout);
// Byte offset of element (layer, part, block, token, head, 0) in the region.
uint64_t PagedOffset(const v1::PagedKvLayout& layout, const PagedStrides& strides, uint32_t layer,
                     uint32_t part, uint32_t block, uint32_t token, uint32_t head);

// A paged transfer from `src` blocks of region `src_region` to `dst` blocks of `dst_region`
// (all layers, heads and tokens; callers adjust the rest of the spec).
v1::TransferSpec MakeBlockTransfer(uint64_t src_region, std::vector<uint32_t> src_blocks,
                                   uint64_t dst_region, std::vector<uint32_t> dst_blocks);

// The request of one post of prepared transfer `prepared_id`: the ids of a side as
// block_ids_le32 from kPostLe32From ids (a memcpy for the daemon instead of a varint per id),
// else as block_ids.
inline constexpr size_t kPostLe32From = 1024;
v1::PostTransferRequest MakePostRequest(uint64_t prepared_id, const uint32_t* src_ids,
                                        size_t src_count, const uint32_t* dst_ids,
                                        size_t dst_count);

// Whether a transfer state is final (SUCCEEDED, FAILED, CANCELLED).
bool IsFinal(v1::TransferState state);

}  // namespace kvrail::client

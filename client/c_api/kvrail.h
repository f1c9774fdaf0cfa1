/* kvrail C ABI (libkvrail.so): the client library for programs that are not C++, above all the
 * Python package `kvrail` (python/). The one public C header. A thin layer over the C++ client
 * (client/kvrail_client.h): same daemon protocol, same fast paths (transfers within the node are
 * submitted and awaited over the session socket).
 *
 * Conventions
 * - Versioning: KVRAIL_ABI_VERSION is the version this header describes; kvrail_abi_version()
 *   the one the loaded library implements. A caller checks they are equal. Structs that cross the
 *   ABI begin with `struct_size` (the caller sets sizeof); the library rejects sizes it does not
 *   know instead of reading past the caller's struct.
 * - Errors: every function that can fail returns an int, the gRPC status code (0 = KVRAIL_OK;
 *   the daemon's codes pass through unchanged). The message of the calling thread's last call
 *   (the daemon's text, which names the offending field: "spec.dst.block_ids[3]: block 4096 out
 *   of range [0, 4096)") is kvrail_last_error_message(); a successful call sets it to "".
 * - Messages: specs and statuses are protobuf messages of proto/kvrail/v1/ passed as serialized
 *   bytes (language-neutral; every language has a protobuf runtime). Bytes the library returns
 *   (`uint8_t** out, size_t* out_len`) are allocated by it and released with kvrail_free();
 *   passing NULL for such an out-pair means "not wanted".
 * - Handles: kvrail_client* and kvrail_host_buffer* are opaque tokens, not addresses: each is
 *   issued once in the process's lifetime and looked up on every call. Closing or freeing one
 *   retires it for good, so a second close/free is a no-op and any later use returns
 *   KVRAIL_INVALID_ARGUMENT ("client: not a live kvrail_client handle") instead of crashing.
 *   Closing/freeing NULL is a no-op.
 * - Threads: every function may be called from any thread, concurrently, on the same handles. A
 *   call in progress keeps its objects alive: closing a client while another thread waits on it
 *   retires the handle at once and releases the connection when that wait returns.
 * - Ids: regions and transfers are the daemon's uint64 ids.
 */
#ifndef KVRAIL_C_API_KVRAIL_H_
#define KVRAIL_C_API_KVRAIL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVRAIL_ABI_VERSION 1

/* gRPC status codes (google.rpc.Code numbering). */
enum {
  KVRAIL_OK = 0,
  KVRAIL_CANCELLED = 1,
  KVRAIL_UNKNOWN = 2,
  KVRAIL_INVALID_ARGUMENT = 3,
  KVRAIL_DEADLINE_EXCEEDED = 4,
  KVRAIL_NOT_FOUND = 5,
  KVRAIL_ALREADY_EXISTS = 6,
  KVRAIL_PERMISSION_DENIED = 7,
  KVRAIL_RESOURCE_EXHAUSTED = 8,
  KVRAIL_FAILED_PRECONDITION = 9,
  KVRAIL_ABORTED = 10,
  KVRAIL_OUT_OF_RANGE = 11,
  KVRAIL_UNIMPLEMENTED = 12,
  KVRAIL_INTERNAL = 13,
  KVRAIL_UNAVAILABLE = 14,
  KVRAIL_DATA_LOSS = 15,
  KVRAIL_UNAUTHENTICATED = 16
};

/* kvrail.v1.TransferState numbers. */
enum {
  KVRAIL_STATE_UNSPECIFIED = 0,
  KVRAIL_STATE_QUEUED = 1,
  KVRAIL_STATE_RUNNING = 2,
  KVRAIL_STATE_SUCCEEDED = 3,
  KVRAIL_STATE_FAILED = 4,
  KVRAIL_STATE_CANCELLED = 5
};

typedef struct kvrail_client kvrail_client;
typedef struct kvrail_host_buffer kvrail_host_buffer;
typedef struct kvrail_prepared kvrail_prepared;
typedef struct kvrail_spec kvrail_spec;

/* --- Version and errors ----------------------------------------------------------------------- */
uint32_t kvrail_abi_version(void);
/* The calling thread's last call: its message ("" after success) and code. The pointer stays
 * valid until the thread's next kvrail_* call. */
const char* kvrail_last_error_message(void);
int kvrail_last_error_code(void);
/* Releases bytes returned by the library. NULL is a no-op. */
void kvrail_free(void* bytes);

/* --- Connection ------------------------------------------------------------------------------- */
/* `target`: a unix socket path (or "unix:PATH") or "host:port"; NULL or "" means $KVRAIL_SOCKET,
 * else /run/kvrail/kvrail.sock. Probes the daemon for up to `probe_timeout_ms` (<= 0: 3000);
 * KVRAIL_UNAVAILABLE naming the socket when it does not answer. */
int kvrail_connect(const char* target, int64_t probe_timeout_ms, kvrail_client** out);
/* Closes the connection; the daemon releases every region registered through it. */
void kvrail_close(kvrail_client* client);
/* The session id regions of this client are tied to (opens the session socket on first use). */
int kvrail_session_id(kvrail_client* client, uint64_t* out);

/* --- Host memory ------------------------------------------------------------------------------ */
/* Shared host memory (a memfd mapped MAP_SHARED; zero-filled). `bytes` > 0; `name` (may be NULL)
 * labels the memfd. Independent of any client: one buffer may back regions of several. */
int kvrail_host_buffer_create(uint64_t bytes, const char* name, kvrail_host_buffer** out);
/* Unmaps and closes the buffer. Regions registered over it stay valid in the daemon (it holds
 * its own mapping) until unregistered. */
void kvrail_host_buffer_free(kvrail_host_buffer* buffer);
/* NULL / 0 for a handle that is not live. */
void* kvrail_host_buffer_data(kvrail_host_buffer* buffer);
uint64_t kvrail_host_buffer_size(kvrail_host_buffer* buffer);

/* --- Regions ---------------------------------------------------------------------------------- */
/* Registers `buffer` as a region of this client's session: `spec` is a serialized
 * kvrail.v1.RegionSpec (share.fd_token is filled in; memory_kind, size_bytes and a bytes layout
 * are defaulted as in Client::RegisterHostBuffer). Out: the region id and (optional) the
 * serialized kvrail.v1.RegionInfo. */
int kvrail_register_host_buffer(kvrail_client* client, kvrail_host_buffer* buffer,
                                const uint8_t* spec, size_t spec_len, uint64_t* region_id,
                                uint8_t** info, size_t* info_len);
/* Registers host memory the caller already has, without a copy: [offset, offset + bytes) of
 * `fd`, a memfd or a /dev/shm object (an engine's own pool, a torch tensor after share_memory_(),
 * numpy over multiprocessing.shared_memory). The fd stays the caller's (it may be closed once
 * this returns); the daemon receives its own reference over the session socket and maps the same
 * pages, so writes on either side are seen by the other. `spec` (may be empty) gives name,
 * layout and writable; share, memory_kind and size_bytes are filled in. Errors name `fd`,
 * `offset` or `bytes` (a range outside the file, not a regular file); the daemon refuses files
 * not on tmpfs, naming spec.share.fd_token. A memfd made with MFD_ALLOW_SEALING is sealed
 * against shrinking by the daemon. */
int kvrail_register_host_fd(kvrail_client* client, int fd, uint64_t offset, uint64_t bytes,
                            const uint8_t* spec, size_t spec_len, uint64_t* region_id,
                            uint8_t** info, size_t* info_len);
/* A RegionSpec passed through (e.g. share.shm_name), tied to this client's session. */
int kvrail_register_region(kvrail_client* client, const uint8_t* spec, size_t spec_len,
                           uint64_t* region_id, uint8_t** info, size_t* info_len);
int kvrail_unregister_region(kvrail_client* client, uint64_t region_id);

/* A paged KV layout without protobuf (kvrail.v1.PagedKvLayout's fields; enums by number). */
typedef struct kvrail_paged_layout {
  uint32_t struct_size; /* sizeof(kvrail_paged_layout) */
  uint32_t num_layers, num_parts, num_blocks, tokens_per_block, num_heads, head_dim;
  int32_t dtype; /* kvrail.v1.DType */
  int32_t order; /* kvrail.v1.LayoutOrder; used when all strides are 0 */
  uint64_t layer_stride, part_stride, block_stride, token_stride, head_stride; /* bytes */
  uint64_t offset_bytes;
} kvrail_paged_layout;

/* Bytes a region needs to hold `layout` (offset_bytes + the end of its last element); the same
 * checks as kvrail_paged_layout_check without a region. */
int kvrail_paged_layout_bytes(const kvrail_paged_layout* layout, uint64_t* bytes);
/* Checks `layout` with the validator kvraild's planner uses, so a layout is valid here exactly
 * when the daemon takes it: KVRAIL_OK, or KVRAIL_INVALID_ARGUMENT whose message names the field
 * ("layout.num_parts: must be 1 (MLA) or 2 (K and V), got 3"). `region_bytes` (0: unbounded) is
 * what it must fit; with KVRAIL_LAYOUT_PER_LAYER in `flags` it is a per-layer region's layout
 * (layer_stride 0; region_bytes and `bytes` are one layer's span). Out (may be NULL): the bytes
 * it spans, offset_bytes + the end of its last element. */
#define KVRAIL_LAYOUT_PER_LAYER 1u
int kvrail_paged_layout_check(const kvrail_paged_layout* layout, uint64_t region_bytes,
                              uint32_t flags, uint64_t* bytes);
/* Registers `buffer` as a paged KV region with `layout`. `name` may be NULL. */
int kvrail_register_paged_host(kvrail_client* client, kvrail_host_buffer* buffer,
                               const kvrail_paged_layout* layout, int writable, const char* name,
                               uint64_t* region_id);

/* CUDA: registers [device_ptr, device_ptr + bytes) of one cudaMalloc allocation (over CUDA IPC;
 * the daemon maps it on the same device ordinal). `spec` (may be empty) gives name, layout and
 * writable. Without a GPU or driver: the CUDA error as KVRAIL_INVALID_ARGUMENT/INTERNAL. */
int kvrail_register_cuda(kvrail_client* client, const void* device_ptr, uint64_t bytes,
                         const uint8_t* spec, size_t spec_len, uint64_t* region_id, uint8_t** info,
                         size_t* info_len);

/* Per-layer regions (RegionSpec.layer_shares): a paged KV region whose layers live in separate
 * allocations, so one transfer moves every layer (vLLM keeps one tensor per layer). `spec` (a
 * serialized RegionSpec) gives paged_kv with layer_stride 0 and num_layers = num_layers, name and
 * writable; size_bytes is one layer's span (0: derived from the layout, host only).
 * CUDA: layer L is [layer_ptrs[L], + layer_bytes) inside one cudaMalloc allocation, all on one
 * GPU. Host: layer L starts at offsets[L] (NULL: 0) of buffers[L]; a buffer may hold several
 * layers. Errors name the layer ("layer_ptrs[3]: ...", "spec.layer_shares[3].fd_token: ..."). */
int kvrail_register_cuda_layers(kvrail_client* client, const void* const* layer_ptrs,
                                size_t num_layers, uint64_t layer_bytes, const uint8_t* spec,
                                size_t spec_len, uint64_t* region_id, uint8_t** info,
                                size_t* info_len);
int kvrail_register_host_layers(kvrail_client* client, kvrail_host_buffer* const* buffers,
                                const uint64_t* offsets, size_t num_layers, const uint8_t* spec,
                                size_t spec_len, uint64_t* region_id, uint8_t** info,
                                size_t* info_len);

/* --- Transfers -------------------------------------------------------------------------------- */
/* `spec`: a serialized kvrail.v1.TransferSpec. Out: the transfer id and (optional) the serialized
 * kvrail.v1.SubmitTransferResponse. Returns once the daemon accepted it. */
int kvrail_submit(kvrail_client* client, const uint8_t* spec, size_t spec_len,
                  uint64_t* transfer_id, uint8_t** response, size_t* response_len);
/* kvrail_submit with the block tables as arrays, so a caller in another language encodes no ids:
 * `src_ids` / `dst_ids` (`src_count` / `dst_count` of them; NULL with 0 keeps the spec's own)
 * replace the spec's src.block_ids / dst.block_ids. Same answers as kvrail_submit. */
int kvrail_submit_blocks(kvrail_client* client, const uint8_t* spec, size_t spec_len,
                         const uint32_t* src_ids, size_t src_count, const uint32_t* dst_ids,
                         size_t dst_count, uint64_t* transfer_id, uint8_t** response,
                         size_t* response_len);
/* Several transfers in one call (the K, V and auxiliary state of one chunk, several ranks):
 * specs[i] is a serialized kvrail.v1.TransferSpec of spec_lens[i] bytes. With the session's
 * submission queue (unless KVRAIL_SUBMISSION_QUEUE=0) those within the node whose requests fit
 * an entry are written in one write and answered without a socket round trip; the rest are
 * submitted one by one as kvrail_submit does. transfer_ids[i] gets each accepted transfer's id
 * (0 when refused) and codes[i] (may be NULL) its code; each is answered on its own, one refusal
 * refuses none of the others. Returns OK when every one was accepted, else the first refusal's
 * code with its message naming the index ("specs[2]: ..."). */
int kvrail_submit_batch(kvrail_client* client, const uint8_t* const* specs, const size_t* spec_lens,
                        size_t count, uint64_t* transfer_ids, int32_t* codes);
/* Prepared transfers: a transfer's shape validated and planned once by the daemon, then posted
 * many times with new block ids (each post checks only its ids, and that the regions and grants
 * still hold). kvrail_prepare: `spec` is a serialized kvrail.v1.TransferSpec without block ids
 * (kvrail.v1.PrepareTransferRequest says what it may hold); each post gives `src_block_count`
 * source and `dst_block_count` destination ids (0: as many as the tokens need). *prepared gets
 * the handle; `response` (optional) the serialized kvrail.v1.PrepareTransferResponse. The
 * prepared transfer belongs to the client's session: it ends with kvrail_prepared_release, the
 * client's close (the session's end) or the unregistration of either region.
 * kvrail_post: one transfer of that shape with these ids (exactly the counts prepared), answered
 * as kvrail_submit (`transfer_id` required, `response` optional); wait for it as for a submitted
 * one. A bad id is KVRAIL_INVALID_ARGUMENT naming it ("post.src_block_ids[3]: ..."); a prepared
 * transfer that is gone (released, its region unregistered) KVRAIL_NOT_FOUND naming prepared_id.
 * kvrail_prepared_release: frees it (NULL: nothing; a released handle: INVALID_ARGUMENT;
 * one that ended already, with its region or session, is released OK). */
int kvrail_prepare(kvrail_client* client, const uint8_t* spec, size_t spec_len,
                   uint32_t src_block_count, uint32_t dst_block_count, kvrail_prepared** prepared,
                   uint8_t** response, size_t* response_len);
int kvrail_post(kvrail_prepared* prepared, const uint32_t* src_ids, size_t src_count,
                const uint32_t* dst_ids, size_t dst_count, uint64_t* transfer_id,
                uint8_t** response, size_t* response_len);
int kvrail_prepared_release(kvrail_prepared* prepared);
/* Status of a transfer. `state` (optional) gets its TransferState; `status` (optional) the
 * serialized kvrail.v1.TransferStatus.
 * kvrail_wait: timeout_ms < 0 waits until the transfer ends; 0 returns the current status at
 * once; > 0 waits at most that long and then returns the current (not final) status, code OK. */
int kvrail_wait(kvrail_client* client, uint64_t transfer_id, int64_t timeout_ms, int32_t* state,
                uint8_t** status, size_t* status_len);
/* kvrail_wait_end: as kvrail_wait, but an end the completion queue (or the done word) holds is
 * answered from it without a call: the status then carries transfer_id, state, error_code,
 * bytes_total, bytes_done and finished_unix_us only (kvrail_wait / kvrail_get have the rest).
 * An end with an error message or a digest, and a transfer the queue does not follow, are
 * kvrail_wait's. What an event loop calls once the completion fd said the transfer ended. */
int kvrail_wait_end(kvrail_client* client, uint64_t transfer_id, int64_t timeout_ms, int32_t* state,
                    uint8_t** status, size_t* status_len);
int kvrail_get(kvrail_client* client, uint64_t transfer_id, int32_t* state, uint8_t** status,
               size_t* status_len);
int kvrail_cancel(kvrail_client* client, uint64_t transfer_id, int32_t* state, uint8_t** status,
                  size_t* status_len);
/* Layers [layer_begin, layer_begin + layer_count) of a layer-wise transfer are written. */
int kvrail_mark_ready(kvrail_client* client, uint64_t transfer_id, uint32_t layer_begin,
                      uint32_t layer_count);
/* The states of `count` transfers in one call: states[i] for ids[i]. An id that cannot be read
 * gets state 0 and codes[i] its error (codes may be NULL); the call then returns the first such
 * error, its message naming the index ("ids[2]: ..."), with every state still filled in. */
int kvrail_poll(kvrail_client* client, const uint64_t* ids, size_t count, int32_t* states,
                int32_t* codes);
/* The completion queue: a transfer submitted over the session socket ends in shared memory the
 * daemon writes (unless KVRAIL_COMPLETION_QUEUE=0), so kvrail_wait and kvrail_poll read its end
 * without a call (kvrail_poll asks the daemon only for the ids the queue cannot tell).
 * kvrail_completion_fd: the queue's eventfd for an event loop's reader (-1: no queue; owned by
 * the library). kvrail_arm_completions(1): the daemon rings it for every completion from now on
 * (0: only when a kvrail_wait sleeps); each call also clears it, so call it (or kvrail_poll
 * after it) when the fd turned readable. */
int kvrail_completion_fd(kvrail_client* client, int* fd);
int kvrail_arm_completions(kvrail_client* client, int armed);
/* *follows = 1 when the transfer's end comes through the completion queue (it was submitted over
 * the session socket of a client with a queue), else 0. */
int kvrail_completion_follows(kvrail_client* client, uint64_t transfer_id, int* follows);
/* While armed: the ids of transfers whose end came through the queue (or that it missed: read
 * those with kvrail_wait) since the last call, at most `max` into `ids`; *count how many (call
 * again while it equals `max`). Clears the eventfd; what an event loop calls when it is readable.
 */
int kvrail_take_completions(kvrail_client* client, uint64_t* ids, size_t max, size_t* count);

/* The hot path with fixed-size answers: a transfer's submit and end in structs, so a caller in
 * another language parses no message for the common case. */
typedef struct kvrail_submitted {
  uint32_t struct_size; /* the caller sets sizeof(kvrail_submitted) */
  uint32_t tiles_total; /* tiles the plan was cut into */
  uint64_t transfer_id;
  uint64_t bytes_total;  /* bytes the plan will move */
  uint32_t deduplicated; /* 1: the idempotency key matched an earlier transfer, whose id this is */
  uint32_t followed;     /* 1: its end comes through the completion queue (kvrail_take_ends) */
} kvrail_submitted;

/* kvrail_transfer_end.flags */
enum {
  /* The whole status says more than these fields (an error message, a digest): kvrail_wait or
   * kvrail_get has it. */
  KVRAIL_END_MORE = 1,
  /* kvrail_take_ends: not read without a call (a failure or cancellation, whose message the
   * daemon has; or a transfer the queue missed when it was full): ask kvrail_wait_end. */
  KVRAIL_END_ASK = 2
};

typedef struct kvrail_transfer_end {
  uint32_t struct_size; /* the caller sets sizeof(kvrail_transfer_end) */
  int32_t state;        /* TransferState (0 with KVRAIL_END_ASK) */
  uint64_t transfer_id;
  int32_t error_code;
  uint32_t flags; /* KVRAIL_END_* */
  uint64_t bytes_total;
  uint64_t bytes_done;
  uint64_t finished_unix_us;
} kvrail_transfer_end;

/* kvrail_submit_blocks answering in `submitted` (struct_size set by the caller) instead of
 * SubmitTransferResponse bytes. Errors as kvrail_submit_blocks'; "submitted.struct_size: ..." for
 * a size this library does not know. */
int kvrail_submit_blocks_short(kvrail_client* client, const uint8_t* spec, size_t spec_len,
                               const uint32_t* src_ids, size_t src_count, const uint32_t* dst_ids,
                               size_t dst_count, kvrail_submitted* submitted);
/* kvrail_wait_end answering in `end` (struct_size set by the caller): transfer_id, state,
 * error_code, bytes and finish time. When the status holds more than those (it came from the
 * daemon: an error message, a digest, or a transfer still running), KVRAIL_END_MORE is set and,
 * if `status` is given, the whole serialized kvrail.v1.TransferStatus is put there (kvrail_free);
 * otherwise *status stays NULL. */
int kvrail_wait_end_short(kvrail_client* client, uint64_t transfer_id, int64_t timeout_ms,
                          kvrail_transfer_end* end, uint8_t** status, size_t* status_len);
/* kvrail_take_completions with each end read as well, in one call and without a call to the
 * daemon for a transfer that SUCCEEDED (unless its end has more to say: a digest): while armed,
 * the ends that came since the last call, at most `max` into `ends` (ends[0].struct_size set by
 * the caller; every entry is written); *count how many (call again while it equals `max`). An
 * entry with KVRAIL_END_ASK carries only its transfer_id. Clears the eventfd. */
int kvrail_take_ends(kvrail_client* client, kvrail_transfer_end* ends, size_t max, size_t* count);
/* A transfer spec kept parsed by the library, for submits of one shape that differ only in their
 * block ids (the same paged shape submitted again and again): each submit sends the spec with the
 * ids given and parses nothing. Client-side only: the daemon checks every submit as it checks
 * kvrail_submit's (kvrail_prepare is the daemon-side shape).
 * kvrail_spec_create: `spec` a serialized kvrail.v1.TransferSpec of `client` (which it does not
 * keep alive); errors as kvrail_submit_blocks' for the spec ("spec: ...").
 * kvrail_spec_free: frees it (NULL: nothing; a freed handle: KVRAIL_INVALID_ARGUMENT); transfers
 * submitted from it run on. One spec may be submitted from many threads at once. */
int kvrail_spec_create(kvrail_client* client, const uint8_t* spec, size_t spec_len,
                       kvrail_spec** out);
int kvrail_spec_free(kvrail_spec* spec);

/* The two calls of a transfer's hot path with their arguments and answer in one struct, so that
 * a caller whose foreign-function layer converts every argument on every call (ctypes: ~50 ns an
 * argument) passes one pointer to memory it keeps, and reads the answer from the same memory.
 *
 * kvrail_submit_spec: kvrail_submit_blocks_short of `spec` with `ids` holding `src_count` source
 * ids then `dst_count` destination ids (0 on a side: the spec's own ids there), answered in
 * `submitted` (cleared first). When the transfer had already ended by the time the submit was
 * answered (a small host transfer runs inline) and the completion queue holds its end whole,
 * `end` has it as kvrail_wait_end_short would (state final, flags 0) and `end_status` as
 * kvrail_wait_end_into would (the serialized kvrail.v1.TransferStatus, `end_len` bytes): no
 * kvrail_wait_end is needed for it; otherwise end.state and end_len are 0. A caller built before
 * these existed sets the size without them (offsetof(kvrail_spec_submit, end)) and gets the
 * rest. A spec whose client was closed is KVRAIL_INVALID_ARGUMENT ("spec: its client was
 * closed"); "submit.struct_size: ..." for a size this library does not know. */
/* Room for an end's serialized status (transfer_id, state, error_code, bytes and finish time:
 * at most 57 bytes). */
#define KVRAIL_END_STATUS_INLINE 64
typedef struct kvrail_spec_submit {
  uint32_t struct_size; /* the caller sets sizeof(kvrail_spec_submit) */
  uint32_t src_count;
  uint32_t dst_count;
  uint32_t reserved; /* 0 */
  kvrail_spec* spec;
  const uint32_t* ids;
  kvrail_submitted submitted; /* the answer */
  kvrail_transfer_end end;    /* the end, when it came before the answer (state 0: not yet) */
  uint32_t end_len;           /* the same end serialized: end_status's bytes (0: not yet) */
  uint8_t end_status[KVRAIL_END_STATUS_INLINE];
} kvrail_spec_submit;
int kvrail_submit_spec(kvrail_spec_submit* submit);

/* kvrail_wait_end answering the serialized kvrail.v1.TransferStatus (the message kvrail_wait_end
 * returns) in the caller's struct: `len` bytes at `data`, or, for a status longer than
 * KVRAIL_STATUS_INLINE bytes (the daemon's, with a long error message or spec), at `heap`
 * (allocated by the library: kvrail_free it; NULL otherwise). A completion queue's end
 * (transfer_id, state, error_code, bytes and finish time) fits `data`: the common end costs no
 * allocation and no free. len 0 and heap NULL on failure; "wait.struct_size: ..." for a size this
 * library does not know. */
#define KVRAIL_STATUS_INLINE 240
typedef struct kvrail_end_wait {
  uint32_t struct_size; /* the caller sets sizeof(kvrail_end_wait) */
  uint32_t len;         /* the answer's size */
  kvrail_client* client;
  uint64_t transfer_id;
  int64_t timeout_ms; /* as kvrail_wait's: < 0 until it ends, 0 now */
  uint8_t* heap;
  uint8_t data[KVRAIL_STATUS_INLINE];
} kvrail_end_wait;
int kvrail_wait_end_into(kvrail_end_wait* wait);

/* --- Admin ------------------------------------------------------------------------------------ */
/* Serialized kvrail.v1.ListRegionsResponse / ListTransfersResponse / Stats. list_transfers:
 * `states` (TransferState numbers, `num_states` of them; none: all), `limit` 0: daemon default. */
int kvrail_list_regions(kvrail_client* client, uint8_t** out, size_t* out_len);
int kvrail_list_transfers(kvrail_client* client, const int32_t* states, size_t num_states,
                          uint32_t limit, uint8_t** out, size_t* out_len);
int kvrail_get_stats(kvrail_client* client, uint8_t** out, size_t* out_len);
/* ListTransfers with every filter: `request` is a serialized kvrail.v1.ListTransfersRequest
 * (states, limit, region_id, label, idempotency_key; empty: all, the daemon's default limit).
 * Out: the serialized kvrail.v1.ListTransfersResponse. */
int kvrail_list_transfers_filtered(kvrail_client* client, const uint8_t* request,
                                   size_t request_len, uint8_t** out, size_t* out_len);

/* --- Grants (docs/security.md) ---------------------------------------------------------------- */
/* Lets another party read (`access` 1, kvrail.v1.GRANT_ACCESS_READ) or write (2, WRITE) a region
 * this client's session owns; hand the token to that party, which names it in
 * TransferEndpoint.grant or FlagArray.grant. `ttl_ms` 0: 10 minutes; layers [layer_begin,
 * layer_end) (both 0: all). Out: the serialized kvrail.v1.Grant (its `token` field). */
int kvrail_create_grant(kvrail_client* client, uint64_t region_id, int32_t access, uint64_t ttl_ms,
                        uint32_t layer_begin, uint32_t layer_end, uint8_t** out, size_t* out_len);
int kvrail_revoke_grant(kvrail_client* client, const char* token);
/* Lets the daemon of node `peer_node` write into region `region_id` (owned by this client's
 * session): Transfer.ExportRegion. Out: the serialized kvrail.v1.RegionLease. */
int kvrail_export_region(kvrail_client* client, uint64_t region_id, const char* peer_node,
                         uint8_t** out, size_t* out_len);

/* --- Notifications (TransferSpec.notification) ------------------------------------------------ */
/* Notifications queued for this client's session (opened on first use), oldest first: at most
 * `max` (0: 256), waiting up to `timeout_ms` (0..60000; 0: do not wait) for the first. Out: a
 * serialized kvrail.v1.NotificationPollResponse (possibly with none). kvrail_submit fills the
 * spec's session_id with this client's open session when a notification is set, so a client is
 * not notified of its own transfers. */
int kvrail_poll_notifications(kvrail_client* client, uint32_t max, int64_t timeout_ms,
                              uint8_t** out, size_t* out_len);

/* --- Session lost ----------------------------------------------------------------------------- */
/* When kvraild stops or restarts, the regions (and transfers) of this client are gone. The
 * library notices when the daemon closes the session socket, when a new session names another
 * daemon instance, or when a call fails and the daemon's instance changed; from then on such calls
 * fail with KVRAIL_FAILED_PRECONDITION, message "session lost: ...", until
 * kvrail_reset_session. */
/* *lost = 1 when the session is lost, else 0. */
int kvrail_session_lost(kvrail_client* client, int* lost);
/* Forgets the lost session; the next call opens a new one (register regions again).
 * KVRAIL_UNAVAILABLE when the daemon does not answer. */
int kvrail_reset_session(kvrail_client* client);
/* Called once per loss with the "session lost" code and message (valid during the call only), on
 * whichever thread found it (often a library thread). It must not close the client or call
 * kvrail_reset_session itself; it may record the loss for the application. `fn` NULL removes the
 * callback. */
typedef void (*kvrail_session_lost_fn)(void* user, int code, const char* message);
int kvrail_on_session_lost(kvrail_client* client, kvrail_session_lost_fn fn, void* user);

/* --- CUDA readiness flags (layer-wise streaming from and to CUDA streams) --------------------- */
/* A flag array is 32-bit words in a registered host region (TransferSpec.ready_flags /
 * arrival_flags name the region, offset and epoch value). Mapping it for a GPU lets a producer
 * signal "layer i written" from its CUDA stream after the kernel that wrote the layer, and a
 * consumer make its stream wait until the daemon wrote layer i's arrival flag - no CPU round
 * trip per layer (cuStreamWriteValue32 / cuStreamWaitValue32 GEQ). */
typedef struct kvrail_cuda_flags kvrail_cuda_flags;

/* Pins and maps `count` words at `words` (4-byte aligned host memory, e.g. inside a
 * kvrail_host_buffer, which must outlive the mapping) for CUDA device `device`. The calling
 * thread's current device is unchanged. Without a GPU or driver: the CUDA error (INTERNAL or
 * FAILED_PRECONDITION) and *out = NULL. */
int kvrail_cuda_flags_map(void* words, uint32_t count, int device, kvrail_cuda_flags** out);
/* Unmaps (unpins) the words. NULL and a second free are no-ops. */
void kvrail_cuda_flags_free(kvrail_cuda_flags* flags);
/* Enqueues "words[index] = value" on `stream` (a cudaStream_t / CUstream, e.g. torch's
 * `torch.cuda.current_stream().cuda_stream`; NULL is the legacy default stream): it happens after
 * all earlier work of the stream. OUT_OF_RANGE for index >= count. */
int kvrail_cuda_flags_signal(kvrail_cuda_flags* flags, void* stream, uint32_t index,
                             uint32_t value);
/* Enqueues on `stream` a wait until words[index] >= value (32-bit, GEQ); later work of the stream
 * starts only then. OUT_OF_RANGE for index >= count. */
int kvrail_cuda_flags_wait(kvrail_cuda_flags* flags, void* stream, uint32_t index, uint32_t value);

#ifdef __cplusplus
}
#endif

#endif /* KVRAIL_C_API_KVRAIL_H_ */

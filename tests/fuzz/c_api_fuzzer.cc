// libFuzzer target: the C ABI's argument checks (client/c_api/kvrail.h), without a daemon. The
// input is a sequence of operations, each picked by one byte:
//   layout:  a kvrail_paged_layout (raw bytes, or shaped: small dimensions, strides or an order)
//            through kvrail_paged_layout_check and kvrail_paged_layout_bytes. Accepted: the
//            bytes it spans fit region_bytes, equal the end of its last element (explicit
//            strides), and it is refused one byte short; refused: INVALID_ARGUMENT naming
//            "layout." or "flags", bytes 0.
//   create:  kvrail_host_buffer_create with a fuzzed size and name: > 0 bytes give a zeroed,
//            writable buffer of that size (ASan sees a byte past it), 0 is refused.
//   free:    a buffer of this input, or a fuzzed handle, freed (twice); afterwards it is dead.
//   client:  calls on a client handle that is not live (no client is ever issued here) with
//            fuzzed arguments and out-parameters holding garbage: every one INVALID_ARGUMENT,
//            every out-parameter cleared; the fixed-size structs (kvrail_submitted,
//            kvrail_transfer_end, kvrail_spec_submit, kvrail_end_wait) cleared at this library's
//            sizes (kvrail_spec_submit's also at its size without `end`, nothing written past
//            it) and untouched at any other; kept specs never issued refused.
//   flags:   the CUDA flag calls with handles that are not live and arguments they must refuse.
//   misc:    kvrail_free(NULL), the ABI version, kvrail_connect without an out-parameter.
// After every call the thread's last error holds its code, and a message exactly when it failed.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "client/c_api/kvrail.h"

namespace {

void CheckAt(bool ok, int line) {
  if (!ok) {
    std::fprintf(stderr, "check failed at %s:%d (last error %d: %s)\n", __FILE__, line,
                 kvrail_last_error_code(), kvrail_last_error_message());
    __builtin_trap();  // a finding: libFuzzer saves the input
  }
}
#define Check(ok) CheckAt((ok), __LINE__)

// The input, read front to back; past its end every read is zeros.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  template <typename T>
  T Take() {
    T value{};
    const size_t n = pos_ < size_ ? std::min(sizeof(T), size_ - pos_) : 0;
    if (n > 0) std::memcpy(&value, data_ + pos_, n);
    pos_ += sizeof(T);
    return value;
  }
  // Up to `max` bytes, as they are.
  std::string Bytes(size_t max) {
    const size_t want = Take<uint8_t>() % (max + 1);
    const size_t n = pos_ < size_ ? std::min(want, size_ - pos_) : 0;
    std::string out(reinterpret_cast<const char*>(data_ + std::min(pos_, size_)), n);
    pos_ += n;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// The call's code is the thread's last error; a message exactly when it failed.
int Checked(int code) {
  Check(kvrail_last_error_code() == code);
  const std::string message = kvrail_last_error_message();
  Check((code == KVRAIL_OK) == message.empty());
  return code;
}

bool StartsWith(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

uint64_t DtypeBytes(int32_t dtype) {
  switch (dtype) {
    case 1:
    case 2:
      return 2;  // BF16, FP16
    case 3:
      return 4;  // FP32
    case 4:
    case 5:
    case 6:
    case 7:
      return 1;
    default:
      return 0;
  }
}

kvrail_paged_layout FuzzLayout(Input& in) {
  kvrail_paged_layout layout{};
  const uint8_t shape = in.Take<uint8_t>();
  if (shape & 1) {
    layout = in.Take<kvrail_paged_layout>();
    if (shape & 2) layout.struct_size = sizeof(layout);
    return layout;
  }
  layout.struct_size = (shape & 2) ? in.Take<uint32_t>() : sizeof(layout);
  layout.num_layers = in.Take<uint8_t>() % 9;
  layout.num_parts = in.Take<uint8_t>() % 4;
  layout.num_blocks = in.Take<uint8_t>() % 17;
  layout.tokens_per_block = in.Take<uint8_t>() % 17;
  layout.num_heads = in.Take<uint8_t>() % 9;
  layout.head_dim = in.Take<uint8_t>() % 33;
  layout.dtype = in.Take<uint8_t>() % 9;
  layout.order = in.Take<uint8_t>() % 7;
  if (shape & 4) {  // explicit strides, small multiples
    layout.layer_stride = uint64_t{in.Take<uint16_t>()} * 2;
    layout.part_stride = uint64_t{in.Take<uint16_t>()} * 2;
    layout.block_stride = uint64_t{in.Take<uint16_t>()} * 2;
    layout.token_stride = uint64_t{in.Take<uint8_t>()} * 2;
    layout.head_stride = uint64_t{in.Take<uint8_t>()} * 2;
  }
  if (shape & 8) layout.offset_bytes = in.Take<uint16_t>();
  if (shape & 16) layout.num_blocks = in.Take<uint32_t>();  // large ones too
  return layout;
}

void FuzzLayoutCheck(Input& in) {
  const kvrail_paged_layout layout = FuzzLayout(in);
  const uint8_t how = in.Take<uint8_t>();
  const uint32_t flags = (how & 1) ? in.Take<uint32_t>() : (how >> 1) & KVRAIL_LAYOUT_PER_LAYER;
  const uint64_t region_bytes = (how & 4) ? in.Take<uint64_t>() : 0;
  uint64_t bytes = ~uint64_t{0};
  const int code = Checked(kvrail_paged_layout_check(&layout, region_bytes, flags, &bytes));
  if (code != KVRAIL_OK) {
    Check(code == KVRAIL_INVALID_ARGUMENT);
    Check(bytes == 0);
    const std::string message = kvrail_last_error_message();
    Check(StartsWith(message, "layout") || StartsWith(message, "flags"));
    return;
  }
  Check(bytes > 0);
  if (region_bytes != 0) Check(bytes <= region_bytes);
  // The same bytes with the region exactly that size; one byte short is refused.
  uint64_t again = 0;
  Check(Checked(kvrail_paged_layout_check(&layout, bytes, flags, &again)) == KVRAIL_OK);
  Check(again == bytes);
  if (bytes > 1) {
    Check(Checked(kvrail_paged_layout_check(&layout, bytes - 1, flags, &again)) ==
          KVRAIL_INVALID_ARGUMENT);
  }
  if (flags == 0) {
    uint64_t plain = 0;
    Check(Checked(kvrail_paged_layout_bytes(&layout, &plain)) == KVRAIL_OK);
    Check(plain == bytes);
  }
  // Explicit strides: the end of the last element (strides are unsigned, so it is the last).
  const bool explicit_strides = layout.layer_stride | layout.part_stride | layout.block_stride |
                                layout.token_stride | layout.head_stride;
  if (explicit_strides) {
    const uint64_t layers = (flags & KVRAIL_LAYOUT_PER_LAYER) ? 1 : layout.num_layers;
    const unsigned __int128 end =
        static_cast<unsigned __int128>(layout.offset_bytes) +
        static_cast<unsigned __int128>(layers - 1) * layout.layer_stride +
        static_cast<unsigned __int128>(layout.num_parts - 1) * layout.part_stride +
        static_cast<unsigned __int128>(layout.num_blocks - 1) * layout.block_stride +
        static_cast<unsigned __int128>(layout.tokens_per_block - 1) * layout.token_stride +
        static_cast<unsigned __int128>(layout.num_heads - 1) * layout.head_stride +
        static_cast<unsigned __int128>(layout.head_dim) * DtypeBytes(layout.dtype);
    Check(end == bytes);
  }
  Check(Checked(kvrail_paged_layout_check(nullptr, 0, 0, nullptr)) == KVRAIL_INVALID_ARGUMENT);
  Check(Checked(kvrail_paged_layout_bytes(&layout, nullptr)) == KVRAIL_INVALID_ARGUMENT);
}

// The buffers this input created and has not freed.
struct Buffers {
  std::vector<kvrail_host_buffer*> live;
  bool IsLive(kvrail_host_buffer* handle) const {
    for (kvrail_host_buffer* b : live) {
      if (b == handle) return true;
    }
    return false;
  }
};

void CheckDead(kvrail_host_buffer* handle) {
  Check(kvrail_host_buffer_data(handle) == nullptr);
  Check(Checked(kvrail_last_error_code()) == KVRAIL_INVALID_ARGUMENT);
  Check(kvrail_host_buffer_size(handle) == 0);
  Check(Checked(kvrail_last_error_code()) == KVRAIL_INVALID_ARGUMENT);
}

void FuzzCreate(Input& in, Buffers& buffers) {
  const uint64_t bytes = uint64_t{in.Take<uint16_t>()} * (1 + in.Take<uint8_t>() % 16);
  const std::string name = in.Bytes(40);  // may hold NULs and control bytes: cut at the first NUL
  kvrail_host_buffer* out = reinterpret_cast<kvrail_host_buffer*>(uintptr_t{0x5a5a});
  const int code = Checked(kvrail_host_buffer_create(bytes, name.c_str(), &out));
  if (bytes == 0) {
    Check(code == KVRAIL_INVALID_ARGUMENT);
    Check(out == nullptr);
    return;
  }
  if (code != KVRAIL_OK) {  // out of memory or descriptors: nothing issued
    Check(out == nullptr);
    return;
  }
  Check(out != nullptr);
  Check(!buffers.IsLive(out));  // handles are never reused
  auto* data = static_cast<uint8_t*>(kvrail_host_buffer_data(out));
  Check(data != nullptr);
  Check(kvrail_host_buffer_size(out) == bytes);
  Check(data[0] == 0 && data[bytes - 1] == 0);
  data[0] = 1;
  data[bytes - 1] = 1;
  buffers.live.push_back(out);
  if (buffers.live.size() > 4) {
    kvrail_host_buffer_free(buffers.live.front());
    CheckDead(buffers.live.front());
    buffers.live.erase(buffers.live.begin());
  }
}

void FuzzFree(Input& in, Buffers& buffers) {
  const uint8_t which = in.Take<uint8_t>();
  kvrail_host_buffer* handle = nullptr;
  if (!buffers.live.empty() && (which & 1)) {
    const size_t i = (which >> 1) % buffers.live.size();
    handle = buffers.live[i];
    buffers.live.erase(buffers.live.begin() + static_cast<std::ptrdiff_t>(i));
  } else {
    handle = reinterpret_cast<kvrail_host_buffer*>(static_cast<uintptr_t>(in.Take<uint64_t>()));
    if (buffers.IsLive(handle)) return;  // a fuzzed number that is one of ours: not a finding
  }
  kvrail_host_buffer_free(handle);
  kvrail_host_buffer_free(handle);  // a second free is a no-op
  CheckDead(handle);
}

// Garbage in every out-parameter; each must be cleared by a refused call.
struct Outs {
  uint64_t id = 0xdeadbeef;
  uint8_t* bytes = reinterpret_cast<uint8_t*>(uintptr_t{0xbad});
  size_t len = 77;
  int32_t state = 42;
  int number = 42;
};

void FuzzClientCall(Input& in, const Buffers& buffers) {
  const uint8_t which = in.Take<uint8_t>();
  kvrail_client* client =
      (which & 0x80)
          ? nullptr
          : reinterpret_cast<kvrail_client*>(static_cast<uintptr_t>(in.Take<uint64_t>()));
  kvrail_host_buffer* buffer =
      buffers.live.empty() ? reinterpret_cast<kvrail_host_buffer*>(uintptr_t{in.Take<uint16_t>()})
                           : buffers.live[in.Take<uint8_t>() % buffers.live.size()];
  const std::string spec = in.Bytes(64);
  const auto* spec_bytes = reinterpret_cast<const uint8_t*>(spec.data());
  const uint64_t id = in.Take<uint64_t>();
  const uint32_t n = in.Take<uint8_t>() % 9;
  std::vector<uint64_t> ids(n, id);
  std::vector<uint32_t> blocks(n, static_cast<uint32_t>(id));
  std::vector<int32_t> states(n, 7), codes(n, 7);
  const std::string text = in.Bytes(32);
  Outs o;
  // With bit 6 the optional byte outputs are not wanted (NULL).
  uint8_t** bytes_out = (which & 0x40) ? nullptr : &o.bytes;
  int code = KVRAIL_OK;
  bool bytes_reset = true;  // the call gets as far as clearing its byte output
  constexpr int kClientCalls = 27;
  switch (which % kClientCalls) {
    case 0:
      code = kvrail_session_id(client, &o.id);
      Check(o.id == 0);
      break;
    case 1:
      code = kvrail_register_host_buffer(client, buffer, spec_bytes, spec.size(), &o.id, bytes_out,
                                         &o.len);
      Check(o.id == 0);
      break;
    case 2:
      code = kvrail_register_host_fd(client, static_cast<int>(id), id >> 32, id, spec_bytes,
                                     spec.size(), &o.id, bytes_out, &o.len);
      Check(o.id == 0);
      break;
    case 3:
      code = kvrail_register_region(client, spec_bytes, spec.size(), &o.id, bytes_out, &o.len);
      Check(o.id == 0);
      break;
    case 4:
      code = kvrail_unregister_region(client, id);
      break;
    case 5: {
      const kvrail_paged_layout layout = FuzzLayout(in);
      code = kvrail_register_paged_host(client, buffer, &layout, static_cast<int>(n), text.c_str(),
                                        &o.id);
      Check(o.id == 0);
      break;
    }
    case 6:
      code = kvrail_submit(client, spec_bytes, spec.size(), &o.id, bytes_out, &o.len);
      Check(o.id == 0);
      break;
    case 7:
      code = kvrail_submit_blocks(client, spec_bytes, spec.size(), blocks.data(), n,
                                  (which & 0x20) ? nullptr : blocks.data(), n, &o.id, bytes_out,
                                  &o.len);
      Check(o.id == 0);
      break;
    case 8:
      code = kvrail_wait(client, id, static_cast<int64_t>(id) % 1000, &o.state, bytes_out, &o.len);
      Check(o.state == KVRAIL_STATE_UNSPECIFIED);
      break;
    case 9:
      code = kvrail_get(client, id, &o.state, bytes_out, &o.len);
      Check(o.state == KVRAIL_STATE_UNSPECIFIED);
      break;
    case 10:
      code = kvrail_cancel(client, id, &o.state, bytes_out, &o.len);
      Check(o.state == KVRAIL_STATE_UNSPECIFIED);
      break;
    case 11:
      code = kvrail_mark_ready(client, id, n, static_cast<uint32_t>(id));
      break;
    case 12:
      code = kvrail_poll(client, (which & 0x20) ? nullptr : ids.data(), n, states.data(),
                         codes.data());
      break;
    case 13:
      code = kvrail_completion_fd(client, &o.number);
      Check(o.number == -1);
      break;
    case 14:
      code = kvrail_take_completions(client, ids.data(), n, &o.len);
      Check(o.len == 0);
      break;
    case 15:
      code = kvrail_list_transfers(client, states.data(), n, static_cast<uint32_t>(id), bytes_out,
                                   &o.len);
      break;
    case 16:
      code =
          kvrail_create_grant(client, id, static_cast<int32_t>(n), id, n, n + 1, bytes_out, &o.len);
      break;
    case 17:
      code = kvrail_revoke_grant(client, (which & 0x20) ? nullptr : text.c_str());
      break;
    case 18:
      code = kvrail_export_region(client, id, (which & 0x20) ? nullptr : text.c_str(), bytes_out,
                                  &o.len);
      break;
    case 19:
      code =
          kvrail_poll_notifications(client, n, static_cast<int64_t>(id % 100), bytes_out, &o.len);
      break;
    case 20: {  // the fixed-size submit: a struct of this library's size is cleared, any other
                // size is refused without a byte written into it
      kvrail_submitted submitted;
      std::memset(&submitted, 0x5a, sizeof(submitted));
      submitted.struct_size = (which & 0x20) ? in.Take<uint32_t>() : sizeof(submitted);
      const kvrail_submitted before = submitted;
      code = kvrail_submit_blocks_short(client, spec_bytes, spec.size(), blocks.data(), n,
                                        (which & 0x40) ? nullptr : blocks.data(), n,
                                        (which & 0x10) ? nullptr : &submitted);
      if (submitted.struct_size == sizeof(submitted) && !(which & 0x10)) {
        Check(submitted.transfer_id == 0 && submitted.bytes_total == 0 &&
              submitted.tiles_total == 0 && submitted.followed == 0);
      } else {
        Check(std::memcmp(&submitted, &before, sizeof(submitted)) == 0);
      }
      break;
    }
    case 21: {  // the fixed-size end: cleared as the submit's, its status bytes too
      kvrail_transfer_end end;
      std::memset(&end, 0x5a, sizeof(end));
      end.struct_size = (which & 0x20) ? in.Take<uint32_t>() : sizeof(end);
      const kvrail_transfer_end before = end;
      code = kvrail_wait_end_short(client, id, static_cast<int64_t>(id) % 1000,
                                   (which & 0x10) ? nullptr : &end, bytes_out, &o.len);
      if (end.struct_size == sizeof(end) && !(which & 0x10)) {
        Check(end.transfer_id == 0 && end.state == 0 && end.flags == 0 && end.bytes_done == 0);
      } else {
        bytes_reset = false;  // refused before its byte output is touched
        Check(std::memcmp(&end, &before, sizeof(end)) == 0);
      }
      break;
    }
    case 23: {  // a kept spec of a client that is not live: nothing issued
      kvrail_spec* out = reinterpret_cast<kvrail_spec*>(uintptr_t{0x5a5a});
      code = kvrail_spec_create(client, spec_bytes, spec.size(), (which & 0x10) ? nullptr : &out);
      if (!(which & 0x10)) Check(out == nullptr);
      break;
    }
    case 24:  // a kept spec's handle that was never issued (NULL frees nothing: not asked here)
      code = kvrail_spec_free(reinterpret_cast<kvrail_spec*>(static_cast<uintptr_t>(id | 1)));
      break;
    case 25: {  // a submit of a kept spec never issued: refused before its ids are read
      kvrail_spec_submit submit;
      std::memset(&submit, 0x5a, sizeof(submit));
      submit.struct_size = (which & 0x20) ? in.Take<uint32_t>() : sizeof(submit);
      submit.src_count = n / 2;
      submit.dst_count = n - n / 2;
      submit.spec =
          (which & 0x40) ? nullptr : reinterpret_cast<kvrail_spec*>(static_cast<uintptr_t>(id));
      submit.ids = blocks.data();  // n ids: what the counts ask for
      const kvrail_spec_submit before = submit;
      code = kvrail_submit_spec((which & 0x10) ? nullptr : &submit);
      // Two sizes are known: the whole struct, and the one before `end` existed (nothing past
      // it is written then).
      constexpr size_t kOlder = offsetof(kvrail_spec_submit, end);
      const bool known = submit.struct_size == sizeof(submit) || submit.struct_size == kOlder;
      if (known && !(which & 0x10)) {
        Check(submit.submitted.transfer_id == 0 && submit.submitted.bytes_total == 0 &&
              submit.submitted.struct_size == sizeof(kvrail_submitted));
        if (submit.struct_size == sizeof(submit)) {
          Check(submit.end.state == 0 && submit.end_len == 0 &&
                submit.end.struct_size == sizeof(kvrail_transfer_end));
        } else {
          Check(std::memcmp(&submit.end, &before.end, sizeof(submit) - kOlder) == 0);
        }
      } else {
        Check(std::memcmp(&submit, &before, sizeof(submit)) == 0);
      }
      break;
    }
    case 26: {  // an end read into the caller's struct: its answer left empty
      kvrail_end_wait wait;
      std::memset(&wait, 0x5a, sizeof(wait));
      wait.struct_size = (which & 0x20) ? in.Take<uint32_t>() : sizeof(wait);
      wait.client = client;
      wait.transfer_id = id;
      wait.timeout_ms = static_cast<int64_t>(id) % 1000;
      const kvrail_end_wait before = wait;
      code = kvrail_wait_end_into((which & 0x10) ? nullptr : &wait);
      if (wait.struct_size == sizeof(wait) && !(which & 0x10)) {
        Check(wait.len == 0 && wait.heap == nullptr);
      } else {
        Check(std::memcmp(&wait, &before, sizeof(wait)) == 0);
      }
      break;
    }
    default: {  // many ends at once: any `max` (huge ones too) with a small array
      kvrail_transfer_end ends[4];
      std::memset(ends, 0x5a, sizeof(ends));
      ends[0].struct_size = (which & 0x20) ? in.Take<uint32_t>() : sizeof(kvrail_transfer_end);
      const size_t max = (which & 0x10) ? in.Take<uint64_t>() : n % 5;
      code = kvrail_take_ends(client, (which & 0x40) ? nullptr : ends, max, &o.len);
      Check(o.len == 0);
      break;
    }
  }
  Checked(code);
  Check(code == KVRAIL_INVALID_ARGUMENT);
  // A wanted byte output is cleared before anything can fail.
  const int call = which % kClientCalls;
  if (bytes_out != nullptr && bytes_reset && call != 4 && call != 5 && call != 11 && call != 12 &&
      call != 13 && call != 14 && call != 17 && call != 0 && call != 20 && call != 22 &&
      call < 23) {
    Check(o.bytes == nullptr);
    Check(o.len == 0);
  }
}

void FuzzFlags(Input& in) {
  auto* flags = reinterpret_cast<kvrail_cuda_flags*>(static_cast<uintptr_t>(in.Take<uint64_t>()));
  const uint32_t index = in.Take<uint32_t>();
  const uint32_t value = in.Take<uint32_t>();
  // No flag array is ever mapped here: every handle is dead.
  Check(Checked(kvrail_cuda_flags_signal(flags, nullptr, index, value)) == KVRAIL_INVALID_ARGUMENT);
  Check(Checked(kvrail_cuda_flags_wait(flags, nullptr, index, value)) == KVRAIL_INVALID_ARGUMENT);
  kvrail_cuda_flags_free(flags);
  // Arguments refused before CUDA is asked: no words, a negative device, no out-parameter.
  kvrail_cuda_flags* out = flags;
  Check(Checked(kvrail_cuda_flags_map(nullptr, index, 0, &out)) == KVRAIL_INVALID_ARGUMENT);
  Check(out == nullptr);
  uint32_t words[4] = {};
  const int device = -1 - static_cast<int>(value % 1000);
  Check(Checked(kvrail_cuda_flags_map(words, 4, device, &out)) == KVRAIL_INVALID_ARGUMENT);
  Check(Checked(kvrail_cuda_flags_map(words, 4, 0, nullptr)) == KVRAIL_INVALID_ARGUMENT);
}

void FuzzMisc(Input& in) {
  kvrail_free(nullptr);
  Check(kvrail_abi_version() == KVRAIL_ABI_VERSION);
  const std::string target = in.Bytes(32);
  Check(Checked(kvrail_connect(target.c_str(), in.Take<int64_t>(), nullptr)) ==
        KVRAIL_INVALID_ARGUMENT);
  kvrail_close(nullptr);
  kvrail_close(reinterpret_cast<kvrail_client*>(static_cast<uintptr_t>(in.Take<uint64_t>())));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  Buffers buffers;
  for (int ops = 0; !in.empty() && ops < 64; ++ops) {
    switch (in.Take<uint8_t>() % 6) {
      case 0:
        FuzzLayoutCheck(in);
        break;
      case 1:
        FuzzCreate(in, buffers);
        break;
      case 2:
        FuzzFree(in, buffers);
        break;
      case 3:
        FuzzClientCall(in, buffers);
        break;
      case 4:
        FuzzFlags(in);
        break;
      default:
        FuzzMisc(in);
        break;
    }
  }
  for (kvrail_host_buffer* b : buffers.live) {
    kvrail_host_buffer_free(b);
    CheckDead(b);
  }
  return 0;
}

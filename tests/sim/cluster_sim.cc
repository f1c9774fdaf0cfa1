#include "tests/sim/cluster_sim.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <queue>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "daemon/job/job.h"
#include "daemon/planner/planner.h"
#include "daemon/scheduler/tile_queues.h"
#include "proto/kvrail/v1/transfer.pb.h"

namespace kvrail::sim {

Workload SyntheticWorkload(const WorkloadOptions& options) {
  Workload w;
  std::mt19937_64 rng(options.seed);
  std::exponential_distribution<double> gap(options.rate_per_s > 0 ? options.rate_per_s : 1);
  std::lognormal_distribution<double> len(std::log(std::max(1.0, options.median_tokens)),
                                          options.sigma);
  for (double t = gap(rng); t < options.seconds; t += gap(rng)) {
    double n = std::round(len(rng));
    n = std::min<double>(std::max<double>(n, options.min_tokens), options.max_tokens);
    w.requests.push_back(Request{t, static_cast<uint32_t>(n)});
  }
  return w;
}

std::string WorkloadToCsv(const Workload& workload) {
  std::string out = "arrival_s,prompt_tokens\n";
  for (const Request& r : workload.requests) {
    absl::StrAppend(&out, absl::StrFormat("%.9f,%u\n", r.arrival_s, r.prompt_tokens));
  }
  return out;
}

absl::StatusOr<Workload> WorkloadFromCsv(const std::string& text) {
  Workload w;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    ++line_no;
    if (line_no == 1 && absl::StartsWith(line, "arrival_s")) continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, ',');
    Request r;
    if (f.size() != 2 || !absl::SimpleAtod(f[0], &r.arrival_s) ||
        !absl::SimpleAtoi(f[1], &r.prompt_tokens) || r.prompt_tokens == 0 ||
        (!w.requests.empty() && r.arrival_s < w.requests.back().arrival_s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("workload line ", line_no,
                       ": want 'arrival_s,prompt_tokens' with non-decreasing "
                       "arrivals and tokens > 0"));
    }
    w.requests.push_back(r);
  }
  return w;
}

namespace {

using scheduler::RailNode;
using scheduler::RailRoute;

// A link: busy until `free_at`; reservations are made in tile order.
struct Link {
  double free_at = 0;
  double rate = 0;  // bytes/s of the last reservation
  double busy = 0;
  uint64_t bytes = 0;
};

// One GPU-to-GPU transfer as the sending engine sees it (the real engine interface).
class SimJob : public job::Job {
 public:
  SimJob(planner::Plan plan) : plan_(std::move(plan)) {}
  const planner::Plan& plan() const override { return plan_; }
  const uint8_t* src_base() const override { return nullptr; }
  uint8_t* dst_base() const override { return nullptr; }
  job::PriorityClass priority() const override { return job::PriorityClass::kNormal; }
  bool MayGetMoreTiles() const override { return released_layers < plan_.num_layers(); }
  void OnTileStart(uint32_t) override {}
  void OnTileDone(uint32_t, const absl::Status&) override { ++tiles_done; }

  planner::Plan plan_;
  RailRoute route;
  scheduler::LaneStriper striper{route};  // reset once the route is chosen
  int request = -1;
  int src_node = -1, src_gpu = -1, dst_node = -1, dst_gpu = -1;
  uint32_t released_layers = 0;
  uint32_t tiles_done = 0;
  double created = 0;
  std::vector<double> layer_ready;  // when each layer's tiles were released
};

struct Engine {  // the sending side of one GPU
  scheduler::TileQueues queues;
  int inflight = 0;
};

struct Instance {  // a prefill instance
  int node = 0, first_gpu = 0;
  double free_at = 0;
  double busy = 0;
};

struct Req {
  double prefill_start = 0, prefill_end = 0;
  int prefill = -1;
  int jobs_left = 0;
  double done = 0;
  std::vector<std::shared_ptr<SimJob>> jobs;
};

enum class Ev : uint8_t { kArrival, kPrefillStart, kLayer, kTileDone };
struct Event {
  double t;
  uint64_t seq;
  Ev kind;
  int a;        // request / engine
  uint32_t b;   // layer / tile
  SimJob* job;  // tile done
  int lane;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

// Quantiles without keeping samples (an hour of 1,024 GPUs is ~10^8 tiles): log-spaced buckets,
// 200 per decade from 1 ns to 10^5 s (relative error under 1.2%).
class Histogram {
 public:
  void Add(double v) {
    ++count_;
    max_ = std::max(max_, v);
    int b = v <= kMin ? 0 : static_cast<int>(std::log10(v / kMin) * kPerDecade) + 1;
    b = std::min(b, kBuckets - 1);
    ++buckets_[b];
  }
  Percentiles Summarize() const {
    Percentiles p;
    p.count = count_;
    p.max = max_;
    p.p50 = Quantile(0.5);
    p.p99 = Quantile(0.99);
    return p;
  }

 private:
  static constexpr double kMin = 1e-9;
  static constexpr int kPerDecade = 200;
  static constexpr int kBuckets = 14 * kPerDecade + 2;
  double Quantile(double q) const {
    if (count_ == 0) return 0;
    const uint64_t want = static_cast<uint64_t>(std::ceil(q * count_));
    uint64_t seen = 0;
    for (int b = 0; b < kBuckets; ++b) {
      seen += buckets_[b];
      if (seen >= want && buckets_[b] > 0) {
        // The bucket's upper edge (the value is at most this), never above the max seen.
        // (Bucket 0 holds values <= 1 ns: reported as 0.)
        return std::min(max_, b == 0 ? 0.0 : kMin * std::pow(10.0, double(b) / kPerDecade));
      }
    }
    return max_;
  }
  std::vector<uint64_t> buckets_ = std::vector<uint64_t>(kBuckets, 0);
  uint64_t count_ = 0;
  double max_ = 0;
};

class Simulation {
 public:
  Simulation(const SimConfig& c, const Workload& w, RailNode node)
      : c_(c), w_(w), node_(std::move(node)) {}

  absl::StatusOr<SimReport> Run();

 private:
  absl::Status Check();
  absl::Status StartPrefill(int r, double now);
  void ReleaseLayer(int r, uint32_t layer, double now);
  void Pump(int engine, double now);
  void Dispatch(int engine, SimJob* job, uint32_t tile, double now);
  void TileDone(int engine, SimJob* job, uint32_t tile, double now);
  void Push(double t, Ev kind, int a, uint32_t b = 0, SimJob* job = nullptr, int lane = -1) {
    queue_.push(Event{t, seq_++, kind, a, b, job, lane});
  }
  int Gpus() const { return static_cast<int>(node_.gpus.size()); }
  Link& Egress(int node, int nic) { return egress_[node * node_.nics.size() + nic]; }
  Link& Ingress(int node, int nic) { return ingress_[node * node_.nics.size() + nic]; }
  Link& NvLink(int node, int gpu) { return nvlink_[node * Gpus() + gpu]; }
  // The router's live load: bytes a NIC link has been given and not yet put on the wire
  // (reservations past `now`, at the lane rate they were made with).
  uint64_t Backlog(const Link& link, double now) const {
    return link.free_at > now ? static_cast<uint64_t>((link.free_at - now) * link.rate) : 0;
  }

  const SimConfig& c_;
  const Workload& w_;
  const RailNode node_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue_;
  uint64_t seq_ = 0;
  std::vector<Link> egress_, ingress_, nvlink_;
  std::vector<Engine> engines_;  // per node x GPU
  std::vector<Instance> prefills_;
  std::vector<std::pair<int, int>> decodes_;  // (node, first GPU)
  size_t next_decode_ = 0;
  std::vector<Req> reqs_;
  planner::RegionView src_region_, dst_region_;
  std::vector<uint32_t> next_block_;  // per node x GPU: ring block allocator
  std::vector<uint32_t> scratch_;     // tile ids of a layer being released
  SimReport report_;
  Histogram transfer_s_, handover_s_, tile_wait_s_;
  int examples_ = 0;
};

absl::Status Simulation::Check() {
  const int g = Gpus();
  if (c_.nodes < 2) return absl::InvalidArgumentError("nodes: at least 2");
  if (c_.prefill_nodes < 1 || c_.prefill_nodes >= c_.nodes) {
    return absl::InvalidArgumentError("prefill_nodes: in [1, nodes)");
  }
  for (auto [name, tp] :
       {std::pair<const char*, int>{"prefill_tp", c_.prefill_tp}, {"decode_tp", c_.decode_tp}}) {
    if (tp < 1 || g % tp != 0 || c_.model.kv_heads % tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", tp, " must divide the node's ", g,
                                                     " GPUs and the model's ", c_.model.kv_heads,
                                                     " KV heads"));
    }
  }
  if (c_.model.dtype_bytes != 1 && c_.model.dtype_bytes != 2 && c_.model.dtype_bytes != 4) {
    return absl::InvalidArgumentError("model.dtype_bytes: 1, 2 or 4");
  }
  if (c_.model.layers < 1 || c_.model.head_dim < 1 || c_.model.tokens_per_block < 1) {
    return absl::InvalidArgumentError("model: layers, head_dim and tokens_per_block must be > 0");
  }
  if (c_.prefill_tokens_per_s <= 0) {
    return absl::InvalidArgumentError("prefill_tokens_per_s: must be > 0");
  }
  if (c_.inflight_tiles < 1) return absl::InvalidArgumentError("inflight_tiles: at least 1");
  return absl::OkStatus();
}

absl::StatusOr<planner::RegionView> Region(const ModelShape& m, int tp, bool writable) {
  v1::PagedKvLayout p;
  p.set_num_layers(m.layers);
  p.set_num_parts(2);
  p.set_num_blocks(65536);
  p.set_tokens_per_block(m.tokens_per_block);
  p.set_num_heads(m.kv_heads / tp);
  p.set_head_dim(m.head_dim);
  p.set_dtype(m.dtype_bytes == 1   ? v1::DTYPE_FP8_E4M3
              : m.dtype_bytes == 4 ? v1::DTYPE_FP32
                                   : v1::DTYPE_BF16);
  p.set_order(v1::LAYOUT_ORDER_LAYER_PART_BLOCK_NHD);
  const uint64_t size = uint64_t{1} << 44;
  KVRAIL_ASSIGN_OR_RETURN(planner::KvLayout layout,
                          planner::ResolveLayout(p, size, "sim.region.paged_kv."));
  return planner::RegionView{size, writable, true, layout};
}

absl::StatusOr<SimReport> Simulation::Run() {
  KVRAIL_RETURN_IF_ERROR(Check());
  const auto wall0 = std::chrono::steady_clock::now();
  const int g = Gpus();
  const size_t nics = node_.nics.size();
  egress_.assign(c_.nodes * nics, Link{});
  ingress_.assign(c_.nodes * nics, Link{});
  nvlink_.assign(c_.nodes * g, Link{});
  engines_.resize(c_.nodes * g);
  next_block_.assign(c_.nodes * g, 0);
  for (int n = 0; n < c_.prefill_nodes; ++n) {
    for (int f = 0; f < g; f += c_.prefill_tp) prefills_.push_back(Instance{n, f, 0, 0});
  }
  for (int n = c_.prefill_nodes; n < c_.nodes; ++n) {
    for (int f = 0; f < g; f += c_.decode_tp) decodes_.push_back({n, f});
  }
  KVRAIL_ASSIGN_OR_RETURN(src_region_, Region(c_.model, c_.prefill_tp, false));
  KVRAIL_ASSIGN_OR_RETURN(dst_region_, Region(c_.model, c_.decode_tp, true));
  report_.rail_bytes.assign(nics, 0);
  reqs_.resize(w_.requests.size());
  report_.requests = w_.requests.size();
  for (size_t r = 0; r < w_.requests.size(); ++r) Push(w_.requests[r].arrival_s, Ev::kArrival, r);

  double now = 0;
  while (!queue_.empty()) {
    const Event e = queue_.top();
    queue_.pop();
    now = e.t;
    ++report_.events;
    switch (e.kind) {
      case Ev::kArrival: {
        // The prefill instance that is free first (join the shortest queue).
        int best = 0;
        for (size_t i = 1; i < prefills_.size(); ++i) {
          if (prefills_[i].free_at < prefills_[best].free_at) best = static_cast<int>(i);
        }
        Instance& inst = prefills_[best];
        const double service =
            c_.prefill_overhead_s + w_.requests[e.a].prompt_tokens / c_.prefill_tokens_per_s;
        Req& req = reqs_[e.a];
        req.prefill = best;
        req.prefill_start = std::max(now, inst.free_at);
        req.prefill_end = req.prefill_start + service;
        inst.free_at = req.prefill_end;
        inst.busy += service;
        Push(req.prefill_start, Ev::kPrefillStart, e.a);
        break;
      }
      case Ev::kPrefillStart:
        KVRAIL_RETURN_IF_ERROR(StartPrefill(e.a, now));
        break;
      case Ev::kLayer:
        ReleaseLayer(e.a, e.b, now);
        break;
      case Ev::kTileDone:
        TileDone(e.a, e.job, e.b, now);
        break;
    }
  }
  report_.sim_seconds = now;
  // Utilization and rails.
  double sum = 0;
  uint64_t count = 0;
  for (int n = 0; n < c_.prefill_nodes; ++n) {
    for (size_t k = 0; k < nics; ++k) {
      const double u = now > 0 ? Egress(n, k).busy / now : 0;
      sum += u;
      ++count;
      report_.egress_util_max = std::max(report_.egress_util_max, u);
    }
  }
  report_.egress_util_mean = count ? sum / count : 0;
  sum = 0;
  count = 0;
  for (int n = c_.prefill_nodes; n < c_.nodes; ++n) {
    for (size_t k = 0; k < nics; ++k) {
      const double u = now > 0 ? Ingress(n, k).busy / now : 0;
      sum += u;
      ++count;
      report_.ingress_util_max = std::max(report_.ingress_util_max, u);
    }
  }
  report_.ingress_util_mean = count ? sum / count : 0;
  for (int n = 0; n < c_.nodes; ++n) {
    for (size_t k = 0; k < nics; ++k) {
      report_.rail_bytes[node_.nics[k].rail] += Egress(n, k).bytes;
      report_.bytes_egress += Egress(n, k).bytes;
      report_.bytes_ingress += Ingress(n, k).bytes;
    }
    for (int gpu = 0; gpu < g; ++gpu) report_.bytes_nvlink += NvLink(n, gpu).bytes;
  }
  if (!report_.rail_bytes.empty()) {
    const auto [lo, hi] = std::minmax_element(report_.rail_bytes.begin(), report_.rail_bytes.end());
    double mean = 0;
    for (uint64_t b : report_.rail_bytes) mean += static_cast<double>(b);
    mean /= report_.rail_bytes.size();
    report_.rail_spread =
        mean > 0 ? (static_cast<double>(*hi) - static_cast<double>(*lo)) / mean : 0;
  }
  sum = 0;
  for (const Instance& i : prefills_) sum += now > 0 ? i.busy / now : 0;
  report_.prefill_util_mean = prefills_.empty() ? 0 : sum / prefills_.size();
  report_.transfer_s = transfer_s_.Summarize();
  report_.handover_s = handover_s_.Summarize();
  report_.tile_wait_s = tile_wait_s_.Summarize();
  report_.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return report_;
}

absl::Status Simulation::StartPrefill(int r, double now) {
  Req& req = reqs_[r];
  const Instance& inst = prefills_[req.prefill];
  const auto [dnode, dfirst] = decodes_[next_decode_];
  next_decode_ = (next_decode_ + 1) % decodes_.size();
  const uint32_t tokens = w_.requests[r].prompt_tokens;
  const uint32_t blocks = (tokens + c_.model.tokens_per_block - 1) / c_.model.tokens_per_block;
  const uint32_t hp = c_.model.kv_heads / c_.prefill_tp, hd = c_.model.kv_heads / c_.decode_tp;
  const uint32_t pool = src_region_.layout.num_blocks;
  auto take_blocks = [&](int node, int gpu, v1::TransferEndpoint* ep) {
    uint32_t& next = next_block_[node * Gpus() + gpu];
    for (uint32_t b = 0; b < blocks; ++b) ep->add_block_ids((next + b) % pool);
    next = (next + blocks) % pool;
  };
  planner::PlanOptions options;
  options.tile_bytes = c_.tile_bytes;
  // Every (prefill rank, decode rank) pair whose head ranges overlap moves the overlap.
  for (int pr = 0; pr < c_.prefill_tp; ++pr) {
    for (int dr = 0; dr < c_.decode_tp; ++dr) {
      const uint32_t lo = std::max(pr * hp, dr * hd), hi = std::min((pr + 1) * hp, (dr + 1) * hd);
      if (lo >= hi) continue;
      const int sgpu = inst.first_gpu + pr, dgpu = dfirst + dr;
      v1::TransferSpec spec;
      spec.mutable_src()->set_head_begin(lo - pr * hp);
      spec.mutable_dst()->set_head_begin(lo - dr * hd);
      spec.set_num_heads(hi - lo);
      spec.set_num_tokens(tokens);
      spec.set_layerwise(true);
      take_blocks(inst.node, sgpu, spec.mutable_src());
      take_blocks(dnode, dgpu, spec.mutable_dst());
      absl::StatusOr<planner::Plan> plan =
          planner::MakePlan(spec, src_region_, dst_region_, options);
      if (!plan.ok()) return plan.status();
      auto job = std::make_shared<SimJob>(*std::move(plan));
      job->request = r;
      job->src_node = inst.node;
      job->src_gpu = sgpu;
      job->dst_node = dnode;
      job->dst_gpu = dgpu;
      job->created = now;
      job->layer_ready.assign(job->plan().num_layers(), 0);
      scheduler::RailLoad load;
      if (c_.load_aware) {
        for (size_t k = 0; k < node_.nics.size(); ++k) {
          load.src_nics.push_back(Backlog(Egress(inst.node, k), now));
          load.dst_nics.push_back(Backlog(Ingress(dnode, k), now));
        }
      }
      scheduler::RailOptions ro = c_.routing;
      ro.bytes = job->plan().bytes_total();
      KVRAIL_ASSIGN_OR_RETURN(job->route,
                              scheduler::ChooseRailRoute(node_, sgpu, node_, dgpu, load, ro));
      const RailRoute& route = job->route;
      job->striper = scheduler::LaneStriper(route);
      if (route.path == v1::PATH_HIERARCHICAL)
        ++report_.routes_hierarchical;
      else
        ++report_.routes_fabric;
      report_.routes_cross_rail += route.cross_rail;
      if (examples_ < 6 && (examples_ < 3 || route.path == v1::PATH_HIERARCHICAL)) {
        ++examples_;
        absl::StrAppend(&report_.example_routes, "  node", inst.node, " -> node", dnode, ": ",
                        route.reason, "\n");
      }
      report_.bytes_planned += job->plan().bytes_total();
      report_.tiles += job->plan().num_tiles();
      ++report_.transfers;
      req.jobs.push_back(std::move(job));
    }
  }
  req.jobs_left = static_cast<int>(req.jobs.size());
  const double per_layer = (req.prefill_end - req.prefill_start) / c_.model.layers;
  for (uint32_t l = 0; l < c_.model.layers; ++l) Push(now + per_layer * (l + 1), Ev::kLayer, r, l);
  return absl::OkStatus();
}

void Simulation::ReleaseLayer(int r, uint32_t layer, double now) {
  Req& req = reqs_[r];
  for (const auto& job : req.jobs) {
    const uint32_t per = job->plan().tiles_per_layer();
    std::vector<uint32_t>& tiles = scratch_;  // reused: one allocation per run, not per layer
    tiles.resize(per);
    for (uint32_t i = 0; i < per; ++i) tiles[i] = layer * per + i;
    job->layer_ready[layer] = now;
    job->released_layers = layer + 1;
    const int e = job->src_node * Gpus() + job->src_gpu;
    engines_[e].queues.Add(job, tiles);
    Pump(e, now);
  }
}

void Simulation::Pump(int e, double now) {
  Engine& engine = engines_[e];
  while (engine.inflight < c_.inflight_tiles && !engine.queues.AllEmpty()) {
    int cls = 0;
    while (engine.queues.Empty(cls)) ++cls;
    auto taken = engine.queues.TakeFrom(cls, [](job::Job&, scheduler::TileRanges& tiles) {
      const uint32_t t = tiles.front();
      tiles.pop_front();
      return t;
    });
    ++engine.inflight;
    Dispatch(e, static_cast<SimJob*>(taken.first.get()), taken.second, now);
  }
}

void Simulation::Dispatch(int e, SimJob* job, uint32_t tile, double now) {
  const RailRoute& route = job->route;
  const planner::TileInfo info = job->plan().tile(tile);
  const double bytes = static_cast<double>(info.bytes);
  double t = now;
  if (route.src_exit_gpu != job->src_gpu) {  // NVLink relay on the sender
    Link& nv = NvLink(job->src_node, job->src_gpu);
    const double d = bytes / (node_.nvlink_gbps[job->src_gpu][route.src_exit_gpu] * 1e9);
    const double s = std::max(t, nv.free_at);
    nv.free_at = s + d;
    nv.busy += d;
    nv.bytes += info.bytes;
    t = s + d + c_.nvlink_latency_s;
  }
  // The lane the route's striping gives this tile (shares from the router's water-fill).
  const int best = job->striper.Next();
  const auto& lane = route.lanes[best];
  Link& out = Egress(job->src_node, lane.src_nic);
  Link& in = Ingress(job->dst_node, lane.dst_nic);
  const double d = bytes / (lane.gbps * 1e9);
  const double best_end = std::max({t, out.free_at, in.free_at}) + d;
  tile_wait_s_.Add(best_end - d - job->layer_ready[info.layer]);
  out.free_at = in.free_at = best_end;
  out.rate = in.rate = lane.gbps * 1e9;
  out.busy += d;
  in.busy += d;
  out.bytes += info.bytes;
  in.bytes += info.bytes;
  t = best_end + c_.nic_latency_s;
  if (route.dst_entry_gpu != job->dst_gpu) {  // NVLink relay on the receiver
    Link& nv = NvLink(job->dst_node, route.dst_entry_gpu);
    const double dn = bytes / (node_.nvlink_gbps[route.dst_entry_gpu][job->dst_gpu] * 1e9);
    const double s = std::max(t, nv.free_at);
    nv.free_at = s + dn;
    nv.busy += dn;
    nv.bytes += info.bytes;
    t = s + dn + c_.nvlink_latency_s;
  }
  Push(t, Ev::kTileDone, e, tile, job, best);
}

void Simulation::TileDone(int e, SimJob* job, uint32_t tile, double now) {
  const uint64_t bytes = job->plan().tile(tile).bytes;
  job->OnTileDone(tile, absl::OkStatus());
  report_.bytes_tiles_done += bytes;
  --engines_[e].inflight;
  if (job->tiles_done == job->plan().num_tiles()) {
    transfer_s_.Add(now - job->created);
    Req& req = reqs_[job->request];
    if (--req.jobs_left == 0) {
      req.done = now;
      ++report_.completed;
      handover_s_.Add(now - req.prefill_end);
      req.jobs.clear();  // frees the plans (and this job: nothing below touches it)
    }
  }
  Pump(e, now);
}

}  // namespace

absl::StatusOr<SimReport> RunSimulation(const SimConfig& config, const Workload& workload) {
  KVRAIL_ASSIGN_OR_RETURN(RailNode node, scheduler::BuildRailNode(config.node));
  if (node.gpus.empty()) return absl::InvalidArgumentError("node: the fixture has no GPU");
  Simulation sim(config, workload, std::move(node));
  return sim.Run();
}

std::string FormatReport(const SimReport& r) {
  auto pct = [](const Percentiles& p, double scale, const char* unit) {
    return absl::StrFormat("p50 %.3f %s, p99 %.3f %s, max %.3f %s (n=%u)", p.p50 * scale, unit,
                           p.p99 * scale, unit, p.max * scale, unit, p.count);
  };
  std::string out = absl::StrFormat(
      "requests %u, completed %u; transfers %u, tiles %u, events %u\n"
      "simulated %.1f s in %.1f s wall\n"
      "routes: fabric %u, hierarchical %u, cross-rail %u\n"
      "bytes: planned %u, tiles done %u, NIC egress %u, NIC ingress %u, NVLink relays %u\n"
      "prefill busy %.1f%%; NIC egress (prefill nodes) mean %.2f%% max %.2f%%; NIC ingress (decode "
      "nodes) mean %.2f%% max %.2f%%\n"
      "rail spread (max-min)/mean %.2f%%; bytes per rail:",
      r.requests, r.completed, r.transfers, r.tiles, r.events, r.sim_seconds, r.wall_seconds,
      r.routes_fabric, r.routes_hierarchical, r.routes_cross_rail, r.bytes_planned,
      r.bytes_tiles_done, r.bytes_egress, r.bytes_ingress, r.bytes_nvlink,
      100 * r.prefill_util_mean, 100 * r.egress_util_mean, 100 * r.egress_util_max,
      100 * r.ingress_util_mean, 100 * r.ingress_util_max, 100 * r.rail_spread);
  for (uint64_t b : r.rail_bytes) absl::StrAppend(&out, " ", absl::StrFormat("%.3g", b / 1e9), "G");
  absl::StrAppend(&out, "\ntransfer time: ", pct(r.transfer_s, 1e3, "ms"),
                  "\nKV handover after prefill: ", pct(r.handover_s, 1e3, "ms"),
                  "\ntile wait (produced -> on the wire): ", pct(r.tile_wait_s, 1e6, "us"),
                  "\nexample routes:\n", r.example_routes);
  return out;
}

}  // namespace kvrail::sim

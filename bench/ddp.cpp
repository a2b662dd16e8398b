// bench/ddp.cpp (mpi_bench_ddp): ddp_step, one data-parallel training step of an MLP with
// hone::data_parallel<hone::dist::mpi_comm>, run under mpirun (every rank one process, oneTBB
// limited to one thread per rank), for two models:
//   train_mlp  examples/train_mlp's model (its mlp<T> class: 2 -> 64 -> ReLU -> 64 -> ReLU -> 5,
//              4677 parameters), 64 samples per rank (train_mlp's global batch of 128 over 2
//              ranks)
//   mlp_16m    the same class at 1024 -> 3520 -> ReLU -> 3520 -> ReLU -> 10 (16,037,130
//              parameters), 32 samples per rank
// Both train in fp32 with AdamW (weight decay 0.01) and global-norm clipping at 1.0, as
// train_mlp does (its mixed precision, schedule and accumulation aside), on one fixed random
// batch per rank. Rows, interleaved in one run, the order rotated each repetition (--rotate
// shifts it, for a driver that starts one process per repetition):
//   ddp      trainer::step with hone::data_parallel(comm) (default buckets: 25 MiB, first 1 MiB);
//            the example's model does not report gradient readiness, so the reduction runs after
//            backward
//   local    the same trainer without it (local gradients: the compute alone)
//   reduce   data_parallel::reduce alone on an arena of the model's size (the communication)
//   overlap  the same network and kernels (reporting_mlp below: train_mlp's matrix loops, plain
//            loops for the element-wise steps) whose backward reports each parameter's gradient
//            final (hone::gradient_ready), so data_parallel starts a bucket's reduction during
//            backward (data_parallel_options::overlap_with_backward, the default)
//   olocal   reporting_mlp with local gradients
// exposed = (ddp - local) / ddp and (overlap - olocal) / overlap, per repetition: the fraction of
// the step spent on communication that compute does not hide.
//
// A sample is the time of a batch of steps divided by its steps, the slowest rank's (MPI_MAX after
// the batch), after a barrier, as bench/dist.cpp does. The batch is sized once per model, after
// one warm-up call of every row, from one timed ddp step: about --min-time seconds (at least one
// step).
//
//   scripts/bench-ddp                        # hone and the torch DDP peer alternated, the table
//   mpirun -np 2 build/bench/bench/mpi_bench_ddp [--model train_mlp|mlp_16m|all]
//       [--repetitions N] [--min-time S] [--hidden N] [--batch N] [--rotate K] [--json FILE]
// --hidden and --batch override every chosen model's hidden width and per-rank batch (CTest's
// smoke run uses tiny ones); --json appends one JSON object per model (rank 0) with the samples,
// for scripts/bench-ddp. The peer is bench/peers/torch_ddp.py (torch DistributedDataParallel
// over gloo, the same sizes). docs/dist.md ("Benchmark: ddp_step") says how to read the table.
#include <mpi.h>

#include <oneapi/tbb/global_control.h>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <hone/core/arena.hpp>
#include <hone/core/model.hpp>
#include <hone/dist/data_parallel.hpp>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/precision/policies.hpp>
#include <hone/train/trainer.hpp>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "support/mpi_rows.hpp"
#include "train_mlp/mlp.hpp"

namespace {

namespace hd = hone::dist;
using clock_type = std::chrono::steady_clock;

struct model_spec {
  const char* name;
  std::size_t inputs, hidden, classes, batch;  // batch: samples per rank and step
};

constexpr model_spec known_models[] = {
    {"train_mlp", 2, 64, 5, 64},
    {"mlp_16m", 1024, 3520, 10, 32},
};

enum row { ddp, local, reduce, overlap, olocal };
constexpr int rows = 5;
constexpr const char* row_names[rows] = {"ddp", "local", "reduce", "overlap", "olocal"};
constexpr const char* json_names[rows] = {"ddp_ms", "local_ms", "reduce_ms", "overlap_ms",
                                          "overlap_local_ms"};

/// examples/train_mlp's network (mlp_common.hpp's layout and initial weights, mlp.hpp's matrix
/// kernels) in fp32, whose backward reports each layer's weight and bias final as soon as both
/// are written (hone::gradient_ready), last layer first, as PyTorch's autograd hooks fire. The
/// element-wise steps (ReLU, softmax, bias sums) are plain loops instead of the example's xtensor
/// expressions.
class reporting_mlp {
  static constexpr std::size_t layers = train_mlp::mlp_layers;

 public:
  reporting_mlp(std::size_t inputs, std::size_t hidden, std::size_t classes, std::uint64_t seed)
      : sizes_{inputs, hidden, hidden, classes},
        layout_(train_mlp::mlp_layout(sizes_, sizeof(float))),
        values_(layout_),
        grads_(layout_) {
    const auto init = train_mlp::initial_weights(sizes_, seed);
    for (std::size_t l = 0; l < layers; ++l) {
      const auto w = values_.view(2 * l);
      std::copy(init[l].begin(), init[l].end(), w.begin());
    }
  }
  reporting_mlp(const reporting_mlp&) = delete;
  reporting_mlp& operator=(const reporting_mlp&) = delete;

  std::vector<hone::parameter<float>> parameters() {
    return train_mlp::mlp_parameters<float, hone::host_space>(layout_, sizes_, values_, grads_);
  }

  float forward_backward(const train_mlp::batch& b, float loss_scale, hone::gradient_ready ready) {
    namespace k = train_mlp::kernels;
    const std::size_t n = b.count();
    reserve(n);
    for (std::size_t l = 0; l < layers; ++l) {
      const std::size_t in = sizes_[l], out = sizes_[l + 1];
      const float* input = l == 0 ? b.x.data() : post_[l - 1].data();
      k::linear_forward(input, values_.view(2 * l).data(), values_.view(2 * l + 1).data(),
                        pre_[l].data(), n, in, out);
      if (l + 1 < layers) {
        for (std::size_t i = 0; i < n * out; ++i) post_[l][i] = std::max(pre_[l][i], 0.0f);
      }
    }
    // Softmax cross-entropy; d(loss * scale)/d(logits) = (softmax - onehot) * scale / n.
    const std::size_t c = sizes_[layers];
    const float s = loss_scale / static_cast<float>(n);
    double loss = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const float* z = pre_[layers - 1].data() + i * c;
      float* d = delta_[layers - 1].data() + i * c;
      const float zmax = *std::max_element(z, z + c);
      float sum = 0.0f;
      for (std::size_t j = 0; j < c; ++j) sum += (d[j] = std::exp(z[j] - zmax));
      const auto label = static_cast<std::size_t>(b.y[i]);
      loss += static_cast<double>(zmax) + std::log(static_cast<double>(sum)) -
              static_cast<double>(z[label]);
      for (std::size_t j = 0; j < c; ++j) d[j] = d[j] / sum * s;
      d[label] -= s;
    }
    for (std::size_t l = layers; l-- > 0;) {
      const std::size_t in = sizes_[l], out = sizes_[l + 1];
      const float* input = l == 0 ? b.x.data() : post_[l - 1].data();
      const float* dl = delta_[l].data();
      k::matmul_at_b(input, dl, grads_.view(2 * l).data(), n, in, out);
      float* gb = grads_.view(2 * l + 1).data();
      std::fill(gb, gb + out, 0.0f);
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = 0; j < out; ++j) gb[j] += dl[i * out + j];
      }
      ready(2 * l);  // this layer's weight and bias are final
      ready(2 * l + 1);
      if (l > 0) {
        k::matmul_a_bt(dl, values_.view(2 * l).data(), delta_[l - 1].data(), transposed_.data(), n,
                       in, out);
        for (std::size_t i = 0; i < n * in; ++i) {
          if (!(pre_[l - 1][i] > 0.0f)) delta_[l - 1][i] = 0.0f;  // ReLU'
        }
      }
    }
    return static_cast<float>(loss / static_cast<double>(n));
  }

 private:
  void reserve(std::size_t n) {
    for (std::size_t l = 0; l < layers; ++l) {
      pre_[l].resize(std::max(pre_[l].size(), n * sizes_[l + 1]));
      delta_[l].resize(std::max(delta_[l].size(), n * sizes_[l + 1]));
      if (l + 1 < layers) post_[l].resize(std::max(post_[l].size(), n * sizes_[l + 1]));
      transposed_.resize(std::max(transposed_.size(), sizes_[l] * sizes_[l + 1]));
    }
  }

  train_mlp::layer_sizes sizes_;
  hone::arena_layout layout_;
  hone::arena<float> values_, grads_;
  std::array<std::vector<float>, layers> pre_, post_, delta_;
  std::vector<float> transposed_;
};
static_assert(hone::reports_gradient_ready<reporting_mlp, train_mlp::batch>,
              "reporting_mlp must take a hone::gradient_ready in forward_backward so that "
              "data_parallel overlaps its reduction with backward.");

struct args {
  std::string model = "all";
  int repetitions = 5;
  double min_time = 0.3;
  std::size_t hidden = 0;  // 0: the model's own
  std::size_t batch = 0;   // 0: the model's own
  int rotate = 0;
  std::string json;
};

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr,
               "mpi_bench_ddp: %s\nusage: mpirun -np N mpi_bench_ddp [--model "
               "train_mlp|mlp_16m|all] [--repetitions N (>= 1, default 5)] [--min-time S "
               "(seconds per sample, > 0, default 0.3)] [--hidden N] [--batch N] [--rotate K] "
               "[--json FILE]\n",
               why.c_str());
  std::exit(2);
}

long long parse_integer(const std::string& flag, const char* text, long long lo) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < lo) {
    usage_error(flag + " needs an integer >= " + std::to_string(lo) + ", got '" + text + "'");
  }
  return v;
}

args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (i + 1 >= argc) usage_error("missing value after '" + s + "'");
    const char* v = argv[++i];
    if (s == "--model") {
      a.model = v;
      bool known = a.model == "all";
      for (const auto& m : known_models) known = known || a.model == m.name;
      if (!known) usage_error("--model must be train_mlp, mlp_16m or all, got '" + a.model + "'");
    } else if (s == "--repetitions") {
      a.repetitions = static_cast<int>(parse_integer(s, v, 1));
    } else if (s == "--min-time") {
      char* end = nullptr;
      a.min_time = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(a.min_time > 0.0) || !std::isfinite(a.min_time)) {
        usage_error("--min-time needs a number of seconds > 0, got '" + std::string(v) + "'");
      }
    } else if (s == "--hidden") {
      a.hidden = static_cast<std::size_t>(parse_integer(s, v, 1));
    } else if (s == "--batch") {
      a.batch = static_cast<std::size_t>(parse_integer(s, v, 1));
    } else if (s == "--rotate") {
      a.rotate = static_cast<int>(parse_integer(s, v, 0) % rows);
    } else if (s == "--json") {
      if (*v == '\0') usage_error("--json needs a file name, got ''");
      a.json = v;
    } else {
      usage_error("unknown argument '" + s + "'");
    }
  }
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Seconds per call of `calls` calls of `op`, the slowest rank's, between barriers.
template <class Op>
double sample(MPI_Comm world, long calls, Op&& op) {
  MPI_Barrier(world);
  const auto t0 = clock_type::now();
  for (long i = 0; i < calls; ++i) op();
  double t =
      std::chrono::duration<double>(clock_type::now() - t0).count() / static_cast<double>(calls);
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world);
  return t;
}

// The trainer of every row: fp32, AdamW with weight decay, global-norm clipping (train_mlp's).
template <class Model, class... Extra>
auto make_trainer(Model& m, Extra... extra) {
  return hone::trainer(m, hone::fp32{}, hone::adamw{.weight_decay = 0.01f},
                       hone::clip_grad_norm{.max_norm = 1.0f}, extra...);
}

void run_model(model_spec m, const args& a, hd::mpi_comm& comm, MPI_Comm world, int rank,
               int size) {
  if (a.hidden) m.hidden = a.hidden;
  if (a.batch) m.batch = a.batch;
  // Replicas from the same seed: the example's model and reporting_mlp, each trained
  // data-parallel and alone (local gradients).
  train_mlp::mlp<float> ddp_model(m.inputs, m.hidden, m.classes, 1);
  train_mlp::mlp<float> local_model(m.inputs, m.hidden, m.classes, 1);
  reporting_mlp overlap_model(m.inputs, m.hidden, m.classes, 1);
  reporting_mlp olocal_model(m.inputs, m.hidden, m.classes, 1);
  auto ddp_trainer = make_trainer(ddp_model, hone::data_parallel(comm));
  auto local_trainer = make_trainer(local_model);
  auto overlap_trainer = make_trainer(overlap_model, hone::data_parallel(comm));
  auto olocal_trainer = make_trainer(olocal_model);
  hd::broadcast_weights(ddp_trainer, comm);
  hd::broadcast_weights(overlap_trainer, comm);
  std::size_t parameters = 0;
  for (const auto& p : ddp_model.parameters()) parameters += p.value.size();
  hone::data_parallel reduce_only(comm);
  std::vector<float> gradients(parameters, 0.0f);  // zeros: the average stays 0 however often

  // This rank's batch: inputs uniform in [-1, 1], labels uniform over the classes.
  std::mt19937_64 rng(1234u + static_cast<unsigned>(rank));
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::uniform_int_distribution<std::int32_t> label(0, static_cast<std::int32_t>(m.classes) - 1);
  std::vector<float> x(m.batch * m.inputs);
  std::vector<std::int32_t> y(m.batch);
  for (float& v : x) v = value(rng);
  for (auto& v : y) v = label(rng);
  const train_mlp::batch b{std::span<const float>(x), std::span<const std::int32_t>(y)};

  auto run = [&](int which) {
    switch (which) {
      case ddp:
        (void)ddp_trainer.step(b);
        break;
      case local:
        (void)local_trainer.step(b);
        break;
      case overlap:
        (void)overlap_trainer.step(b);
        break;
      case olocal:
        (void)olocal_trainer.step(b);
        break;
      default:
        reduce_only.reduce(std::span<float>(gradients));
        break;
    }
  };
  // Warm-up (first touch of the arenas, the optimizer state, MPI's connections), then the batch:
  // about min_time per sample from the second ddp step's time (the same on every rank: MPI_MAX).
  for (int w = 0; w < rows; ++w) run(w);
  const double one = sample(world, 1, [&] { run(ddp); });
  long steps = std::max(1L, static_cast<long>(std::ceil(a.min_time / std::max(one, 1e-9))));
  MPI_Bcast(&steps, 1, MPI_LONG, 0, world);

  std::vector<double> times[rows];
  std::vector<double> exposed, exposed_overlap;
  for (int r = 0; r < a.repetitions; ++r) {
    double t[rows] = {};
    for (int k = 0; k < rows; ++k) {
      const int w = (k + r + a.rotate) % rows;
      t[w] = sample(world, steps, [&] { run(w); });
    }
    for (int w = 0; w < rows; ++w) times[w].push_back(t[w]);
    exposed.push_back((t[ddp] - t[local]) / t[ddp]);
    exposed_overlap.push_back((t[overlap] - t[olocal]) / t[overlap]);
  }
  if (rank != 0) return;
  std::printf("%-10s %10zu %5zu %6ld %3d |", m.name, parameters, m.batch, steps, a.repetitions);
  for (int w = 0; w < rows; ++w) {
    const double med = median(times[w]);
    std::printf(" %10.4f %9.1f |", med * 1e3, 1.0 / med);
  }
  std::printf(" %7.3f %7.3f\n", median(exposed), median(exposed_overlap));
  std::fflush(stdout);
  if (!a.json.empty()) {
    std::FILE* f = std::fopen(a.json.c_str(), "a");
    if (f == nullptr) {
      std::fprintf(stderr, "mpi_bench_ddp: cannot open '%s' to append the results to\n",
                   a.json.c_str());
      MPI_Abort(world, 1);
    }
    std::fprintf(f,
                 "{\"impl\": \"hone\", \"model\": \"%s\", \"ranks\": %d, \"threads\": 1, "
                 "\"inputs\": %zu, \"hidden\": %zu, \"classes\": %zu, \"batch_per_rank\": %zu, "
                 "\"parameters\": %zu, \"steps_per_sample\": %ld, \"rotate\": %d",
                 m.name, size, m.inputs, m.hidden, m.classes, m.batch, parameters, steps, a.rotate);
    for (int w = 0; w < rows; ++w) {
      std::fprintf(f, ", \"%s\": %s", json_names[w], hone_bench::json_ms_list(times[w]).c_str());
    }
    std::fprintf(f, "}\n");
    std::fclose(f);
  }
}

}  // namespace

int main(int argc, char** argv) {
  hd::mpi_environment env(argc, argv);
  const args a = parse(argc, argv);
  // One oneTBB thread per rank (the trainer's host loops run on oneTBB).
  tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
  MPI_Comm world = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  try {
    hd::mpi_comm comm(world, std::chrono::seconds(120));
    if (rank == 0) {
      std::printf(
          "ddp_step: %d ranks x 1 thread, fp32 AdamW + clipping; time per step (median over "
          "repetitions, slowest rank), steps/s, exposed = median of (ddp - local) / ddp, "
          "exp.ovl = median of (overlap - olocal) / overlap\n",
          size);
      std::printf("%-10s %10s %5s %6s %3s |", "model", "params", "batch", "steps", "rep");
      for (const char* name : row_names) std::printf(" %7s ms %9s |", name, "steps/s");
      std::printf(" %7s %7s\n", "exposed", "exp.ovl");
    }
    for (const auto& m : known_models) {
      if (a.model == "all" || a.model == m.name) run_model(m, a, comm, world, rank, size);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_bench_ddp: rank %d: %s\n", rank, e.what());
    MPI_Abort(world, 1);
  }
  return 0;
}

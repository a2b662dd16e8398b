// bench/zero.cpp (mpi_bench_zero): ZeRO's memory per rank and step time (hone::zero<1>,
// hone::zero<2>) against hone::data_parallel, under mpirun:
//   mpirun -np 2 build/bench/bench/mpi_bench_zero [--params 16777216] [--tensors 8] [--steps 5]
//          [--repetitions 5] [--micro 1] [--bucket-mb 25] [--rotate K] [--json FILE] [--bf16 1]
//          [--whole-master 1] [--wire bf16|fp16]
//
// The model: `tensors` fp32 tensors laid out in one arena as the trainer lays them out (so the
// master weights ARE the model's weights, zero-copy), `params` values in all; its backward is
// g = x * w (one pass: the step is the trainer's reduction, update and gather, not a model).
// fp32 AdamW, global-norm clipping at 1.0, buckets of --bucket-mb MiB (DDP's 25 by default) for
// every row, one oneTBB thread per rank. --bf16 1: the tensors are bf16 (hone::bf16_mixed), so
// the fp32 master weights are the trainer's own copy, sharded by hone::zero (4/d bytes per
// parameter; the formula becomes DDP 18, zero<1> 6 + 12/d, zero<2> 2 + 16/d, the model's 2
// bytes of weights counted). --whole-master 1 keeps them whole on every rank
// (zero_options::shard_master_weights = false; formula zero<1> 10 + 8/d, zero<2> 6 + 12/d), to
// compare the step with and without their sharding. --wire bf16|fp16 adds a fourth row,
// zero<2> with that 16-bit wire (zero_options::wire: its reduce-scatters move 2-byte gradients),
// interleaved with the three fp32-wire rows; its memory counts its staging (the 16-bit window and
// the fp32 bucket of the weights' all-gather).
//
// Memory per rank, from the arena sizes after a step: master weights (the model's), master
// gradients, optimizer state, and the reduction's staging (zero: the bucket and one receive
// window), in bytes per parameter, beside the formula (DDP 16; zero<1> 8 + 8/d; zero<2> 4 + 12/d)
// and the formula plus the staging (the 64-byte alignment's padding aside). Step time: a sample is
// `steps` steps between a barrier and an MPI_MAX of the time (the slowest rank's); the three rows
// are interleaved in every repetition (the order rotated); reported: the median step time and the
// median over repetitions of the data_parallel time over the row's time in the same repetition.
// --rotate shifts the rows' order; --json appends one JSON object (rank 0) with the samples (ms),
// the bytes per parameter and the optimizer state's alone: scripts/bench-zero reads it, running
// this program and its torch peer (bench/peers/torch_zero.py, ZeroRedundancyOptimizer)
// alternately.
#include <mpi.h>

#include <oneapi/tbb/global_control.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <hone/core/arena.hpp>
#include <hone/dist/data_parallel.hpp>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <hone/dist/zero.hpp>
#include <hone/precision/policies.hpp>
#include <hone/train/trainer.hpp>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/mpi_rows.hpp"

namespace {

namespace hd = hone::dist;

struct args {
  std::size_t params = std::size_t{16} << 20;
  std::size_t tensors = 8;
  int steps = 5;
  int repetitions = 5;
  int micro = 1;
  std::size_t bucket_mb = 25;
  int rotate = 0;
  std::string json;
  bool bf16 = false;
  bool whole_master = false;
  hone::wire_format wire = hone::wire_format::fp32;  // fp32: no fourth row
};

args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string s = argv[i];
    const char* v = argv[i + 1];
    if (s == "--params") {
      a.params = std::strtoull(v, nullptr, 10);
    } else if (s == "--tensors") {
      a.tensors = std::strtoull(v, nullptr, 10);
    } else if (s == "--steps") {
      a.steps = std::atoi(v);
    } else if (s == "--repetitions") {
      a.repetitions = std::atoi(v);
    } else if (s == "--micro") {
      a.micro = std::atoi(v);
    } else if (s == "--bucket-mb") {
      a.bucket_mb = std::strtoull(v, nullptr, 10);
    } else if (s == "--rotate") {
      a.rotate = std::atoi(v);
    } else if (s == "--json") {
      a.json = v;
    } else if (s == "--bf16") {
      a.bf16 = std::atoi(v) != 0;
    } else if (s == "--whole-master") {
      a.whole_master = std::atoi(v) != 0;
    } else if (s == "--wire" && (std::string(v) == "bf16" || std::string(v) == "fp16")) {
      a.wire = std::string(v) == "bf16" ? hone::wire_format::bf16 : hone::wire_format::fp16;
    } else {
      std::fprintf(stderr, "mpi_bench_zero: unknown argument '%s'\n", s.c_str());
      std::exit(2);
    }
  }
  if (argc % 2 == 0 || a.tensors == 0 || a.params < a.tensors || a.steps < 1 || a.repetitions < 1 ||
      a.micro < 1 || a.bucket_mb < 1 || a.rotate < 0) {
    std::fprintf(stderr,
                 "mpi_bench_zero: give --params >= --tensors >= 1, --steps, --repetitions, "
                 "--micro and --bucket-mb >= 1, --rotate >= 0 (each followed by its value)\n");
    std::exit(2);
  }
  return a;
}

struct batch {
  float x = 1.0f;
  [[nodiscard]] std::size_t count() const { return 1; }
};

/// T tensors laid out like the trainer's arena (fp32: zero-copy master weights); g = x * w.
template <class T>
struct flat_model {
  hone::arena_layout layout{sizeof(float)};
  std::vector<T> w, g;
  flat_model(std::size_t params, std::size_t tensors) {
    for (std::size_t t = 0; t < tensors; ++t) {
      std::string name = "t";  // (not "t" + ...: g++ 12's -Wrestrict false positive at -O3)
      name += std::to_string(t);
      layout.add(std::move(name), params / tensors + (t < params % tensors ? 1 : 0));
    }
    w.assign(layout.total(), T(0.01f));
    g.assign(layout.total(), T(0.0f));
  }
  std::vector<hone::parameter<T>> parameters() {
    std::vector<hone::parameter<T>> out;
    for (const auto& sl : layout.slots()) {
      out.push_back({sl.name,
                     {sl.count},
                     std::span<T>(w.data() + sl.offset, sl.count),
                     std::span<T>(g.data() + sl.offset, sl.count)});
    }
    return out;
  }
  float forward_backward(const batch& b, float scale) {
    for (std::size_t i = 0; i < w.size(); ++i) g[i] = T(b.x * static_cast<float>(w[i]) * scale);
    return 0.0f;
  }
};

/// The trainer's bytes per parameter: master weights (the model's own when zero-copy, else the
/// trainer's copy plus the model's weights), master gradients, optimizer state, staging.
template <class Trainer>
double bytes_per_param(Trainer& t, std::size_t staging, std::size_t params) {
  using working = typename Trainer::working_type;
  const std::size_t model = t.zero_copy() ? 0 : t.layout().total() * sizeof(working);
  const double b = static_cast<double>(t.master_weights().size() * sizeof(float) +
                                       t.master_gradients().size() * sizeof(float) +
                                       t.optimizer_state().bytes() + staging + model);
  return b / static_cast<double>(params);
}

template <class T>
int run(const args& a, hd::mpi_comm& comm);

}  // namespace

int main(int argc, char** argv) {
  hd::mpi_environment env(argc, argv);
  const args a = parse(argc, argv);
  oneapi::tbb::global_control one_thread(oneapi::tbb::global_control::max_allowed_parallelism, 1);
  hd::mpi_comm comm(MPI_COMM_WORLD);
  return a.bf16 ? run<hone::bfloat16>(a, comm) : run<float>(a, comm);
}

namespace {
template <class T>
int run(const args& a, hd::mpi_comm& comm) {
  const int rank = comm.rank();
  const double d = comm.size();
  constexpr bool fp32 = std::is_same_v<T, float>;
  using precision = std::conditional_t<fp32, hone::fp32, hone::bf16_mixed>;
  // the formula's bytes per parameter: {fixed, sharded}: fixed + sharded / d
  constexpr double f_ddp = fp32 ? 16.0 : 18.0;
  // (fp32: the master weights are the model's, bound zero-copy, so never sharded)
  const bool whole = fp32 || a.whole_master;
  const double f_z1[2] = {whole ? 8.0 + (fp32 ? 0.0 : 2.0) : 6.0, whole ? 8.0 : 12.0};
  const double f_z2[2] = {whole ? 4.0 + (fp32 ? 0.0 : 2.0) : 2.0, whole ? 12.0 : 16.0};

  flat_model<T> m_ddp(a.params, a.tensors), m_z1(a.params, a.tensors), m_z2(a.params, a.tensors);
  const auto clip = hone::clip_grad_norm{.max_norm = 1.0f};
  const std::size_t bucket = a.bucket_mb << 20;
  hone::trainer ddp(m_ddp, precision{}, hone::adamw{}, clip, hone::accumulate::by_count{},
                    hone::data_parallel(comm, {.bucket_bytes = bucket}));
  const hone::zero_options zo{.bucket_bytes = bucket, .shard_master_weights = !a.whole_master};
  hone::trainer z1(m_z1, precision{}, hone::adamw{}, clip, hone::accumulate::by_count{},
                   hone::zero<1>(comm, zo));
  hone::trainer z2(m_z2, precision{}, hone::adamw{}, clip, hone::accumulate::by_count{},
                   hone::zero<2>(comm, zo));
  const bool wire_row = a.wire != hone::wire_format::fp32;
  flat_model<T> m_z2w(wire_row ? a.params : a.tensors, a.tensors);  // small when unused
  hone::zero_options zw = zo;
  zw.wire = a.wire;
  hone::trainer z2w(m_z2w, precision{}, hone::adamw{}, clip, hone::accumulate::by_count{},
                    hone::zero<2>(comm, zw));
  std::vector<batch> mb(static_cast<std::size_t>(a.micro),
                        batch{1.0f + 0.5f * static_cast<float>(rank)});

  const auto sample = [&](auto& t) {
    return hone_bench::slowest_seconds_per_call(comm, a.steps,
                                                [&] { (void)t.step(std::span<const batch>(mb)); });
  };
  (void)sample(ddp);  // warm-up: first touch, connections, plans
  (void)sample(z1);
  (void)sample(z2);
  if (wire_row) (void)sample(z2w);

  // Memory: the largest rank's bytes per parameter (the last shard may be smaller).
  double mem[4] = {bytes_per_param(ddp, 0, a.params),
                   bytes_per_param(z1, z1.gradient_reduction().staging_bytes(), a.params),
                   bytes_per_param(z2, z2.gradient_reduction().staging_bytes(), a.params),
                   bytes_per_param(z2w, z2w.gradient_reduction().staging_bytes(), a.params)};
  MPI_Allreduce(MPI_IN_PLACE, mem, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const double p_all = static_cast<double>(a.params);
  double state[3] = {static_cast<double>(ddp.optimizer_state().bytes()) / p_all,
                     static_cast<double>(z1.optimizer_state().bytes()) / p_all,
                     static_cast<double>(z2.optimizer_state().bytes()) / p_all};
  MPI_Allreduce(MPI_IN_PLACE, state, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

  std::vector<double> t_ddp, t_z1, t_z2, t_z2w;
  if (wire_row) {
    auto rows =
        hone_bench::interleaved<4>(a.repetitions,
                                   {[&] { return sample(ddp); }, [&] { return sample(z1); },
                                    [&] { return sample(z2); }, [&] { return sample(z2w); }},
                                   a.rotate % 4);
    t_ddp = std::move(rows[0]);
    t_z1 = std::move(rows[1]);
    t_z2 = std::move(rows[2]);
    t_z2w = std::move(rows[3]);
  } else {
    auto rows = hone_bench::interleaved<3>(
        a.repetitions,
        {[&] { return sample(ddp); }, [&] { return sample(z1); }, [&] { return sample(z2); }},
        a.rotate % 3);
    t_ddp = std::move(rows[0]);
    t_z1 = std::move(rows[1]);
    t_z2 = std::move(rows[2]);
  }
  std::vector<double> r_z1, r_z2, r_z2w;
  for (int r = 0; r < a.repetitions; ++r) {
    const auto i = static_cast<std::size_t>(r);
    r_z1.push_back(t_ddp[i] / t_z1[i]);
    r_z2.push_back(t_ddp[i] / t_z2[i]);
    if (wire_row) r_z2w.push_back(t_ddp[i] / t_z2w[i]);
  }
  if (rank == 0) {
    std::printf(
        "zero_step: %d ranks x 1 thread, %zu %s parameters in %zu tensors, AdamW, clipping, "
        "%d micro-batch(es) per step, %d steps per sample, %d repetitions\n",
        comm.size(), a.params,
        fp32             ? "fp32"
        : a.whole_master ? "bf16 (bf16_mixed, whole master weights)"
                         : "bf16 (bf16_mixed)",
        a.tensors, a.micro, a.steps, a.repetitions);
    const double p = static_cast<double>(a.params);
    const double staging = static_cast<double>(z1.gradient_reduction().staging_bytes()) / p;
    std::printf("%-14s %10s %10s %16s %10s %16s\n", "row", "B/param", "formula", "formula+staging",
                "step ms", "ddp/row (median)");
    const double z1f = f_z1[0] + f_z1[1] / d, z2f = f_z2[0] + f_z2[1] / d;
    std::printf("%-14s %10.2f %10.2f %16.2f %10.2f %16s\n", "data_parallel", mem[0], f_ddp, f_ddp,
                1e3 * hone_bench::median(t_ddp), "1.00");
    std::printf("%-14s %10.2f %10.2f %16.2f %10.2f %16.2f\n", "zero<1>", mem[1], z1f, z1f + staging,
                1e3 * hone_bench::median(t_z1), hone_bench::median(r_z1));
    std::printf("%-14s %10.2f %10.2f %16.2f %10.2f %16.2f\n", "zero<2>", mem[2], z2f, z2f + staging,
                1e3 * hone_bench::median(t_z2), hone_bench::median(r_z2));
    if (wire_row) {
      const double sw = static_cast<double>(z2w.gradient_reduction().staging_bytes()) / p;
      const std::string name = std::string("zero<2> ") + hone::to_string(a.wire);
      std::printf("%-14s %10.2f %10.2f %16.2f %10.2f %16.2f\n", name.c_str(), mem[3], z2f, z2f + sw,
                  1e3 * hone_bench::median(t_z2w), hone_bench::median(r_z2w));
    }
    std::printf("optimizer state B/param: data_parallel %.2f, zero<1> %.2f, zero<2> %.2f\n",
                state[0], state[1], state[2]);
    if (!a.json.empty()) {
      std::FILE* f = std::fopen(a.json.c_str(), "a");
      if (f == nullptr) {
        std::fprintf(stderr, "mpi_bench_zero: cannot open --json file '%s'\n", a.json.c_str());
        return 1;
      }
      std::fprintf(
          f,
          "{\"impl\": \"hone\", \"precision\": \"%s\", \"ranks\": %d, \"parameters\": %zu, "
          "\"tensors\": %zu, "
          "\"steps_per_sample\": %d, \"bucket_mb\": %zu, \"rotate\": %d, "
          "\"ddp_ms\": %s, \"zero1_ms\": %s, \"zero2_ms\": %s, \"zero2_wire\": \"%s\", "
          "\"zero2_wire_ms\": %s, "
          "\"bytes_per_param\": {\"ddp\": %.6g, \"zero1\": %.6g, \"zero2\": %.6g}, "
          "\"state_bytes_per_param\": {\"ddp\": %.6g, \"zero1\": %.6g, \"zero2\": %.6g}}\n",
          fp32 ? "fp32" : (a.whole_master ? "bf16-whole-master" : "bf16"), comm.size(), a.params,
          a.tensors, a.steps, a.bucket_mb, a.rotate, hone_bench::json_ms_list(t_ddp).c_str(),
          hone_bench::json_ms_list(t_z1).c_str(), hone_bench::json_ms_list(t_z2).c_str(),
          hone::to_string(a.wire), hone_bench::json_ms_list(t_z2w).c_str(), mem[0], mem[1], mem[2],
          state[0], state[1], state[2]);
      std::fclose(f);
    }
  }
  return 0;
}
}  // namespace

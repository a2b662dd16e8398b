// bench/ddp_overlap.cpp (mpi_bench_ddp_overlap): how much of hone::data_parallel's communication
// the overlap with backward hides (data_parallel_options::overlap_with_backward, a model that
// reports hone::gradient_ready). Run under mpirun:
//   mpirun -np 2 build/bench/bench/mpi_bench_ddp_overlap [--layers 16] [--floats 262144]
//          [--work 24] [--bucket-mb 4] [--steps 10] [--repetitions 7] [--progress-us N]
//
// The model: `layers` tensors of `floats` fp32 values each; forward_backward computes each
// layer's gradient from the last layer to the first with `work` dependent multiply-adds per
// element (a stand-in for a layer's backward GEMMs), and reports each layer final as soon as it
// is written. One oneTBB thread per rank. AdamW, fp32, hone::data_parallel(mpi_comm) with
// `bucket-mb` MiB buckets (DDP's bucket_cap_mb).
//
// Rows, interleaved in every repetition (the order rotated): `local` (the same trainer with local
// gradients: compute and update only), `after` (data_parallel, overlap_with_backward = false: the
// reduction after backward), `overlap` (the default: buckets start during backward), and with
// --progress-us N > 0 `thread` (overlap, and the communicator's progress thread polling every N us:
// mpi_comm::start_progress_thread; MPI is then initialized with MPI_THREAD_MULTIPLE for every row,
// as the thread needs, instead of MPI_THREAD_SERIALIZED). A sample is
// the time of `steps` steps between a barrier and an MPI_MAX of the time (the slowest rank's),
// divided by the steps. Reported: the median step time of each row, and per repetition
// exposed = (row - local) / row, the share of the step that compute does not hide; the medians.
#include <mpi.h>

#include <oneapi/tbb/global_control.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <hone/dist/data_parallel.hpp>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <hone/train/trainer.hpp>
#include <span>
#include <string>
#include <vector>

#include "support/mpi_rows.hpp"

namespace {

namespace hd = hone::dist;

struct args {
  std::size_t layers = 16;
  std::size_t floats = 262144;  // per layer: 16 layers of 1 MiB
  int work = 24;                // dependent multiply-adds per gradient element
  std::size_t bucket_mb = 4;
  int steps = 10;
  int repetitions = 7;
  long progress_us = 0;  // > 0: the `thread` row, its poll interval
};

args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string s = argv[i];
    const char* v = argv[i + 1];
    if (s == "--layers") {
      a.layers = std::strtoull(v, nullptr, 10);
    } else if (s == "--floats") {
      a.floats = std::strtoull(v, nullptr, 10);
    } else if (s == "--work") {
      a.work = std::atoi(v);
    } else if (s == "--bucket-mb") {
      a.bucket_mb = std::strtoull(v, nullptr, 10);
    } else if (s == "--steps") {
      a.steps = std::atoi(v);
    } else if (s == "--repetitions") {
      a.repetitions = std::atoi(v);
    } else if (s == "--progress-us") {
      a.progress_us = std::atol(v);
    } else {
      std::fprintf(stderr, "mpi_bench_ddp_overlap: unknown argument '%s'\n", s.c_str());
      std::exit(2);
    }
  }
  if (argc % 2 == 0 || a.layers == 0 || a.floats == 0 || a.work < 1 || a.bucket_mb == 0 ||
      a.steps < 1 || a.repetitions < 1 || a.progress_us < 0) {
    std::fprintf(stderr,
                 "mpi_bench_ddp_overlap: give positive --layers, --floats, --work, --bucket-mb, "
                 "--steps and --repetitions (each followed by its value), and --progress-us N >= 0 "
                 "(0: no thread row)\n");
    std::exit(2);
  }
  return a;
}

struct batch {
  float x = 1.0f;
};

/// `layers` tensors whose backward costs `work` multiply-adds per element, reported final one by
/// one from the last layer.
struct layered_model {
  std::vector<std::vector<float>> w, g;
  int work;
  layered_model(std::size_t layers, std::size_t floats, int work_) : work(work_) {
    for (std::size_t l = 0; l < layers; ++l) {
      w.emplace_back(floats, 0.01f);
      g.emplace_back(floats, 0.0f);
    }
  }
  std::vector<hone::parameter<float>> parameters() {
    std::vector<hone::parameter<float>> out;
    for (std::size_t l = 0; l < w.size(); ++l) {
      out.push_back({"layer" + std::to_string(l), {w[l].size()}, w[l], g[l]});
    }
    return out;
  }
  float forward_backward(const batch& b, float scale, hone::gradient_ready ready) {
    for (std::size_t l = w.size(); l-- > 0;) {
      const float* wl = w[l].data();
      float* gl = g[l].data();
      for (std::size_t i = 0; i < w[l].size(); ++i) {
        float v = wl[i] * b.x;
        for (int k = 0; k < work; ++k) v = v * 0.999f + 1e-4f;
        gl[i] = v * scale;
      }
      ready(l);
    }
    return 0.0f;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const args a = parse(argc, argv);
  hd::mpi_environment env(
      argc, argv, a.progress_us > 0 ? hd::thread_level::multiple : hd::thread_level::serialized);
  oneapi::tbb::global_control one_thread(oneapi::tbb::global_control::max_allowed_parallelism, 1);
  hd::mpi_comm comm(MPI_COMM_WORLD);
  hd::mpi_comm threaded(MPI_COMM_WORLD);  // the `thread` row's communicator
  if (a.progress_us > 0) threaded.start_progress_thread(std::chrono::microseconds(a.progress_us));
  const int rank = comm.rank();

  layered_model m_local(a.layers, a.floats, a.work), m_after(a.layers, a.floats, a.work),
      m_over(a.layers, a.floats, a.work), m_thread(a.layers, a.floats, a.work);
  hone::data_parallel_options o{.bucket_bytes = a.bucket_mb << 20};
  hone::trainer local(m_local, hone::adamw{});
  o.overlap_with_backward = false;
  hone::trainer after(m_after, hone::adamw{}, hone::data_parallel(comm, o));
  o.overlap_with_backward = true;
  hone::trainer over(m_over, hone::adamw{}, hone::data_parallel(comm, o));
  hone::trainer with_thread(m_thread, hone::adamw{}, hone::data_parallel(threaded, o));
  const batch b{1.0f + static_cast<float>(rank)};

  const auto sample = [&](auto& t) {
    return hone_bench::slowest_seconds_per_call(comm, a.steps, [&] { (void)t.step(b); });
  };
  // Warm-up: first touch, MPI connections, the bucket plans.
  (void)sample(local);
  (void)sample(after);
  (void)sample(over);
  if (a.progress_us > 0) (void)sample(with_thread);

  const auto rows = hone_bench::interleaved<4>(
      a.repetitions,
      {[&] { return sample(local); }, [&] { return sample(after); }, [&] { return sample(over); },
       [&] { return a.progress_us > 0 ? sample(with_thread) : 0.0; }});
  const auto& [t_local, t_after, t_over, t_thread] = rows;
  std::vector<double> x_after, x_over, x_thread;
  for (int r = 0; r < a.repetitions; ++r) {
    const auto i = static_cast<std::size_t>(r);
    x_after.push_back((t_after[i] - t_local[i]) / t_after[i]);
    x_over.push_back((t_over[i] - t_local[i]) / t_over[i]);
    if (a.progress_us > 0) x_thread.push_back((t_thread[i] - t_local[i]) / t_thread[i]);
  }
  if (rank == 0) {
    const double mb = static_cast<double>(a.layers * a.floats * sizeof(float)) / (1 << 20);
    std::printf(
        "ddp_overlap: %d ranks x 1 thread, %zu layers x %zu floats (%.1f MiB of gradients), "
        "%d multiply-adds per element in backward, %zu MiB buckets, %d steps per sample, %d "
        "repetitions; buckets started during backward in the last overlapped step: %zu; %s\n",
        comm.size(), a.layers, a.floats, mb, a.work, a.bucket_mb, a.steps, a.repetitions,
        over.gradient_reduction().early_starts(),
        a.progress_us > 0 ? "MPI_THREAD_MULTIPLE" : "MPI_THREAD_SERIALIZED");
    std::printf("%-8s %10s %10s\n", "row", "step ms", "exposed");
    std::printf("%-8s %10.2f %10s\n", "local", 1e3 * hone_bench::median(t_local), "-");
    std::printf("%-8s %10.2f %9.1f%%\n", "after", 1e3 * hone_bench::median(t_after),
                100 * hone_bench::median(x_after));
    std::printf("%-8s %10.2f %9.1f%%\n", "overlap", 1e3 * hone_bench::median(t_over),
                100 * hone_bench::median(x_over));
    if (a.progress_us > 0) {
      std::printf("%-8s %10.2f %9.1f%%   (progress thread every %ld us)\n", "thread",
                  1e3 * hone_bench::median(t_thread), 100 * hone_bench::median(x_thread),
                  a.progress_us);
    }
  }
  return 0;
}

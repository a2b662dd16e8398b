// examples/train_mlp/distributed.hpp: the data-parallel pieces of train_mlp (--ddp, --zero 1|2),
// launched with mpirun:
//
//   mpirun -np 2 train_mlp --zero 2      # each rank trains on half of every step's samples
//
// main.cpp's train() is written against a hone::dist::communicator: one process passes a
// hone::dist::local_comm (rank 0 of 1, every collective a no-op) and builds the trainer with local
// gradients; under mpirun run_distributed() below initializes MPI, builds a
// hone::dist::mpi_comm and calls train() with it and the gradient reduction role of the flag:
//
//   --ddp      hone::data_parallel(comm, {.weight_by_count = true})  every rank all the state
//   --zero 1   hone::zero<1>(comm)   the AdamW moments sharded over the ranks (and with bf16 or
//                                    fp16 the fp32 master weights: main.cpp's best-weights keeper
//                                    then keeps each rank's shard, restored on every rank)
//   --zero 2   hone::zero<2>(comm)   the moments and the fp32 master gradients sharded (and
//                                    the master weights, as --zero 1)
//
// What train() does with the communicator:
//  - broadcast_weights: every rank starts from rank 0's initial weights;
//  - the step's samples: the loader of every rank reads the same shuffled --batch samples per
//    step (same seed); rank r trains on its contiguous share of them (rank_share), cut into
//    --accumulate micro-batches, so N ranks together train on exactly the samples one process
//    does. --ddp weights each rank by its share's size (weight_by_count: the mean over every
//    sample, as one process); hone::zero averages the ranks' means (equal when --batch is a
//    multiple of the ranks, else each sample of a smaller share weighs slightly more);
//  - validation: rank 0 evaluates, and broadcasts the result (from_root): every rank feeds the
//    same numbers to early stopping, so every rank stops at the same step. The weights are the
//    same bits on every rank (the reductions make them so), so rank 0's numbers are everyone's;
//  - outputs: only rank 0 writes the training CSV (the others wait at a barrier before reading
//    it), metrics.csv, curves.png and prints (the other ranks' stdout goes to /dev/null); the
//    loss it records is the mean over the ranks (mean_over_ranks).
//
// Checkpoints are refused with --ddp/--zero (main.cpp's flag checks say so): resuming needs every
// rank to restore and the capture of a ZeRO trainer to be collective, which this example does
// not do yet. Any error on one rank ends the whole job (mpi_comm::abort) rather than leaving the
// other ranks waiting for a collective.
#pragma once

#include <cstddef>
#include <cstdio>
#include <hone/core/error.hpp>
#include <hone/dist/communicator.hpp>
#include <optional>
#include <span>
#include <string>

#include "mlp_common.hpp"

#if TRAIN_MLP_WITH_MPI
#include <chrono>
#include <exception>
#include <hone/dist/data_parallel.hpp>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <hone/dist/zero.hpp>
#include <utility>
#endif

namespace train_mlp {

/// How the gradients of a step are reduced (--ddp, --zero 1|2).
enum class parallel_mode { none, ddp, zero1, zero2 };

[[nodiscard]] inline const char* parallel_flag(parallel_mode m) {
  switch (m) {
    case parallel_mode::none:
      return "";
    case parallel_mode::ddp:
      return "--ddp";
    case parallel_mode::zero1:
      return "--zero 1";
    case parallel_mode::zero2:
      return "--zero 2";
  }
  return "?";
}

/// One rank's contiguous share of a step's `rows` samples: [first, first + count). The ranks'
/// shares tile the rows in rank order; each holds rows / ranks samples or one more.
struct share {
  std::size_t first = 0;
  std::size_t count = 0;
};

[[nodiscard]] inline share rank_share(std::size_t rows, int rank, int ranks) {
  const auto r = static_cast<std::size_t>(rank), n = static_cast<std::size_t>(ranks);
  const std::size_t first = rows * r / n, end = rows * (r + 1) / n;
  return {first, end - first};
}

/// Rank 0's evaluation on every rank: rank 0 passes its result, the others std::nullopt.
template <class Comm>
[[nodiscard]] evaluation from_root(Comm& comm, const std::optional<evaluation>& mine) {
  double v[2] = {mine ? mine->loss : 0.0, mine ? mine->accuracy : 0.0};
  comm.broadcast(std::span<double>(v), 0).wait();
  return {v[0], v[1]};
}

/// The mean over the ranks of each rank's `value` (the reported loss: each rank's is the mean
/// over its own share).
template <class Comm>
[[nodiscard]] double mean_over_ranks(Comm& comm, double value) {
  comm.all_reduce(std::span<double>(&value, 1), hone::dist::reduce_op::sum).wait();
  return value / static_cast<double>(comm.size());
}

#if TRAIN_MLP_WITH_MPI
/// A job under mpirun: MPI initialized (finalized when destroyed) and a communicator over every
/// rank. The ranks other than 0 print nothing on stdout (their errors still go to stderr).
class mpi_job {
 public:
  mpi_job(int& argc, char**& argv)
      : env_(argc, argv),
        // A rank that never arrives at a collective (it crashed, or hangs) makes the others throw
        // after a minute, naming it, instead of waiting for ever.
        comm_(MPI_COMM_WORLD, std::chrono::seconds(60)) {
    if (comm_.rank() != 0) std::freopen("/dev/null", "w", stdout);
  }

  [[nodiscard]] hone::dist::mpi_comm& comm() noexcept { return comm_; }

 private:
  hone::dist::mpi_environment env_;
  hone::dist::mpi_comm comm_;
};

/// Runs train(comm, reduction) on this rank: `train` is called with the job's mpi_comm and the
/// gradient reduction role of `mode`, and returns the exit status. Checks that every rank's share
/// of a step holds at least one sample per micro-batch. An exception on any rank is printed with
/// the rank and ends the job (every rank) with exit status 1.
template <class Train>
int run_distributed(parallel_mode mode, std::size_t batch, std::size_t accumulate, int& argc,
                    char**& argv, const Train& train) {
  mpi_job job(argc, argv);
  hone::dist::mpi_comm& comm = job.comm();
  try {
    const std::size_t smallest = batch / static_cast<std::size_t>(comm.size());
    if (accumulate > smallest) {
      throw hone::config_error(
          std::string(parallel_flag(mode)) + " over " + std::to_string(comm.size()) +
          " ranks: each rank trains on its share of the " + std::to_string(batch) +
          " samples of a step, the smallest share holds " + std::to_string(smallest) +
          " samples, fewer than --accumulate " + std::to_string(accumulate) +
          " micro-batches; raise --batch to at least " +
          std::to_string(accumulate * static_cast<std::size_t>(comm.size())) +
          ", lower --accumulate, or run fewer ranks");
    }
    switch (mode) {
      case parallel_mode::ddp:
        return train(comm, hone::data_parallel(comm, {.weight_by_count = true}));
      case parallel_mode::zero1:
        return train(comm, hone::zero<1>(comm));
      case parallel_mode::zero2:
        return train(comm, hone::zero<2>(comm));
      case parallel_mode::none:
        break;
    }
    throw hone::config_error("run_distributed needs --ddp or --zero 1|2");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: rank %d of %d: %s\n", comm.rank(), comm.size(), e.what());
    std::fflush(stderr);
    comm.abort(1);  // the other ranks may be waiting in a collective: end them too
  }
}
#endif

}  // namespace train_mlp

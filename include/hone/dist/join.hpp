// hone/dist/join.hpp: hone::dist::broadcast_weights (every rank starts from the root's weights)
// and hone::dist::join (uneven inputs: a rank with no batch left takes part in the other ranks'
// steps with zero gradients, then every rank takes the state of a rank that trained to the end),
// over hone::data_parallel; over hone::zero a joined rank runs the other ranks' steps without
// micro-batches (trainer::join_step), updating its own shard. Included by
// hone/dist/data_parallel.hpp and hone/dist.hpp; see docs/dist.md, "Uneven inputs (join)".
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/model.hpp"
#include "hone/dist/communicator.hpp"
#include "hone/dist/data_parallel.hpp"

HONE_NAMESPACE_BEGIN

namespace dist {

namespace detail {
/// The root's model weights on every rank: each parameter tensor broadcast through a float
/// buffer of at most 1 Mi elements (the communicators move float and double).
template <class Model, class Comm>
void broadcast_model_weights(Model& model, Comm& comm, int root) {
  constexpr std::size_t window = std::size_t{1} << 20;
  std::vector<float> buf;
  for (auto& p : model_traits<Model>::parameters(model)) {
    auto* v = p.value.data();
    using element = std::remove_cvref_t<decltype(*v)>;
    const std::size_t n = p.value.size();
    for (std::size_t o = 0; o < n; o += window) {
      const std::size_t w = std::min(window, n - o);
      buf.resize(w);
      if (comm.rank() == root) {
        for (std::size_t k = 0; k < w; ++k) buf[k] = static_cast<float>(v[o + k]);
      }
      comm.broadcast(std::span<float>(buf.data(), w), root).wait();
      for (std::size_t k = 0; k < w; ++k) v[o + k] = static_cast<element>(buf[k]);
    }
  }
}
}  // namespace detail

/// Makes every rank's trainer start from the root's weights, as PyTorch DDP broadcasts the
/// parameters at construction: the root's fp32 master weights are broadcast over `comm` and cast
/// into each rank's model (trainer::publish_weights). Call it once after building the trainers,
/// before the first step (and after restoring a checkpoint on the root only). Host trainers.
/// A hone::zero trainer with sharded master weights (trainer::master_weights_sharded()) holds no
/// whole copy to broadcast: the root's model weights are broadcast (as floats, 4 MiB at a time)
/// and every rank loads its shard from them (trainer::reload_weights_from_model); restore such a
/// trainer's checkpoint on every rank, not on the root only (the master weights' extra precision
/// would be lost).
template <class Trainer, class Comm>
void broadcast_weights(Trainer& trainer, Comm& comm, int root = 0) {
  static_assert(check_communicator<Comm>());
  if constexpr (requires { trainer.master_weights_sharded(); }) {
    if (trainer.master_weights_sharded()) {
      detail::broadcast_model_weights(trainer.model(), comm, root);
      trainer.reload_weights_from_model();
      return;
    }
  }
  std::span<float> w = trainer.master_weights();
  comm.broadcast(w, root).wait();
  trainer.publish_weights();
}

/// What hone::dist::join did on this rank.
struct join_report {
  /// Steps of the other ranks this rank took part in with zero gradients after it joined.
  std::uint64_t shadowed_steps = 0;
  /// The rank whose trainer state every rank took at the end (data_parallel::last_joiner());
  /// -1 with hone::zero, where no state is taken (each rank kept its shard current).
  int state_from = 0;
};

namespace detail {
/// Broadcasts a host span of any trivially copyable element type from `root`: float and double
/// directly, others as their bytes through a float staging buffer (a broadcast moves bits).
template <class Comm, class T>
void broadcast_bits(Comm& comm, std::span<T> data, int root) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    comm.broadcast(data, root).wait();
  } else {
    static_assert(std::is_trivially_copyable_v<T>,
                  "hone::dist::join: an optimizer state tensor's element type is not trivially "
                  "copyable, so its bytes cannot be broadcast.");
    std::vector<float> staging((data.size_bytes() + sizeof(float) - 1) / sizeof(float), 0.0f);
    if (!data.empty()) std::memcpy(staging.data(), data.data(), data.size_bytes());
    comm.broadcast(std::span<float>(staging), root).wait();
    if (!data.empty()) std::memcpy(data.data(), staging.data(), data.size_bytes());
  }
}
}  // namespace detail

namespace detail {
template <class R>
concept joinable_reduction = requires(R& r, std::span<float> g) {
  { r.join_step(g) } -> std::same_as<bool>;
  { r.last_joiner() } -> std::convertible_to<int>;
  r.communicator();
};
template <class Trainer>
join_report join_host(Trainer& trainer);
template <class Trainer>
join_report join_sharded(Trainer& trainer);
}  // namespace detail

/// For a rank that has run out of batches (uneven inputs, PyTorch DDP's Join): takes part in the
/// other ranks' remaining steps with zero gradients and a sample count of 0 until every rank has
/// called join, then gives every rank the trainer state of the lowest-numbered rank that had a
/// batch in the last step: master weights (published into the model), optimizer state, step
/// count and loss scaler. Those ranks applied the same reduced gradients to the same state, so
/// after the join every rank holds the bits one process accumulating every rank's batches step by
/// step would (within the rounding of the reduction order: docs/dist.md). Every rank calls it
/// once its batches are done (the last one too), with data_parallel_options::uneven_inputs set on
/// every rank; afterwards the ranks may train on (the next epoch).
///
/// A collective that fails or times out throws dist_error naming the step and the communicator's
/// message (for mpi_comm: the ranks that have not started it), never a hang; the step stays
/// pending (t.gradient_reduction().finish_pending(), then join again, or end the job). Host
/// trainers whose gradient reduction is hone::data_parallel.
///
/// With hone::zero (zero_options::uneven_inputs on every rank) every rank owns a shard of the
/// optimizer state, so a joined rank does not wait and take state: it runs the other ranks'
/// remaining steps without micro-batches (trainer::join_step: the step's exchange,
/// reduce-scatters of zeros, the norm, its shard's update, the gather, the weight constraint and
/// the checkpoint role), so every rank ends with the state of one process accumulating the
/// active ranks' batches step by step; state_from is -1. A failed collective throws dist_error
/// naming the step; the job must then end.
template <class Trainer>
join_report join(Trainer& trainer) {
  using reduction = std::remove_cvref_t<decltype(trainer.gradient_reduction())>;
  if constexpr (requires { trainer.join_step(); }) {
    return detail::join_sharded(trainer);
  } else if constexpr (!detail::joinable_reduction<reduction>) {
    static_assert(detail::joinable_reduction<reduction>,
                  "hone::dist::join: the trainer's gradient reduction policy is not "
                  "hone::data_parallel (it has no join_step and last_joiner) nor hone::zero. "
                  "Build the trainer with hone::data_parallel(comm, {.uneven_inputs = true}) or "
                  "hone::zero<1 or 2>(comm, {.uneven_inputs = true}).");
    return {};
  } else if constexpr (!std::is_same_v<decltype(trainer.master_weights()), std::span<float>>) {
    static_assert(std::is_same_v<decltype(trainer.master_weights()), std::span<float>>,
                  "hone::dist::join: the trainer's master weights are not host memory "
                  "(std::span<float>); join serves host trainers.");
    return {};
  } else {
    return detail::join_host(trainer);
  }
}

namespace detail {
template <class Trainer>
join_report join_sharded(Trainer& trainer) {
  HONE_REQUIRE(trainer.gradient_reduction().options().uneven_inputs,
               "hone::dist::join: a rank joined (it ran out of batches) but "
               "zero_options::uneven_inputs is off, so the other ranks do not exchange the "
               "still-active flags it answers and would wait for it. Set .uneven_inputs = true "
               "in the hone::zero options of every rank");
  join_report report;
  report.state_from = -1;
  while (trainer.join_step()) ++report.shadowed_steps;
  return report;
}

template <class Trainer>
join_report join_host(Trainer& trainer) {
  auto& dp = trainer.gradient_reduction();
  join_report report;
  {
    // The joined rank's own gradient arena holds the zeros it contributes (its last gradients
    // were applied, or discarded, by its last step; the next step overwrites them).
    const auto g = trainer.master_gradients();
    const std::span<float> arena(const_cast<float*>(g.data()), g.size());
    while (dp.join_step(arena)) ++report.shadowed_steps;
  }
  auto& comm = dp.communicator();
  const int root = dp.last_joiner();
  report.state_from = root;
  try {
    broadcast_weights(trainer, comm, root);
    trainer.optimizer_state().for_each_tensor(
        [&](std::string_view /*name*/, auto& a) { detail::broadcast_bits(comm, a.all(), root); });
    std::array<double, 5> scalars{static_cast<double>(trainer.steps_done()), 0, 0, 0, 0};
    auto& scaler = trainer.scaler();
    constexpr bool has_state = requires {
      scaler.state();
      scaler.load_state(scaler.state());
    };
    if constexpr (has_state) {
      const auto st = scaler.state();
      scalars[1] = static_cast<double>(st.scale);
      scalars[2] = static_cast<double>(st.growth_tracker);
      scalars[3] = static_cast<double>(st.hysteresis_tracker);
      scalars[4] = static_cast<double>(st.skipped_steps);
    }
    comm.broadcast(std::span<double>(scalars), root).wait();
    trainer.set_steps_done(static_cast<std::uint64_t>(scalars[0]));
    if constexpr (has_state) {
      auto st = scaler.state();
      st.scale = static_cast<float>(scalars[1]);
      st.growth_tracker = static_cast<std::int32_t>(scalars[2]);
      st.hysteresis_tracker = static_cast<std::int32_t>(scalars[3]);
      st.skipped_steps = static_cast<std::uint64_t>(scalars[4]);
      scaler.load_state(st);
    }
  } catch (const dist_error& e) {
    throw dist_error("hone::dist::join: on rank " + std::to_string(comm.rank()) + " of " +
                     std::to_string(comm.size()) + ", taking rank " + std::to_string(root) +
                     "'s trainer state after the join failed: " + e.what());
  }
  return report;
}
}  // namespace detail

}  // namespace dist

HONE_NAMESPACE_END

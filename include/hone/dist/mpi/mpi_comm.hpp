// hone/dist/mpi/mpi_comm.hpp: the MPI communicator (CMake target hone::mpi, which links
// MPI::MPI_CXX). Not part of <hone/dist.hpp>: only files that include this header need MPI.
//
//   int main(int argc, char** argv) {
//     hone::dist::mpi_environment env(argc, argv);  // or MPI_Init_thread by the program
//     hone::dist::mpi_comm comm;                    // a duplicate of MPI_COMM_WORLD
//     comm.all_reduce(std::span<float>(grads), hone::dist::reduce_op::sum).wait();
//   }
//
// mpi_comm wraps a duplicate of the communicator it is given (so hone's traffic never matches the
// program's own messages) whose errors return codes: a failed MPI call becomes hone::dist_error
// naming the operation and MPI's error string. Collectives start non-blocking MPI operations
// (MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast, MPI_Ibarrier) and
// return a request. request::wait() polls MPI_Test (back to back for up to mpi_comm::spin_time,
// then every 100 us); when the collective is not complete after the communicator's timeout
// (default 300 s, counted from the call to wait()), it throws
// hone::dist_error naming the operation, its sequence number on this communicator, the timeout,
// this rank and the ranks that have not started that collective. The request then stays
// pending: wait() may be called again (a slow rank may yet arrive), or the job ended with
// mpi_comm::abort().
//
// Naming the missing ranks (missing_ranks::named, the default): MPI does not say which ranks have
// not arrived at a collective, so every rank publishes how many collectives it has started in a
// one-word MPI window (MPI_Win_allocate, one passive-target epoch MPI_Win_lock_all held for the
// communicator's life). Starting a collective stores the count into the rank's own window word (an
// atomic store; MPI_Win_sync too when the window's memory model is MPI_WIN_SEPARATE): no message,
// no MPI call. Only when a wait times out does the rank read the others' words (MPI_Rget, polled
// with MPI_Test for at most min(timeout, 1 s), so a rank that cannot answer is reported as such
// rather than waited for). Creating and destroying the communicator are then collective over the
// window too (MPI_Win_allocate, MPI_Win_free). missing_ranks::not_named creates no window. A
// request destroyed while pending waits for the collective first (its spans belong to MPI until
// then); if that wait fails too, the destructor, which cannot throw, prints the error and aborts
// the job (MPI_Abort).
//
// Threads: the environment asks for MPI_THREAD_SERIALIZED by default (calls from one thread at a
// time, any thread); ask for thread_level::multiple to call from several threads at once. One
// mpi_comm and its requests are used from one thread at a time. Progress: collectives move inside
// the requests' test() and wait() (Open MPI does not progress them in the background); with
// MPI_THREAD_MULTIPLE, start_progress_thread() adds a thread that drives them every interval
// (detail/progress_thread.hpp; docs/dist.md says when that pays).
//
// all_reduce of at most 48 KiB on up to 8 ranks runs hone's own exchange
// (detail/p2p_all_reduce.hpp: every rank sends its buffer to every other and reduces in rank
// order; libnbc's per-call schedule costs more than such a transfer), as messages under the
// transports' eager limit, which the communicator reads from Open MPI (eager_limit(),
// exchange(), set_exchange()); so does all_gather of blocks of at most 8 KiB (twice the limit:
// detail/p2p_all_gather.hpp, straight into the output). Larger sums ask Open MPI
// for the ring algorithm (detail/iallreduce_ring.hpp: its default for an in-place MPI_Iallreduce
// on fewer than 4 ranks sends every byte through rank 0 twice). reduce_scatter on more than one
// rank runs hone's own MPI_Isend/MPI_Irecv chunks (detail/p2p_reduce_scatter.hpp; libnbc's only
// MPI_Ireduce_scatter_block reduces everything on rank 0): each block sent straight to its owner
// up to 8 ranks, a ring beyond; either way block b is reduced in the fixed order
// in_{b+1} op in_{b+2} op ... op in_b (ranks mod n). Both are driven by the requests' test() and
// wait().
//
// Element types: float, double, std::int32_t, std::int64_t, and the 16-bit floats hone::bfloat16
// and hone::half (data_parallel's 16-bit wire): moved as MPI_UINT16_T and reduced by mpi_comm's
// own MPI operations, which widen each pair to float, combine and round back (detail/types.hpp).
// Counts up to INT_MAX elements per call (MPI 3 counts are int).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/dist/communicator.hpp"
#include "hone/dist/mpi/detail/mpi_state.hpp"
#include "hone/dist/mpi/detail/types.hpp"

HONE_NAMESPACE_BEGIN

namespace dist {

/// MPI's thread support levels, in increasing order.
enum class thread_level { single, funneled, serialized, multiple };

[[nodiscard]] constexpr const char* to_string(thread_level l) noexcept {
  switch (l) {
    case thread_level::single:
      return "MPI_THREAD_SINGLE";
    case thread_level::funneled:
      return "MPI_THREAD_FUNNELED";
    case thread_level::serialized:
      return "MPI_THREAD_SERIALIZED";
    case thread_level::multiple:
      return "MPI_THREAD_MULTIPLE";
  }
  return "unknown thread level";
}

namespace detail {

inline int to_mpi(thread_level l) noexcept {
  switch (l) {
    case thread_level::single:
      return MPI_THREAD_SINGLE;
    case thread_level::funneled:
      return MPI_THREAD_FUNNELED;
    case thread_level::serialized:
      return MPI_THREAD_SERIALIZED;
    case thread_level::multiple:
      return MPI_THREAD_MULTIPLE;
  }
  return MPI_THREAD_SINGLE;
}

inline thread_level from_mpi(int l) noexcept {
  if (l >= MPI_THREAD_MULTIPLE) return thread_level::multiple;
  if (l >= MPI_THREAD_SERIALIZED) return thread_level::serialized;
  if (l >= MPI_THREAD_FUNNELED) return thread_level::funneled;
  return thread_level::single;
}

}  // namespace detail

/// Initializes MPI with a requested thread level, unless the program already has, and finalizes it
/// when destroyed if it initialized it. Throws dist_error when MPI provides less than requested.
class mpi_environment {
 public:
  explicit mpi_environment(thread_level required = thread_level::serialized)
      : mpi_environment(nullptr, nullptr, required) {}
  mpi_environment(int& argc, char**& argv, thread_level required = thread_level::serialized)
      : mpi_environment(&argc, &argv, required) {}
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  ~mpi_environment() {
    if (!owns_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  /// The thread level MPI provides.
  [[nodiscard]] thread_level provided() const noexcept { return provided_; }
  /// Whether this object initialized MPI (and finalizes it).
  [[nodiscard]] bool owns() const noexcept { return owns_; }

 private:
  mpi_environment(int* argc, char*** argv, thread_level required) {
    int initialized = 0, finalized = 0;
    detail::mpi_check(MPI_Initialized(&initialized), "mpi_environment: MPI_Initialized");
    detail::mpi_check(MPI_Finalized(&finalized), "mpi_environment: MPI_Finalized");
    if (finalized) {
      throw dist_error(
          "hone::dist::mpi_environment: MPI has already been finalized in this process and "
          "cannot be initialized again; create the environment once, before any communicator");
    }
    int provided = MPI_THREAD_SINGLE;
    if (initialized) {
      detail::mpi_check(MPI_Query_thread(&provided), "mpi_environment: MPI_Query_thread");
    } else {
      detail::mpi_check(MPI_Init_thread(argc, argv, detail::to_mpi(required), &provided),
                        "mpi_environment: MPI_Init_thread");
      owns_ = true;
    }
    provided_ = detail::from_mpi(provided);
    if (provided_ < required) {
      if (owns_) MPI_Finalize();
      throw dist_error(std::string("hone::dist::mpi_environment: ") + to_string(required) +
                       " was requested but MPI provides only " + to_string(provided_) +
                       "; request a lower level (and call hone's communicators accordingly) or "
                       "use an MPI built with thread support");
    }
  }

  thread_level provided_ = thread_level::single;
  bool owns_ = false;
};

/// Whether an mpi_comm names the ranks that have not started a collective when a wait times out
/// (through a one-word MPI window per rank; see the header comment).
enum class missing_ranks { named, not_named };

/// A communicator over MPI (see the header comment). Move-only (a moved-from mpi_comm may only
/// be destroyed or assigned to); requests keep what they need alive, so a request may outlive the
/// mpi_comm that started it.
class mpi_comm {
 public:
  static constexpr std::chrono::milliseconds default_timeout{std::chrono::seconds(300)};
  /// How long request::wait() calls MPI_Test without sleeping before it polls every 100 us.
  static constexpr std::chrono::milliseconds spin_time{std::chrono::seconds(1)};
  /// Whether all_reduce can ask Open MPI for its ring (the MPI library has the control variable).
  [[nodiscard]] bool asks_for_ring() const noexcept { return state_->ring->available(); }
  /// How the own exchange of all_reduce and all_gather for small buffers is sized (docs/dist.md,
  /// "all_reduce's algorithm"): on 2 to 8 ranks, all_reduce of at most max_bytes bytes and
  /// all_gather of blocks of at most gather_block_bytes (and outputs of at most max_bytes), as
  /// messages of at most message_bytes.
  using exchange_limits = detail::exchange_limits;

  /// A started collective. Move-only; default-constructed, it is complete.
  class request {
   public:
    request() = default;
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    request(request&& other) noexcept { take(other); }
    request& operator=(request&& other) noexcept {
      if (this != &other) {
        finish_or_abort();
        take(other);
      }
      return *this;
    }
    ~request() { finish_or_abort(); }

    /// Blocks until the collective is complete on this rank. Throws dist_error when MPI reports
    /// an error (the request is then complete) or when the communicator's timeout passes first
    /// (the request stays pending).
    void wait() {
      if (req_ == MPI_REQUEST_NULL && !p2p_) return;
      if (test()) return;
      const auto timeout = state_->timeout;
      const auto start = std::chrono::steady_clock::now();
      // Open MPI advances a non-blocking collective only inside MPI calls (ompi#9759), so a
      // transfer moves only while wait() calls MPI_Test. For the first millisecond the calls
      // follow each other at once (as MPI_Wait's progress loop does); up to spin_time each call
      // is followed by a yield (ranks that share cores let each other run); after that a call
      // every 100 us, so that a rank waiting long for a missing one leaves its core to others.
      for (;;) {
        if (test()) return;
        const auto waited = std::chrono::steady_clock::now() - start;
        if (waited >= timeout) timed_out(timeout);
        if (waited < std::chrono::milliseconds(1)) continue;
        if (waited < spin_time) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
      }
    }

    /// True once the collective is complete on this rank (never blocks). Throws dist_error when
    /// MPI reports an error.
    bool test() {
      const auto lock = state_ ? state_->guard() : std::unique_lock<std::mutex>();
      if (state_) state_->p2p.progress();  // all of this communicator's own collectives move on
      if (p2p_) {
        if (!p2p_->done()) return false;
        const auto p2p = std::exchange(p2p_, nullptr);
        if (p2p->error() != MPI_SUCCESS) [[unlikely]]
          detail::mpi_failure(p2p->error(),
                              "mpi_comm: " + describe() + " (" + p2p->failed_call() + ")");
        return true;
      }
      if (req_ == MPI_REQUEST_NULL) return true;
      int done = 0;
      const int rc = MPI_Test(&req_, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) [[unlikely]] {
        req_ = MPI_REQUEST_NULL;
        detail::mpi_failure(rc, "mpi_comm: " + describe() + " (MPI_Test)");
      }
      return done != 0;
    }

    /// This collective's number on its communicator (0 for the first): the same on every rank.
    [[nodiscard]] std::uint64_t sequence() const noexcept { return label_.seq; }

   private:
    friend class mpi_comm;
    request(std::shared_ptr<detail::mpi_state> state, MPI_Request req, const char* op,
            const char* detail, std::size_t count, const char* type, std::uint64_t seq,
            std::shared_ptr<detail::p2p_op> p2p = nullptr) noexcept
        : state_(std::move(state)),
          req_(req),
          p2p_(std::move(p2p)),
          label_{op, detail, type, count, seq} {}

    void take(request& other) noexcept {
      state_ = std::move(other.state_);
      req_ = std::exchange(other.req_, MPI_REQUEST_NULL);
      p2p_ = std::move(other.p2p_);
      label_ = other.label_;
    }

    [[nodiscard]] std::string describe() const { return label_.describe(); }

    [[noreturn, gnu::cold, gnu::noinline]] void timed_out(std::chrono::milliseconds timeout) const {
      const auto lock = state_->guard();  // missing_ranks reads the other ranks' words
      throw dist_error("hone::dist::mpi_comm: " + describe() + " did not complete within " +
                       std::to_string(timeout.count()) + " ms on rank " +
                       std::to_string(state_->rank) + " of " + std::to_string(state_->size) + ": " +
                       state_->missing_ranks(label_.seq) +
                       ". A rank that has not started a collective skipped it, called another "
                       "one, is stuck, or died. The request is still pending: wait() again, or "
                       "end the job (mpi_comm::abort)");
    }

    void finish_or_abort() noexcept {
      if (req_ == MPI_REQUEST_NULL && !p2p_) return;
      try {
        wait();
      } catch (const std::exception& e) {
        std::fprintf(stderr,
                     "%s\nhone::dist::mpi_comm: a request destroyed before it completed "
                     "could not be completed; aborting the job\n",
                     e.what());
        std::fflush(stderr);
        MPI_Abort(state_->comm, 1);
      }
    }

    std::shared_ptr<detail::mpi_state> state_;
    MPI_Request req_ = MPI_REQUEST_NULL;
    std::shared_ptr<detail::p2p_op> p2p_;  // mpi_comm's own transfers, or null
    detail::collective_label label_;
  };

  /// Duplicates `base` (MPI must be initialized: hone::dist::mpi_environment or the program).
  /// Collective over `base`; so is its destruction (with missing_ranks::named, which creates a
  /// one-word window per rank).
  explicit mpi_comm(MPI_Comm base = MPI_COMM_WORLD,
                    std::chrono::milliseconds timeout = default_timeout,
                    missing_ranks naming = missing_ranks::named)
      : state_(std::make_shared<detail::mpi_state>()) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) {
      throw dist_error(
          "hone::dist::mpi_comm: MPI is not initialized (or already finalized); create a "
          "hone::dist::mpi_environment first, or call MPI_Init_thread, and keep it alive while "
          "communicators are used");
    }
    set_timeout(timeout);
    auto& s = *state_;
    detail::mpi_check(MPI_Comm_dup(base, &s.comm), "mpi_comm: MPI_Comm_dup");
    detail::mpi_check(MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN),
                      "mpi_comm: MPI_Comm_set_errhandler");
    detail::mpi_check(MPI_Comm_rank(s.comm, &s.rank), "mpi_comm: MPI_Comm_rank");
    detail::mpi_check(MPI_Comm_size(s.comm, &s.size), "mpi_comm: MPI_Comm_size");
    s.ops.create();
    if (naming == missing_ranks::named) s.create_window();
    s.ring.emplace();
    s.p2p.init(s.comm);
    s.eager_limit = detail::transport_eager_limit(s.comm);
    s.exchange = detail::exchange_for_eager_limit(s.eager_limit);
  }

  mpi_comm(mpi_comm&&) noexcept = default;
  mpi_comm& operator=(mpi_comm&&) noexcept = default;

  [[nodiscard]] int rank() const noexcept { return state_->rank; }
  [[nodiscard]] int size() const noexcept { return state_->size; }
  /// How long wait() blocks before it throws (requests read it when they wait).
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return state_->timeout; }
  void set_timeout(std::chrono::milliseconds timeout) {
    HONE_REQUIRE(timeout.count() > 0, "hone::dist::mpi_comm: the timeout must be positive (it is " +
                                          std::to_string(timeout.count()) + " ms)");
    state_->timeout = timeout;
  }
  /// The duplicated MPI communicator, for the program's own MPI calls beside hone's.
  [[nodiscard]] MPI_Comm native() const noexcept { return state_->comm; }
  /// Whether a timeout names the ranks that have not started the collective.
  [[nodiscard]] bool names_missing_ranks() const noexcept { return state_->win != MPI_WIN_NULL; }

  /// The eager limit of the MPI library's transports (bytes per message with its header), read
  /// through the MPI tool interface when the communicator was made and agreed by its ranks; 0
  /// when unknown (another MPI library, Open MPI's pml/ucx). detail/eager_limit.hpp says which
  /// variables.
  [[nodiscard]] std::size_t eager_limit() const noexcept { return state_->eager_limit; }
  /// The exchange's sizes: by default exchange_for_eager_limit(eager_limit()) (messages that go
  /// eagerly, all_reduce buffers up to 48 KiB, all_gather blocks up to twice the limit).
  [[nodiscard]] exchange_limits exchange() const noexcept { return state_->exchange; }
  /// Sizes the exchange for the all_reduces and all_gathers started from now on; max_bytes = 0
  /// turns it off.
  /// Every rank must set the same values (their receives are posted with the message sizes), like
  /// any collective setting; no rank checks the others.
  void set_exchange(exchange_limits limits) {
    HONE_REQUIRE(limits.max_bytes == 0 || limits.message_bytes > 0,
                 "hone::dist::mpi_comm::set_exchange: message_bytes must be positive when the "
                 "exchange is on (max_bytes = " +
                     std::to_string(limits.max_bytes) + ")");
    const auto lock = state_->guard();
    state_->exchange = limits;
  }

  /// Starts a thread that drives this communicator's collectives in flight every `interval`
  /// (their transfers and hone's own reductions move while the program computes, without its
  /// test() calls); every MPI call on the communicator then holds a mutex. Needs
  /// MPI_THREAD_MULTIPLE (the thread calls MPI beside the program's own calls). Stopped by
  /// stop_progress_thread(), by the communicator's end, or by MPI_Finalize. Off by default:
  /// docs/dist.md says when it pays.
  void start_progress_thread(std::chrono::microseconds interval = std::chrono::microseconds(50)) {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    HONE_REQUIRE(level == MPI_THREAD_MULTIPLE,
                 std::string("hone::dist::mpi_comm::start_progress_thread: MPI provides ") +
                     to_string(detail::from_mpi(level)) +
                     ", but a progress thread calls MPI beside the program's own calls; "
                     "initialize MPI with MPI_THREAD_MULTIPLE (hone::dist::mpi_environment(argc, "
                     "argv, hone::dist::thread_level::multiple))");
    HONE_REQUIRE(interval.count() > 0,
                 "hone::dist::mpi_comm::start_progress_thread: the interval "
                 "must be positive (it is " +
                     std::to_string(interval.count()) + " us)");
    stop_progress_thread();
    detail::mpi_state* s = state_.get();
    s->progress = std::make_unique<detail::progress_thread>(
        s->mutex, [s] { s->poll(); }, interval);
  }
  /// Stops the progress thread (nothing when none runs).
  void stop_progress_thread() noexcept { state_->progress.reset(); }
  [[nodiscard]] bool has_progress_thread() const noexcept { return state_->progress != nullptr; }

  /// In place: every rank's `data` becomes the elementwise reduction over the ranks.
  template <class T>
  [[nodiscard]] request all_reduce(std::span<T> data, reduce_op op) {
    const int count = checked_count(data.size(), "all_reduce");
    const auto lock = state_->guard();
    // Small messages on a few ranks: hone's own exchange (detail/p2p_all_reduce.hpp).
    if (detail::p2p_all_reduce_fits(state_->exchange, size(), data.size_bytes())) {
      auto p2p = detail::start_all_reduce(state_->p2p, state_->comm, rank(), size(), data.data(),
                                          data.size(), detail::mpi_type<T>(), op, state_->sequence,
                                          state_->exchange.message_bytes);
      check(p2p->error(), "all_reduce", p2p->failed_call());
      return started(MPI_REQUEST_NULL, "all_reduce", to_string(op), data.size(),
                     detail::type_name<T>(), std::move(p2p));
    }
    MPI_Request r = MPI_REQUEST_NULL;
    const auto start = [&] {
      return MPI_Iallreduce(MPI_IN_PLACE, data.data(), count, detail::mpi_type<T>(), mpi_op<T>(op),
                            state_->comm, &r);
    };
    // Sums of at least one element per rank: Open MPI's ring instead of its in-place default (a
    // binomial reduce and broadcast through rank 0), see docs/dist.md. The 16-bit sums too: their
    // MPI operations (mpi_comm's own) are commutative, and the ring reduces each block once.
    const bool ring = op == reduce_op::sum && data.size() >= static_cast<std::size_t>(state_->size);
    check(ring ? state_->ring->run(start) : start(), "all_reduce", "MPI_Iallreduce");
    return started(r, "all_reduce", to_string(op), data.size(), detail::type_name<T>());
  }

  /// Rank r's `out` becomes the reduction over the ranks of block r of their `in`
  /// (in.size() == out.size() * size(); `in` and `out` must not overlap).
  template <class T>
  [[nodiscard]] request reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    HONE_REQUIRE(in.size() == out.size() * static_cast<std::size_t>(size()),
                 "hone::dist::mpi_comm::reduce_scatter: the input holds " +
                     std::to_string(in.size()) + " elements, which is not the output's " +
                     std::to_string(out.size()) + " times the " + std::to_string(size()) +
                     " ranks; pad the input to a multiple of the number of ranks");
    require_disjoint(in, std::span<const T>(out), "reduce_scatter");
    checked_count(in.size(), "reduce_scatter");
    const auto lock = state_->guard();
    // Something to move: hone's own transfers (header comment).
    if (size() > 1 && !out.empty()) {
      auto p2p = detail::start_reduce_scatter(state_->p2p, state_->comm, rank(), size(), in.data(),
                                              out.data(), out.size(), detail::mpi_type<T>(), op,
                                              state_->sequence);
      check(p2p->error(), "reduce_scatter", p2p->failed_call());
      return started(MPI_REQUEST_NULL, "reduce_scatter", to_string(op), in.size(),
                     detail::type_name<T>(), std::move(p2p));
    }
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Ireduce_scatter_block(in.data(), out.data(), static_cast<int>(out.size()),
                                    detail::mpi_type<T>(), mpi_op<T>(op), state_->comm, &r),
          "reduce_scatter", "MPI_Ireduce_scatter_block");
    return started(r, "reduce_scatter", to_string(op), in.size(), detail::type_name<T>());
  }

  /// Block r of every rank's `out` becomes rank r's `in` (out.size() == in.size() * size()).
  /// `in` may be this rank's own block of `out` (in place); otherwise they must not overlap.
  template <class T>
  [[nodiscard]] request all_gather(std::span<const T> in, std::span<T> out) {
    HONE_REQUIRE(out.size() == in.size() * static_cast<std::size_t>(size()),
                 "hone::dist::mpi_comm::all_gather: the output holds " +
                     std::to_string(out.size()) + " elements, which is not the input's " +
                     std::to_string(in.size()) + " times the " + std::to_string(size()) +
                     " ranks; size the output as in.size() * size()");
    checked_count(out.size(), "all_gather");
    const bool in_place =
        !in.empty() && in.data() == out.data() + in.size() * static_cast<std::size_t>(rank());
    if (!in_place) require_disjoint(in, std::span<const T>(out), "all_gather");
    const auto lock = state_->guard();
    // Small blocks on a few ranks: hone's own exchange (detail/p2p_all_gather.hpp).
    if (detail::p2p_all_gather_fits(state_->exchange, size(), in.size_bytes())) {
      auto p2p = detail::start_all_gather(
          state_->p2p, state_->comm, rank(), size(), in_place ? nullptr : in.data(), out.data(),
          in.size(), detail::mpi_type<T>(), state_->sequence, state_->exchange.message_bytes);
      check(p2p->error(), "all_gather", p2p->failed_call());
      return started(MPI_REQUEST_NULL, "all_gather", "", out.size(), detail::type_name<T>(),
                     std::move(p2p));
    }
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data(), static_cast<int>(in.size()),
                         detail::mpi_type<T>(), out.data(), static_cast<int>(in.size()),
                         detail::mpi_type<T>(), state_->comm, &r),
          "all_gather", "MPI_Iallgather");
    return started(r, "all_gather", "", out.size(), detail::type_name<T>());
  }

  /// Every rank's `data` becomes the root's.
  template <class T>
  [[nodiscard]] request broadcast(std::span<T> data, int root) {
    HONE_REQUIRE(root >= 0 && root < size(), "hone::dist::mpi_comm::broadcast: root " +
                                                 std::to_string(root) + " is not a rank of this " +
                                                 std::to_string(size()) + "-rank communicator");
    const int count = checked_count(data.size(), "broadcast");
    const auto lock = state_->guard();
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Ibcast(data.data(), count, detail::mpi_type<T>(), root, state_->comm, &r),
          "broadcast", "MPI_Ibcast");
    return started(r, "broadcast", "", data.size(), detail::type_name<T>());
  }

  /// Complete once every rank has started it.
  [[nodiscard]] request barrier() {
    const auto lock = state_->guard();
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(state_->comm, &r), "barrier", "MPI_Ibarrier");
    return started(r, "barrier", "", 0, "");
  }

  /// Ends every process of the job (MPI_Abort on this communicator) with exit code `code`.
  [[noreturn]] void abort(int code = 1) const noexcept {
    MPI_Abort(state_->comm, code);
    std::terminate();  // MPI_Abort does not return; should it, nothing else is safe
  }

 private:
  /// Throws dist_error naming the collective, its sequence number and MPI's error string.
  void check(int rc, const char* op, const char* call) const {
    if (rc != MPI_SUCCESS) [[unlikely]]
      detail::mpi_failure(rc, std::string("mpi_comm: ") + op + " #" +
                                  std::to_string(state_->sequence) + " (" + call + ")");
  }

  template <class T>
  MPI_Op mpi_op(reduce_op op) const noexcept {
    return state_->ops.of<T>(op);
  }

  static int checked_count(std::size_t n, const char* what) {
    HONE_REQUIRE(n <= static_cast<std::size_t>(INT_MAX),
                 std::string("hone::dist::mpi_comm::") + what + ": " + std::to_string(n) +
                     " elements exceed MPI's int count; split the span into pieces of at most " +
                     std::to_string(INT_MAX) + " elements");
    return static_cast<int>(n);
  }

  template <class T>
  static void require_disjoint(std::span<const T> in, std::span<const T> out, const char* what) {
    const bool overlap = !in.empty() && !out.empty() && in.data() < out.data() + out.size() &&
                         out.data() < in.data() + in.size();
    HONE_REQUIRE(!overlap, std::string("hone::dist::mpi_comm::") + what +
                               ": the input and output spans overlap; use separate slices");
  }

  request started(MPI_Request r, const char* op, const char* detail, std::size_t count,
                  const char* type, std::shared_ptr<detail::p2p_op> p2p = nullptr) {
    state_->publish(state_->sequence + 1);
    return request(state_, r, op, detail, count, type, state_->sequence++, std::move(p2p));
  }

  std::shared_ptr<detail::mpi_state> state_;
};

static_assert(communicator<mpi_comm>);

}  // namespace dist

HONE_NAMESPACE_END

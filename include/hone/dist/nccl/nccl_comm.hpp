// hone/dist/nccl/nccl_comm.hpp: the NCCL communicator for data in GPU memory (CMake target
// hone::nccl, which links NCCL and the CUDA runtime). Not part of <hone/dist.hpp>: only files that
// include this header need NCCL. A host header: it compiles with the host compiler or nvcc.
//
//   // every rank: one GPU per rank, chosen before the communicator is made
//   cudaSetDevice(local_rank);
//   hone::dist::mpi_comm world;                                    // any host communicator
//   auto comm = hone::dist::nccl_comm::bootstrap(world, stream);   // rank 0's id, broadcast
//   comm.all_reduce(std::span<float>(d_grads, n), hone::dist::reduce_op::sum).wait();
//
// or, with the unique id moved by the program itself (a file, a key-value store, its own MPI):
//   auto id = rank == 0 ? hone::dist::nccl_unique_id::create() : receive_from_rank_0();
//   hone::dist::nccl_comm comm(id, rank, size, stream);
//
// nccl_comm satisfies hone::dist::communicator with spans over device memory (cudaMalloc or
// managed): every collective is enqueued on the communicator's CUDA stream and the returned
// request carries a CUDA event recorded after it. request::wait() blocks the calling thread until
// the event has completed (the collective is done on this rank); work the program enqueues on the
// same stream after the call is ordered after the collective without any wait, which is how a
// training step uses it. A span in host memory, in another GPU's memory, or of a size that does
// not divide as the collective requires is refused with a hone::dist_error before anything is
// enqueued.
//
// Failure is never a hang. The communicator is created non-blocking (ncclConfig_t::blocking = 0):
// creation waits for every rank for at most the communicator's timeout, and request::wait() polls
// its event and ncclCommGetAsyncError; when NCCL reports an error, or the collective has not
// completed when the timeout passes (default 300 s, counted from the call to wait()), it throws
// hone::dist_error naming the operation, its sequence number on this communicator, this rank and
// NCCL's own words (ncclGetLastError). NCCL does not say which rank is missing: the message says
// so; hone::dist::mpi_comm (which names missing ranks) can be asked by the program with a barrier
// of its own. After a timeout the communicator is unusable: abort() (ncclCommAbort) stops its
// kernels and frees it; the destructor does that by itself when the communicator failed.
//
// Reductions: sum, and max. Unlike mpi_comm, max is NCCL's: for floating types a NaN on one rank
// is not guaranteed to reach the result (NCCL uses the hardware max); reduce a NaN flag with sum
// when that matters.
//
// Element types: float, double, std::int32_t, std::int64_t, std::uint8_t, hone::half and
// hone::bfloat16 (NCCL's ncclFloat16 / ncclBfloat16: the same bits). Threads: one nccl_comm and
// its requests are used from one thread at a time; requests keep the communicator's state alive,
// so a request may outlive the nccl_comm object that started it.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/bfloat16.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/half.hpp"
#include "hone/dist/communicator.hpp"

HONE_NAMESPACE_BEGIN

namespace dist {

namespace detail {

template <class T>
inline constexpr bool nccl_supported_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint8_t> ||
    std::is_same_v<T, ::hone::half> || std::is_same_v<T, ::hone::bfloat16>;

template <class T>
constexpr ncclDataType_t nccl_type() noexcept {
  if constexpr (std::is_same_v<T, float>)
    return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return ncclFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return ncclInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return ncclInt64;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return ncclUint8;
  else if constexpr (std::is_same_v<T, ::hone::half>)
    return ncclFloat16;
  else
    return ncclBfloat16;
}

template <class T>
constexpr const char* nccl_type_name() noexcept {
  if constexpr (std::is_same_v<T, float>)
    return "float";
  else if constexpr (std::is_same_v<T, double>)
    return "double";
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return "int32";
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return "int64";
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return "uint8";
  else if constexpr (std::is_same_v<T, ::hone::half>)
    return "half";
  else
    return "bfloat16";
}

template <class T>
consteval bool check_nccl_type() {
  static_assert(nccl_supported_v<std::remove_const_t<T>>,
                "hone::dist::nccl_comm: this element type has no NCCL data type. Use float, "
                "double, std::int32_t, std::int64_t, std::uint8_t, hone::half or hone::bfloat16.");
  return true;
}

/// The shared state of an nccl_comm and its requests.
struct nccl_state {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  std::uint64_t next_seq = 0;
  bool failed = false;   // an error or a timeout was reported: only abort() helps now
  bool aborted = false;  // ncclCommAbort has run
  std::vector<cudaEvent_t> free_events;
  int* barrier_word = nullptr;  // one device int for barrier()

  nccl_state() = default;
  nccl_state(const nccl_state&) = delete;
  nccl_state& operator=(const nccl_state&) = delete;

  ~nccl_state() {
    if (comm != nullptr && !aborted) {
      // A healthy communicator is finalized (its last collectives flushed; for a non-blocking
      // one that is polled, for at most the timeout) and destroyed; a failed one is aborted.
      if (failed || !finalize()) {
        (void)ncclCommAbort(comm);
      } else {
        (void)ncclCommDestroy(comm);
      }
    }
    for (cudaEvent_t e : free_events) (void)cudaEventDestroy(e);
    if (barrier_word != nullptr) (void)cudaFree(barrier_word);
  }

  bool finalize() noexcept {
    ncclResult_t rc = ncclCommFinalize(comm);
    const auto start = std::chrono::steady_clock::now();
    while (rc == ncclInProgress) {
      if (std::chrono::steady_clock::now() - start >= timeout) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return false;
      rc = state;
    }
    return rc == ncclSuccess;
  }

  [[nodiscard]] std::string where() const {
    return "rank " + std::to_string(rank) + " of " + std::to_string(size);
  }

  /// NCCL's last words for this communicator (empty if it has none).
  [[nodiscard]] std::string last_error() const {
    const char* s = ncclGetLastError(comm);
    return s != nullptr && s[0] != '\0' ? std::string(" (NCCL: ") + s + ")" : std::string();
  }

  [[noreturn, gnu::cold, gnu::noinline]] void nccl_failure(ncclResult_t rc, std::string_view what) {
    failed = true;
    throw dist_error("hone::dist::nccl_comm: " + std::string(what) + " failed on " + where() +
                     ": " + ncclGetErrorString(rc) + last_error() +
                     ". The communicator is unusable now: call abort() (or destroy it)");
  }

  /// Waits until a non-blocking NCCL call has finished enqueueing (ncclInProgress), at most the
  /// timeout; throws on an error.
  void settle(ncclResult_t rc, std::string_view what) {
    if (rc == ncclSuccess) return;
    if (rc != ncclInProgress) nccl_failure(rc, what);
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
      if (q != ncclSuccess) nccl_failure(q, std::string(what) + " (ncclCommGetAsyncError)");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) nccl_failure(state, what);
      if (std::chrono::steady_clock::now() - start >= timeout) {
        failed = true;
        throw dist_error("hone::dist::nccl_comm: " + std::string(what) + " did not finish within " +
                         std::to_string(timeout.count()) + " ms on " + where() +
                         ". NCCL does not say which rank is missing: a rank did not make the "
                         "same call with the same unique id and size, is stuck, or died. The "
                         "communicator is unusable now: call abort() (or destroy it)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  cudaEvent_t take_event() {
    if (!free_events.empty()) {
      cudaEvent_t e = free_events.back();
      free_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }

  void cuda(cudaError_t rc, std::string_view what) const {
    if (rc != cudaSuccess) [[unlikely]] {
      (void)cudaGetLastError();
      throw dist_error("hone::dist::nccl_comm: " + std::string(what) + " failed on " + where() +
                       ": " + cudaGetErrorString(rc));
    }
  }
};

}  // namespace detail

/// NCCL's unique id of a communicator: made by one rank (create()), moved to every other rank by
/// the program (or by nccl_comm::bootstrap), and given to each rank's nccl_comm.
struct nccl_unique_id {
  ncclUniqueId id{};

  /// A fresh id (ncclGetUniqueId: it opens the listening socket the other ranks connect to).
  [[nodiscard]] static nccl_unique_id create() {
    nccl_unique_id u;
    const ncclResult_t rc = ncclGetUniqueId(&u.id);
    if (rc != ncclSuccess) {
      throw dist_error(std::string("hone::dist::nccl_unique_id::create: ncclGetUniqueId failed: ") +
                       ncclGetErrorString(rc));
    }
    return u;
  }

  /// The id as 16 int64 words (what bootstrap broadcasts over a host communicator).
  static constexpr std::size_t words = (sizeof(ncclUniqueId) + 7) / 8;
  [[nodiscard]] std::array<std::int64_t, words> to_words() const noexcept {
    std::array<std::int64_t, words> w{};
    std::memcpy(w.data(), &id, sizeof(id));
    return w;
  }
  [[nodiscard]] static nccl_unique_id from_words(std::span<const std::int64_t, words> w) noexcept {
    nccl_unique_id u;
    std::memcpy(&u.id, w.data(), sizeof(u.id));
    return u;
  }
};

/// A communicator over NCCL for spans in GPU memory (see the header comment). Move-only.
class nccl_comm {
 public:
  static constexpr std::chrono::milliseconds default_timeout{std::chrono::seconds(300)};

  /// A started collective: an event recorded on the communicator's stream after it. Move-only;
  /// default-constructed, it is complete. Dropping a request does not wait: the collective stays
  /// ordered on the stream, before whatever the program enqueues there next.
  class request {
   public:
    request() = default;
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    request(request&& other) noexcept { take(other); }
    request& operator=(request&& other) noexcept {
      if (this != &other) {
        release();
        take(other);
      }
      return *this;
    }
    ~request() { release(); }

    /// Blocks until the collective is complete on this rank. Throws dist_error when NCCL or CUDA
    /// reports an error or when the communicator's timeout passes first (the communicator is
    /// then unusable: abort() it).
    void wait() {
      if (event_ == nullptr) return;
      const auto start = std::chrono::steady_clock::now();
      for (;;) {
        if (test()) return;
        const auto waited = std::chrono::steady_clock::now() - start;
        if (waited >= state_->timeout) timed_out();
        if (waited < std::chrono::milliseconds(1)) continue;
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }

    /// True once the collective is complete on this rank (never blocks). Throws dist_error when
    /// NCCL or CUDA reports an error.
    bool test() {
      if (event_ == nullptr) return true;
      const cudaError_t q = cudaEventQuery(event_);
      if (q == cudaSuccess) {
        release();
        return true;
      }
      if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        state_->failed = true;
        const std::string what = describe();
        release();
        throw dist_error("hone::dist::nccl_comm: " + what + " failed on " + where() + ": " +
                         cudaGetErrorString(q));
      }
      ncclResult_t async = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(state_->comm, &async);
      if (rc != ncclSuccess) state_->nccl_failure(rc, describe() + " (ncclCommGetAsyncError)");
      if (async != ncclSuccess && async != ncclInProgress) state_->nccl_failure(async, describe());
      return false;
    }

    /// This collective's number on its communicator (0 for the first): the same on every rank.
    [[nodiscard]] std::uint64_t sequence() const noexcept { return label_.seq; }

   private:
    friend class nccl_comm;
    request(std::shared_ptr<detail::nccl_state> state, cudaEvent_t event, const char* op,
            const char* detail, std::size_t count, const char* type, std::uint64_t seq) noexcept
        : state_(std::move(state)), event_(event), label_{op, detail, type, count, seq} {}

    void take(request& other) noexcept {
      state_ = std::move(other.state_);
      event_ = std::exchange(other.event_, nullptr);
      label_ = other.label_;
    }

    /// Gives the event back to the pool (an event still pending may be re-recorded later: its
    /// next record replaces this one, which the stream still orders).
    void release() noexcept {
      if (event_ == nullptr) return;
      try {
        state_->free_events.push_back(event_);
      } catch (...) {
        (void)cudaEventDestroy(event_);
      }
      event_ = nullptr;
    }

    [[nodiscard]] std::string where() const { return state_->where(); }

    [[nodiscard]] std::string describe() const { return label_.describe(); }

    [[noreturn, gnu::cold, gnu::noinline]] void timed_out() {
      state_->failed = true;
      const std::string what = describe();
      throw dist_error("hone::dist::nccl_comm: " + what + " did not complete within " +
                       std::to_string(state_->timeout.count()) + " ms on " + where() +
                       state_->last_error() +
                       ". NCCL does not say which rank is missing: a rank skipped this "
                       "collective, called another one, is stuck, or died. The communicator is "
                       "unusable now: call abort() (or destroy it)");
    }

    std::shared_ptr<detail::nccl_state> state_;
    cudaEvent_t event_ = nullptr;
    detail::collective_label label_;
  };

  /// Joins the communicator of `size` ranks named by `id` as `rank`, on the current CUDA device,
  /// enqueueing its collectives on `stream`. Collective: every rank makes the same call with the
  /// same id and size; waits for them at most `timeout` (then dist_error, never a hang).
  nccl_comm(const nccl_unique_id& id, int rank, int size, cudaStream_t stream,
            std::chrono::milliseconds timeout = default_timeout)
      : state_(std::make_shared<detail::nccl_state>()) {
    auto& s = *state_;
    HONE_REQUIRE(size >= 1,
                 "hone::dist::nccl_comm: the number of ranks must be at least 1 (it is " +
                     std::to_string(size) + ")");
    HONE_REQUIRE(rank >= 0 && rank < size, "hone::dist::nccl_comm: rank " + std::to_string(rank) +
                                               " is not in [0, " + std::to_string(size) +
                                               "): pass this process's rank");
    set_timeout(timeout);
    s.rank = rank;
    s.size = size;
    s.stream = stream;
    s.cuda(cudaGetDevice(&s.device), "cudaGetDevice");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t rc = ncclCommInitRankConfig(&comm, size, id.id, rank, &config);
    s.comm = comm;
    if (rc != ncclSuccess && rc != ncclInProgress) {
      s.failed = comm != nullptr;
      throw dist_error("hone::dist::nccl_comm: ncclCommInitRankConfig failed on " + s.where() +
                       ": " + ncclGetErrorString(rc) +
                       (comm != nullptr ? s.last_error() : std::string()));
    }
    s.settle(rc,
             "joining the communicator (ncclCommInitRankConfig; every rank must join with "
             "the same unique id and size)");
    s.cuda(cudaMalloc(reinterpret_cast<void**>(&s.barrier_word), sizeof(int)), "cudaMalloc");
    s.cuda(cudaMemsetAsync(s.barrier_word, 0, sizeof(int), s.stream), "cudaMemsetAsync");
  }

  /// Rank 0 of `host` creates the unique id and broadcasts it over `host` (a host communicator:
  /// hone::dist::mpi_comm, or any whose broadcast takes std::span<std::int64_t>); every rank then
  /// joins with host's rank and size.
  template <class HostComm>
  requires requires(HostComm& c, std::span<std::int64_t> w) {
    c.broadcast(w, 0).wait();
    { c.rank() } -> std::convertible_to<int>;
    { c.size() } -> std::convertible_to<int>;
  }
  [[nodiscard]] static nccl_comm bootstrap(HostComm& host, cudaStream_t stream,
                                           std::chrono::milliseconds timeout = default_timeout) {
    std::array<std::int64_t, nccl_unique_id::words> w{};
    if (host.rank() == 0) w = nccl_unique_id::create().to_words();
    host.broadcast(std::span<std::int64_t>(w), 0).wait();
    return nccl_comm(nccl_unique_id::from_words(w), host.rank(), host.size(), stream, timeout);
  }

  nccl_comm(nccl_comm&&) noexcept = default;
  nccl_comm& operator=(nccl_comm&&) noexcept = default;
  nccl_comm(const nccl_comm&) = delete;
  nccl_comm& operator=(const nccl_comm&) = delete;
  ~nccl_comm() = default;  // the state goes with the last request holding it

  [[nodiscard]] int rank() const noexcept { return state_->rank; }
  [[nodiscard]] int size() const noexcept { return state_->size; }
  [[nodiscard]] int device() const noexcept { return state_->device; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return state_->stream; }
  [[nodiscard]] ncclComm_t native() const noexcept { return state_->comm; }
  /// Whether an error or a timeout was reported (the communicator can then only be aborted).
  [[nodiscard]] bool failed() const noexcept { return state_->failed; }

  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return state_->timeout; }
  void set_timeout(std::chrono::milliseconds timeout) {
    HONE_REQUIRE(timeout.count() > 0,
                 "hone::dist::nccl_comm: the timeout must be positive (it is " +
                     std::to_string(timeout.count()) + " ms)");
    state_->timeout = timeout;
  }

  /// Stops this rank's NCCL work (its kernels return) and frees the communicator
  /// (ncclCommAbort). Every later call throws dist_error.
  void abort() noexcept {
    auto& s = *state_;
    if (s.comm != nullptr && !s.aborted) {
      (void)ncclCommAbort(s.comm);
      s.aborted = true;
      s.failed = true;
    }
  }

  /// In place: every rank's `data` becomes the elementwise reduction over the ranks.
  template <class T>
  [[nodiscard]] request all_reduce(std::span<T> data, reduce_op op) {
    static_assert(detail::check_nccl_type<T>());
    check_usable("all_reduce");
    check_device(data.data(), data.size_bytes(), "all_reduce", "data");
    return enqueue<T>("all_reduce", to_string(op), data.size(), [&](ncclComm_t c, cudaStream_t st) {
      return ncclAllReduce(data.data(), data.data(), data.size(), detail::nccl_type<T>(),
                           nccl_op(op), c, st);
    });
  }

  /// In place: every rank's `data` becomes the elementwise mean over the ranks (NCCL's ncclAvg;
  /// for floating types NCCL multiplies each rank's value by 1/size() before summing: the sum
  /// divided by size() within rounding, exactly so for one rank).
  template <class T>
  [[nodiscard]] request all_reduce_average(std::span<T> data) {
    static_assert(detail::check_nccl_type<T>());
    check_usable("all_reduce_average");
    check_device(data.data(), data.size_bytes(), "all_reduce_average", "data");
    return enqueue<T>("all_reduce", "average", data.size(), [&](ncclComm_t c, cudaStream_t st) {
      return ncclAllReduce(data.data(), data.data(), data.size(), detail::nccl_type<T>(), ncclAvg,
                           c, st);
    });
  }

  /// in.size() == out.size() * size(): rank r receives the reduction of block r of every rank's
  /// `in`. `out` may be block rank() of `in` (in place).
  template <class T>
  [[nodiscard]] request reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    static_assert(detail::check_nccl_type<T>());
    check_usable("reduce_scatter");
    HONE_REQUIRE(in.size() == out.size() * static_cast<std::size_t>(size()),
                 "hone::dist::nccl_comm::reduce_scatter: the input holds " +
                     std::to_string(in.size()) + " elements and the output " +
                     std::to_string(out.size()) + " on " + state_->where() +
                     "; the input must hold size() blocks of the output's size (in.size() == "
                     "out.size() * size())");
    check_device(in.data(), in.size_bytes(), "reduce_scatter", "in");
    check_device(out.data(), out.size_bytes(), "reduce_scatter", "out");
    return enqueue<T>("reduce_scatter", to_string(op), in.size(),
                      [&](ncclComm_t c, cudaStream_t st) {
                        return ncclReduceScatter(in.data(), out.data(), out.size(),
                                                 detail::nccl_type<T>(), nccl_op(op), c, st);
                      });
  }

  /// out.size() == in.size() * size(): block r of `out` receives rank r's `in`. `in` may be
  /// block rank() of `out` (in place).
  template <class T>
  [[nodiscard]] request all_gather(std::span<const T> in, std::span<T> out) {
    static_assert(detail::check_nccl_type<T>());
    check_usable("all_gather");
    HONE_REQUIRE(out.size() == in.size() * static_cast<std::size_t>(size()),
                 "hone::dist::nccl_comm::all_gather: the input holds " + std::to_string(in.size()) +
                     " elements and the output " + std::to_string(out.size()) + " on " +
                     state_->where() +
                     "; the output must hold size() blocks of the input's size (out.size() == "
                     "in.size() * size())");
    check_device(in.data(), in.size_bytes(), "all_gather", "in");
    check_device(out.data(), out.size_bytes(), "all_gather", "out");
    return enqueue<T>("all_gather", "", out.size(), [&](ncclComm_t c, cudaStream_t st) {
      return ncclAllGather(in.data(), out.data(), in.size(), detail::nccl_type<T>(), c, st);
    });
  }

  /// Copies the root's `data` to every rank.
  template <class T>
  [[nodiscard]] request broadcast(std::span<T> data, int root) {
    static_assert(detail::check_nccl_type<T>());
    check_usable("broadcast");
    HONE_REQUIRE(root >= 0 && root < size(),
                 "hone::dist::nccl_comm::broadcast: root " + std::to_string(root) +
                     " is not a rank of this communicator (ranks 0 to " +
                     std::to_string(size() - 1) + ")");
    check_device(data.data(), data.size_bytes(), "broadcast", "data");
    return enqueue<T>("broadcast", "", data.size(), [&](ncclComm_t c, cudaStream_t st) {
      return ncclBroadcast(data.data(), data.data(), data.size(), detail::nccl_type<T>(), root, c,
                           st);
    });
  }

  /// Complete once every rank has started it (NCCL has no barrier: a one-int all_reduce, which
  /// cannot complete before every rank contributed).
  [[nodiscard]] request barrier() {
    check_usable("barrier");
    int* word = state_->barrier_word;
    return enqueue<int>("barrier", "", 0, [&](ncclComm_t c, cudaStream_t st) {
      return ncclAllReduce(word, word, 1, ncclInt32, ncclSum, c, st);
    });
  }

 private:
  static ncclRedOp_t nccl_op(reduce_op op) noexcept {
    return op == reduce_op::sum ? ncclSum : ncclMax;
  }

  void check_usable(const char* op) const {
    const auto& s = *state_;
    if (s.failed || s.aborted) {
      throw dist_error(std::string("hone::dist::nccl_comm::") + op + ": the communicator on " +
                       s.where() +
                       (s.aborted ? " was aborted" : " reported an error or a timeout before") +
                       "; make a new one (every rank must)");
    }
  }

  /// Refuses a span that is not in this communicator's GPU memory (NCCL would fault or hang).
  void check_device(const void* p, std::size_t bytes, const char* op, const char* name) const {
    if (bytes == 0) return;
    cudaPointerAttributes a{};
    const cudaError_t rc = cudaPointerGetAttributes(&a, p);
    if (rc != cudaSuccess) (void)cudaGetLastError();
    const bool device_memory =
        rc == cudaSuccess && (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged);
    if (!device_memory) {
      throw dist_error(
          std::string("hone::dist::nccl_comm::") + op + ": `" + name + "` is not GPU memory (" +
          (rc == cudaSuccess && a.type == cudaMemoryTypeHost ? "it is pinned host memory"
                                                             : "it is ordinary host memory") +
          "); nccl_comm moves spans in device memory (cudaMalloc or "
          "cudaMallocManaged). For host data use hone::dist::mpi_comm");
    }
    if (a.type == cudaMemoryTypeDevice && a.device != state_->device) {
      throw dist_error(std::string("hone::dist::nccl_comm::") + op + ": `" + name +
                       "` is in the memory of GPU " + std::to_string(a.device) +
                       ", but this communicator runs on GPU " + std::to_string(state_->device) +
                       "; allocate it on the communicator's device");
    }
  }

  template <class T, class Call>
  request enqueue(const char* op, const char* what, std::size_t count, Call&& call) {
    auto& s = *state_;
    const std::uint64_t seq = s.next_seq++;
    s.settle(call(s.comm, s.stream), op);
    cudaEvent_t e = s.take_event();
    const cudaError_t rc = cudaEventRecord(e, s.stream);
    if (rc != cudaSuccess) {
      s.free_events.push_back(e);
      s.cuda(rc, "cudaEventRecord");
    }
    return request(state_, e, op, what, count, detail::nccl_type_name<T>(), seq);
  }

  std::shared_ptr<detail::nccl_state> state_;
};

static_assert(communicator<nccl_comm>);

}  // namespace dist

HONE_NAMESPACE_END

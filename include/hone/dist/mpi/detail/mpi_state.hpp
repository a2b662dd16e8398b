// hone/dist/mpi/detail/mpi_state.hpp: what a hone::dist::mpi_comm and its requests share: the
// duplicated communicator, its reductions, the timeout, the missing-rank window and the reading of
// it at a timeout, the own collectives in flight, and the progress thread. Included by
// hone/dist/mpi/mpi_comm.hpp; not for direct use.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/dist/communicator.hpp"
#include "hone/dist/mpi/detail/eager_limit.hpp"
#include "hone/dist/mpi/detail/heartbeat.hpp"
#include "hone/dist/mpi/detail/iallreduce_ring.hpp"
#include "hone/dist/mpi/detail/mpi_errors.hpp"
#include "hone/dist/mpi/detail/p2p_all_gather.hpp"
#include "hone/dist/mpi/detail/p2p_all_reduce.hpp"
#include "hone/dist/mpi/detail/p2p_reduce_scatter.hpp"
#include "hone/dist/mpi/detail/progress_thread.hpp"
#include "hone/dist/mpi/detail/types.hpp"

HONE_NAMESPACE_BEGIN
namespace dist::detail {

/// What the communicator and its requests share: the MPI communicator, the max operation, the
/// timeout, and the window through which the ranks publish how many collectives they have
/// started. Freed when the last of them goes (after MPI_Finalize, nothing is freed).
struct mpi_state {
  MPI_Comm comm = MPI_COMM_NULL;
  mpi_ops ops;  // max with the NaN rule, the 16-bit sums and maxima
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  std::uint64_t sequence = 0;
  // The missing-rank window: this rank's two words hold the number of collectives it has started
  // and the process's heartbeat (detail/heartbeat.hpp).
  MPI_Win win = MPI_WIN_NULL;
  std::uint64_t* started = nullptr;  // this rank's first word (the window's memory)
  bool beating = false;              // the heartbeat writes started[1]
  bool separate_model = false;       // MPI_WIN_SEPARATE: a store needs MPI_Win_sync
  bool locked = false;               // inside MPI_Win_lock_all
  // The reads of the other ranks' words at a timeout; a read that has not completed stays
  // pending here (its buffer with it) and is tested again at the next timeout.
  std::vector<MPI_Request> probes;
  std::vector<std::uint64_t> probed;     // two words per rank
  std::vector<MPI_Request> beat_probes;  // the second reads of the heartbeats
  std::vector<std::uint64_t> beat_probed;
  // Open MPI's ring for all_reduce's sums (iallreduce_ring.hpp); made once MPI is initialized.
  std::optional<iallreduce_ring> ring;
  p2p_ops p2p;  // mpi_comm's own collectives in flight (p2p_op.hpp)
  // The transports' eager limit (eager_limit.hpp; 0: unknown) and the exchange of all_reduce and
  // all_gather sized by it (p2p_all_reduce.hpp), the same on every rank.
  std::size_t eager_limit = 0;
  exchange_limits exchange;
  // start_progress_thread(): the thread, and the mutex that every MPI call on this communicator
  // holds while it runs (detail/progress_thread.hpp).
  std::mutex mutex;
  std::unique_ptr<progress_thread> progress;

  mpi_state() = default;
  mpi_state(const mpi_state&) = delete;
  mpi_state& operator=(const mpi_state&) = delete;
  ~mpi_state() {
    progress.reset();  // its polls use this state
    if (beating) heartbeat().remove(&started[1]);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    free_window();
    ops.free();
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }

  /// Creates the window (collective over comm) and opens its passive-target epoch.
  void create_window() {
    MPI_Info info = MPI_INFO_NULL;
    mpi_check(MPI_Info_create(&info), "mpi_comm: MPI_Info_create");
    // Hints: every rank exposes one word, and only reads (MPI_Rget) target it.
    MPI_Info_set(info, "same_size", "true");
    MPI_Info_set(info, "same_disp_unit", "true");
    MPI_Info_set(info, "accumulate_ops", "same_op_no_op");
    void* base = nullptr;
    const int rc =
        MPI_Win_allocate(2 * sizeof(std::uint64_t), sizeof(std::uint64_t), info, comm, &base, &win);
    MPI_Info_free(&info);
    if (rc != MPI_SUCCESS) {
      throw dist_error(
          "hone::dist::mpi_comm: MPI_Win_allocate failed (" + mpi_error_string(rc) +
          "): the window through which the ranks publish their progress, so that a timeout can "
          "name the missing ranks, could not be created on this communicator; construct the "
          "mpi_comm with hone::dist::missing_ranks::not_named to do without it");
    }
    mpi_check(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN), "mpi_comm: MPI_Win_set_errhandler");
    started = static_cast<std::uint64_t*>(base);
    if (started == nullptr || reinterpret_cast<std::uintptr_t>(started) %
                                      std::atomic_ref<std::uint64_t>::required_alignment !=
                                  0) {
      throw dist_error(
          "hone::dist::mpi_comm: MPI_Win_allocate returned memory that is not aligned for an "
          "atomic 64-bit word; construct the mpi_comm with hone::dist::missing_ranks::not_named");
    }
    started[0] = 0;
    started[1] = 0;
    void* model = nullptr;
    int found = 0;
    mpi_check(MPI_Win_get_attr(win, MPI_WIN_MODEL, &model, &found), "mpi_comm: MPI_Win_get_attr");
    separate_model = found != 0 && *static_cast<int*>(model) == MPI_WIN_SEPARATE;
    mpi_check(MPI_Win_lock_all(MPI_MODE_NOCHECK, win), "mpi_comm: MPI_Win_lock_all");
    locked = true;
    // Every rank's words are 0 before any rank reads them (the reads happen after a collective).
    mpi_check(MPI_Win_sync(win), "mpi_comm: MPI_Win_sync");
    // The heartbeat's stores need no MPI call only where the window's memory is the public copy.
    if (!separate_model) beating = heartbeat().add(&started[1]);
  }

  void free_window() noexcept {
    if (win == MPI_WIN_NULL) return;
    if (beating) heartbeat().remove(&started[1]);
    beating = false;
    for (MPI_Request& r : probes) {
      if (r == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) {
        // A read that never completed (a rank that cannot answer): ending the epoch would wait
        // for it. The window is left to MPI_Finalize (or the end of the job).
        return;
      }
    }
    if (locked) MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
  }

  /// The lock every MPI call on this communicator holds while a progress thread runs (none
  /// otherwise; `progress` changes only between calls, on the program's thread).
  [[nodiscard]] std::unique_lock<std::mutex> guard() {
    return progress ? std::unique_lock<std::mutex>(mutex) : std::unique_lock<std::mutex>();
  }

  /// The progress thread's poll: the own collectives' next steps, then MPI's progress engine
  /// (MPI_Iprobe enters it; Open MPI's libnbc schedules move there).
  void poll() noexcept {
    p2p.progress();
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, MPI_STATUS_IGNORE);
  }

  /// Publishes that this rank has started `count` collectives (a store into its own word).
  void publish(std::uint64_t count) noexcept {
    if (started == nullptr) return;
    std::atomic_ref<std::uint64_t>(*started).store(count, std::memory_order_release);
    if (separate_model) MPI_Win_sync(win);
  }

  /// Starts MPI_Rget(s) of `count` words at `disp` from every rank q where `want(q)` and the
  /// previous read into that slot has completed, then polls them with MPI_Test for at most
  /// `limit`. Returns which reads completed; a failed one is added to `errors` and marked in
  /// `failed`.
  template <class Want>
  std::vector<bool> read_words(std::vector<MPI_Request>& reqs, std::vector<std::uint64_t>& into,
                               int count, MPI_Aint disp, Want want, std::chrono::milliseconds limit,
                               std::vector<bool>& failed, std::vector<std::string>& errors) {
    const std::size_t n = static_cast<std::size_t>(size);
    const auto words = static_cast<std::size_t>(count);
    if (reqs.size() != n) {
      reqs.assign(n, MPI_REQUEST_NULL);
      into.assign(n * words, 0);
    }
    std::vector<bool> asked(n, false);
    for (int q = 0; q < size; ++q) {
      const auto k = static_cast<std::size_t>(q);
      if (q == rank || failed[k] || !want(q)) continue;
      asked[k] = true;
      if (reqs[k] != MPI_REQUEST_NULL) continue;  // still pending from an earlier timeout
      const int rc = MPI_Rget(&into[k * words], count, MPI_UINT64_T, q, disp, count, MPI_UINT64_T,
                              win, &reqs[k]);
      if (rc != MPI_SUCCESS) {
        reqs[k] = MPI_REQUEST_NULL;
        failed[k] = true;
        errors.push_back("rank " + std::to_string(q) + ": " + mpi_error_string(rc));
      }
    }
    const auto start = std::chrono::steady_clock::now();
    std::vector<bool> done(n, false);
    for (;;) {
      bool all = true;
      for (int q = 0; q < size; ++q) {
        const auto k = static_cast<std::size_t>(q);
        if (!asked[k] || failed[k] || done[k]) continue;
        int flag = 0;
        const int rc = MPI_Test(&reqs[k], &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
          reqs[k] = MPI_REQUEST_NULL;
          failed[k] = true;
          errors.push_back("rank " + std::to_string(q) + ": " + mpi_error_string(rc));
        } else if (flag) {
          done[k] = true;
        } else {
          all = false;
        }
      }
      if (all || std::chrono::steady_clock::now() - start >= limit) break;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return done;
  }

  /// Reads the other ranks' words and says which of them have not started collective `seq`:
  /// "rank 2 has not started it (the last collective it started is #40); rank 1 has", and which
  /// show no sign of life (their heartbeat did not move within heartbeat_window).
  std::string missing_ranks(std::uint64_t seq) {
    if (win == MPI_WIN_NULL) {
      return "another rank has not started it (this communicator does not track which: it was "
             "created with missing_ranks::not_named)";
    }
    const std::size_t n = static_cast<std::size_t>(size);
    std::vector<std::string> errors;
    std::vector<bool> failed(n, false);
    const auto limit = std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(1));
    const std::vector<bool> done = read_words(
        probes, probed, 2, 0, [](int) { return true; }, limit, failed, errors);
    // The heartbeats: read again after heartbeat_window; a count that has not moved is a process
    // that is dead or stopped. 0 is a rank without a heartbeat (nothing is said of it).
    const auto first_beat = [&](int q) { return probed[2 * static_cast<std::size_t>(q) + 1]; };
    const auto beats = [&](int q) {
      return done[static_cast<std::size_t>(q)] && first_beat(q) != 0;
    };
    std::vector<int> lifeless;
    bool any_beat = false;
    for (int q = 0; q < size; ++q) any_beat = any_beat || (q != rank && beats(q));
    if (any_beat) {
      std::this_thread::sleep_for(heartbeat_window);
      const std::vector<bool> again =
          read_words(beat_probes, beat_probed, 1, 1, beats, limit, failed, errors);
      for (int q = 0; q < size; ++q) {
        const auto k = static_cast<std::size_t>(q);
        if (q != rank && beats(q) && again[k] && beat_probed[k] == first_beat(q))
          lifeless.push_back(q);
      }
    }
    std::vector<int> missing, present, silent;
    std::vector<std::string> last;
    for (int q = 0; q < size; ++q) {
      const auto k = static_cast<std::size_t>(q);
      if (q == rank) continue;
      if (failed[k]) continue;
      if (!done[k]) {
        silent.push_back(q);
      } else if (probed[2 * k] > seq) {
        present.push_back(q);
      } else {
        missing.push_back(q);
        last.push_back(probed[2 * k] == 0 ? "none" : "#" + std::to_string(probed[2 * k] - 1));
      }
    }
    std::string s;
    if (!missing.empty()) {
      s = ranks_phrase(missing) + (missing.size() == 1 ? " has" : " have") +
          " not started it (the last " +
          (missing.size() == 1 ? "collective it" : "collectives they") +
          " started: " + join_list(last) + ")";
      if (!present.empty()) {
        s += "; " + ranks_phrase(present) + (present.size() == 1 ? " has" : " have");
      }
    } else if (silent.empty() && errors.empty() && !lifeless.empty()) {
      s = "every other rank has started it";
    } else if (silent.empty() && errors.empty()) {
      s = "every other rank has started it, yet it has not completed here: a rank that started it "
          "may not be calling MPI (Open MPI advances a non-blocking collective only inside MPI "
          "calls such as wait() and test()), or its data are still in transit";
    } else if (!present.empty()) {
      s = ranks_phrase(present) + (present.size() == 1 ? " has" : " have") + " started it";
    }
    if (!lifeless.empty()) {
      const bool one = lifeless.size() == 1;
      if (!s.empty()) s += "; ";
      s += ranks_phrase(lifeless) + (one ? " shows" : " show") + " no sign of life: " +
           (one ? "its heartbeat (a count its process advances"
                : "their heartbeats (counts their processes advance") +
           " every " + std::to_string(heartbeat_period.count()) + " ms) did not move in " +
           std::to_string(heartbeat_window.count()) + " ms, so " + (one ? "it has" : "they have") +
           " most likely died (or " + (one ? "its process was" : "their processes were") +
           " stopped)";
    }
    if (!silent.empty()) {
      if (!s.empty()) s += "; ";
      s += ranks_phrase(silent) + " did" + " not answer the progress query within " +
           std::to_string(limit.count()) + " ms, so whether " +
           (silent.size() == 1 ? "it has" : "they have") + " started it is unknown";
    }
    if (!errors.empty()) {
      if (!s.empty()) s += "; ";
      s += "the progress query failed for " + join_list(errors);
    }
    return s;
  }
};

}  // namespace dist::detail
HONE_NAMESPACE_END

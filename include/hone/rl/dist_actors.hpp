// hone/rl/dist_actors.hpp: actors on other ranks (processes, possibly other nodes) that send
// transitions to the learner's replay buffer over a hone::dist::communicator and pick up the
// learner's versioned parameters, under the policy-lag bound of hone/rl/actors.hpp (Ape-X's
// actors and learner, in lock-step rounds).
//
//   // every rank (rank 0 learns, ranks 1..N-1 act), e.g. under mpirun -np 3:
//   hone::dist::mpi_comm comm;
//   const hone::dist_actor_options opt{.block = 128, .max_lag = 1};
//
//   // learner rank:
//   hone::dist_learner<hone::dist::mpi_comm, buffer_t> learner(comm, buffer, weights, opt);
//   while (!done) {
//     learner.round();                  // receive every actor's block, send the new parameters
//     train(buffer, weights);           // the actors collect the next blocks meanwhile
//     learner.publish(weights);         // the next version; sent at the next round
//   }
//   learner.round(/*stop=*/true);       // the last round: the actors' round() returns false
//
//   // actor rank:
//   hone::dist_actor<hone::dist::mpi_comm, step> actor(comm, opt);   // holds version 0
//   do {
//     while (actor.room() > 0) {
//       step::record r = env.step(policy(actor.params()));
//       hone::get<"policy_version">(r) = actor.version();             // tag it
//       actor.add(r);
//     }
//   } while (actor.round());            // send the block, pick up the newest parameters
//
// Rounds. The communicator concept has collectives only, so the ranks meet in rounds; in every
// round every rank calls, in this order:
//   1. all_gather of one fixed-size block of 64-bit words per rank: a count, the sequence number
//      of the block's first transition in this actor's stream, the round number, then up to
//      `block` transitions packed field by field (hone::transition's fields, no padding);
//      the learner's own block is empty;
//   2. broadcast from the learner of four words: the learner's version, the stop flag, the
//      transitions received so far from all actors, and whether parameters follow;
//   3. broadcast of the parameters (T elements) when the version changed since the last round.
// The constructors make round 0: an all_gather of each rank's settings (block size, transition
// layout, element type, learner rank, role), checked on every rank, so a mismatch throws the
// same hone::config_error sentence on every rank instead of desynchronizing the collectives;
// then the learner's initial parameters (version 0) are broadcast.
//
// The lag bound. Transitions carry the version they were acted with (the field VersionField,
// "policy_version" by default, an unsigned integer scalar). The learner puts each actor rank's
// transitions through its own hone::gated_writer: the hone::staleness_gate compares the acted
// version with the learner's current version (the last publish()) when the block arrives and
// drops the transitions older than max_lag versions (counted: stats()); each actor rank is one
// stream with its own n-step window, and a dropped step flushes that window first. Actors hold,
// after every round, the version the learner had published when the round started (versions
// never go back), so with one publish() between rounds the transitions of a block are at most
// one version old when they arrive (max_lag = 1 keeps all of them; max_lag = 0 drops them all).
//
// Trade-offs of the lock-step rounds (against point-to-point messages, which the concept lacks):
// simple, deterministic (the buffer receives the same transitions in the same order every run
// when the actors are deterministic) and testable with thread ranks; but a slow actor stalls the
// round for everyone (the learner waits in the all_gather), every rank receives every block (the
// all_gather's traffic is ranks x block per rank: fine for a few actor ranks, not for hundreds),
// and a round moves at most `block` transitions per actor, so rounds are bounded in size and in
// time. Failure is never a hang: when a rank dies or stops calling round(), the others' collective
// times out after the communicator's timeout, and round() throws hone::dist_error naming the
// round, this rank and the collective, then the communicator's message (hone::dist::mpi_comm
// names the ranks that have not started the collective; one that died inside it cannot be told
// apart). The collective then stays pending: later rounds refuse to start, an endpoint destroyed
// in that state leaks its buffers on purpose (MPI may still write them) rather than block, and
// the job should end (hone::dist::mpi_comm::abort()). Give actor ranks a longer timeout than the
// learner, so that the learner, which knows which actors it waits for, reports first.
//
// Threads: a dist_learner or dist_actor is used from one thread (the communicator's rule). The
// learner's buffer may be many_writers and sampled by other threads; dist_learner writes to it
// from the thread that calls round().
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/dist/communicator.hpp"
#include "hone/rl/actors.hpp"
#include "hone/rl/transition.hpp"

HONE_NAMESPACE_BEGIN

/// The settings every rank of a dist_learner / dist_actor group passes (checked to be equal).
struct dist_actor_options {
  /// The most transitions one actor rank sends per round (the fixed block of the round's
  /// all_gather; >= 1).
  std::size_t block = 256;
  /// L: the learner drops transitions acted with a version older than (current - max_lag).
  std::uint64_t max_lag = 100;
  /// The learner's rank; every other rank is an actor.
  int learner = 0;
};

/// What one dist_learner::round() did.
struct dist_round_stats {
  std::uint64_t round = 0;     // its number: 1, 2, ...
  std::uint64_t received = 0;  // transitions received from all actors in this round
  std::uint64_t accepted = 0;  // of which the staleness gate let in
  std::uint64_t dropped = 0;   // of which it dropped (older than max_lag versions)
  std::uint64_t version = 0;   // the version the actors hold after the round
  bool params_sent = false;    // whether the round broadcast new parameters
};

/// A communicator that can carry dist_actors' blocks: collectives on 64-bit integer words and on
/// the parameters' element type T.
template <class C, class T>
concept experience_communicator = dist::communicator<C> &&
    requires(C& c, std::span<std::int64_t> words, std::span<const std::int64_t> in,
             std::span<T> params, int root) {
  { c.all_gather(in, words) } -> dist::request;
  { c.broadcast(words, root) } -> dist::request;
  { c.broadcast(params, root) } -> dist::request;
};

namespace detail {

/// The learner's version counter, read by its staleness gate.
class dist_version : public version_source {
 public:
  void set(std::uint64_t v) noexcept { version_.store(v, std::memory_order_release); }
};

/// Words of the round-0 settings block and of a round's block header.
inline constexpr std::size_t dist_settings_words = 8;
inline constexpr std::size_t dist_header_words = 3;
inline constexpr std::int64_t dist_magic = 0x686f6e6544414354;  // "honeDACT"

/// A fingerprint of a transition's layout: field names, element sizes and counts (FNV-1a).
template <class Transition>
consteval std::uint64_t transition_fingerprint() {
  std::uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](std::uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 1099511628211ULL;
    }
  };
  Transition::for_each_field([&](auto i) {
    using F = typename Transition::template field_at<i>;
    for (char ch : F::name.view()) mix(static_cast<unsigned char>(ch));
    mix(sizeof(typename F::element_type));
    mix(F::count);
  });
  return h;
}

/// Packs and unpacks records field by field into 64-bit words (no padding bytes on the wire).
template <class Transition>
struct record_codec {
  using record = typename Transition::record;
  static constexpr std::size_t bytes = Transition::bytes;
  static constexpr std::size_t words = (bytes + 7) / 8;

  static void pack(const record& r, std::int64_t* dst) noexcept {
    auto* out = reinterpret_cast<unsigned char*>(dst);
    std::size_t at = 0;
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      std::memcpy(out + at, Transition::template elements<i>(r), F::bytes);
      at += F::bytes;
    });
    std::memset(out + at, 0, words * 8 - at);
  }
  static void unpack(const std::int64_t* src, record& r) noexcept {
    const auto* in = reinterpret_cast<const unsigned char*>(src);
    std::size_t at = 0;
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      std::memcpy(Transition::template elements<i>(r), in + at, F::bytes);
      at += F::bytes;
    });
  }
};

/// The version field of a transition (static_asserts as gated_writer's).
template <class Transition, fixed_string VersionField>
struct version_field {
  static constexpr std::size_t index = Transition::template find<VersionField>;
  static_assert(index < Transition::field_count,
                "hone::dist_learner / hone::dist_actor: the transition has no policy-version field "
                "(default name \"policy_version\", e.g. hone::field<\"policy_version\", "
                "std::uint64_t>); transitions must carry the version they were acted with.");
  static_assert(
      std::is_unsigned_v<typename Transition::template field_at<index>::element_type> &&
          Transition::template field_at<index>::count == 1,
      "hone::dist_learner / hone::dist_actor: the policy-version field must be an unsigned "
      "integer scalar.");
  static std::uint64_t get(const typename Transition::record& r) noexcept {
    return static_cast<std::uint64_t>(Transition::template value<index>(r));
  }
};

inline void check_dist_options(const dist_actor_options& o, int size, const char* who) {
  HONE_REQUIRE(size >= 2, std::string(who) + ": the communicator has " + std::to_string(size) +
                              " rank; distributed actors need at least 2 (one learner and one "
                              "actor): run with more ranks (mpirun -np 3) or use "
                              "hone::actor_pool in one process");
  HONE_REQUIRE(o.block >= 1, std::string(who) +
                                 ": dist_actor_options::block is 0; it is the most transitions "
                                 "an actor sends per round and must be at least 1");
  HONE_REQUIRE(o.learner >= 0 && o.learner < size,
               std::string(who) + ": dist_actor_options::learner is " + std::to_string(o.learner) +
                   " but the ranks are 0.." + std::to_string(size - 1) +
                   "; name the learner's rank");
}

/// Round 0's check of every rank's settings block (gathered on every rank): every rank compares
/// every rank with the same reference (rank 0 for the learner's rank, then the learner), so every
/// rank throws the same sentence. Word layout: magic, role (0 learner, 1 actor), learner rank,
/// block, record bytes, transition fingerprint, element size of T, parameter count (the
/// learner's; -1 on actors). Returns the learner's parameter count.
inline std::size_t check_settings(std::span<const std::int64_t> all, int size, const char* who) {
  const auto at = [&](int q, std::size_t w) {
    return all[static_cast<std::size_t>(q) * dist_settings_words + w];
  };
  for (int q = 0; q < size; ++q) {
    if (at(q, 0) != dist_magic) {
      throw config_error(std::string(who) + ": rank " + std::to_string(q) +
                         " did not construct a hone::dist_learner or hone::dist_actor for this "
                         "exchange (it called another collective); every rank must construct "
                         "one (the learner rank a dist_learner, the others a dist_actor) at the "
                         "same point");
    }
  }
  const auto learner = static_cast<int>(at(0, 2));
  for (int q = 0; q < size; ++q) {
    if (at(q, 2) != learner) {
      throw config_error(std::string(who) + ": rank " + std::to_string(q) + " names rank " +
                         std::to_string(at(q, 2)) + " as the learner but rank 0 names rank " +
                         std::to_string(learner) +
                         "; every rank must pass the same dist_actor_options::learner");
    }
  }
  const std::string ref = "the learner (rank " + std::to_string(learner) + ")";
  for (int q = 0; q < size; ++q) {
    const std::string rq = "rank " + std::to_string(q);
    if (at(q, 1) != (q == learner ? 0 : 1)) {
      throw config_error(std::string(who) + ": " + rq + " constructed a " +
                         (at(q, 1) == 0 ? "hone::dist_learner" : "hone::dist_actor") +
                         " but rank " + std::to_string(learner) +
                         " is the learner (dist_actor_options::learner): rank " +
                         std::to_string(learner) +
                         " constructs the dist_learner and every other rank a dist_actor");
    }
    if (at(q, 3) != at(learner, 3)) {
      throw config_error(std::string(who) + ": " + rq + " sends blocks of " +
                         std::to_string(at(q, 3)) + " transitions but " + ref + " expects " +
                         std::to_string(at(learner, 3)) +
                         "; every rank must pass the same dist_actor_options::block");
    }
    if (at(q, 4) != at(learner, 4) || at(q, 5) != at(learner, 5)) {
      throw config_error(std::string(who) + ": " + rq + "'s transition type (" +
                         std::to_string(at(q, 4)) + " bytes) differs from " + ref + "'s (" +
                         std::to_string(at(learner, 4)) +
                         " bytes, or the same size with other field names, types or shapes); "
                         "every rank must use the same hone::transition");
    }
    if (at(q, 6) != at(learner, 6)) {
      throw config_error(std::string(who) + ": " + rq + "'s parameters have elements of " +
                         std::to_string(at(q, 6)) + " bytes but " + ref + "'s have " +
                         std::to_string(at(learner, 6)) +
                         "; the learner and the actors must use the same element type T");
    }
  }
  if (at(learner, 7) <= 0) {
    throw config_error(std::string(who) +
                       ": the learner's initial parameters are empty; pass the policy's "
                       "parameters to the hone::dist_learner (the actors receive them as "
                       "version 0)");
  }
  return static_cast<std::size_t>(at(learner, 7));
}

/// What dist_learner and dist_actor share: the communicator, the options, the round count, and
/// the buffers the collectives read and write with their pending requests. A collective that
/// failed (timed out) stays pending on buffers MPI may still write when a late rank arrives; an
/// endpoint destroyed then leaks them on purpose (never frees memory under MPI's feet, and does
/// not block in the requests' destructors): the job is expected to end (mpi_comm::abort).
template <class Comm, class T>
class dist_endpoint {
 protected:
  using gather_request = decltype(std::declval<Comm&>().all_gather(
      std::declval<std::span<const std::int64_t>>(), std::declval<std::span<std::int64_t>>()));
  using words_request =
      decltype(std::declval<Comm&>().broadcast(std::declval<std::span<std::int64_t>>(), 0));
  using params_request = decltype(std::declval<Comm&>().broadcast(std::declval<std::span<T>>(), 0));

  struct buffers {
    std::vector<std::int64_t> own, gathered;  // this rank's block; every rank's blocks
    std::array<std::int64_t, 4> header{};     // version, stop, received, parameters follow
    std::vector<T> params;
    std::optional<gather_request> gather;
    std::optional<words_request> words;
    std::optional<params_request> params_sent;
    [[nodiscard]] bool pending() const noexcept {
      return gather.has_value() || words.has_value() || params_sent.has_value();
    }
  };

  dist_endpoint(Comm& comm, const dist_actor_options& o, const char* who)
      : comm_(&comm), options_(o), who_(who), io_(std::make_unique<buffers>()) {
    check_dist_options(o, comm.size(), who);
  }
  ~dist_endpoint() {
    if (io_ && io_->pending()) static_cast<void>(io_.release());  // see the class comment
  }
  dist_endpoint(const dist_endpoint&) = delete;
  dist_endpoint& operator=(const dist_endpoint&) = delete;

  /// Round 0: gathers every rank's settings and checks them; returns the learner's parameter
  /// count. Then sizes the round blocks.
  std::size_t exchange_settings(const std::array<std::int64_t, dist_settings_words>& mine,
                                std::size_t record_words) {
    const auto size = static_cast<std::size_t>(comm_->size());
    io_->own.assign(mine.begin(), mine.end());
    io_->gathered.assign(size * dist_settings_words, 0);
    gather(0, "the settings exchange (all_gather)");
    const std::size_t count = check_settings(io_->gathered, comm_->size(), who_);
    block_words_ = dist_header_words + options_.block * record_words;
    io_->own.assign(block_words_, 0);
    io_->gathered.assign(size * block_words_, 0);
    return count;
  }

  void gather(std::uint64_t n, const char* what) {
    wait_on(io_->gather,
            comm_->all_gather(std::span<const std::int64_t>(io_->own),
                              std::span<std::int64_t>(io_->gathered)),
            n, what);
  }
  void broadcast_header(std::uint64_t n, const char* what) {
    wait_on(io_->words, comm_->broadcast(std::span<std::int64_t>(io_->header), options_.learner), n,
            what);
  }
  void broadcast_params(std::uint64_t n, const char* what) {
    wait_on(io_->params_sent, comm_->broadcast(std::span<T>(io_->params), options_.learner), n,
            what);
  }

  void refuse_if_broken() const {
    if (broken_) {
      throw dist_error(std::string(who_) +
                       ": an earlier round failed and its collective is still pending; no new "
                       "round can start. End the job (hone::dist::mpi_comm::abort)");
    }
  }

  [[nodiscard]] std::string where(std::uint64_t n, const char* what) const {
    return std::string(who_) + ": round " + std::to_string(n) + " on rank " +
           std::to_string(comm_->rank()) + " of " + std::to_string(comm_->size()) + ", " + what +
           ": ";
  }

  Comm* comm_;
  dist_actor_options options_;
  const char* who_;
  std::unique_ptr<buffers> io_;
  std::size_t block_words_ = 0;
  std::uint64_t rounds_ = 0;
  bool broken_ = false;

 private:
  template <class Slot, class Request>
  void wait_on(std::optional<Slot>& slot, Request&& r, std::uint64_t n, const char* what) {
    slot.emplace(std::forward<Request>(r));
    try {
      slot->wait();
    } catch (const dist_error& e) {
      broken_ = true;  // the request stays pending in `slot`
      throw dist_error(where(n, what) + e.what());
    }
    slot.reset();
  }
};

}  // namespace detail

/// The learner's side: receives every actor rank's transitions into `buffer` (through a
/// staleness gate and one n-step window per actor rank) and sends its newest parameters (see the
/// top of this file). Buffer is a hone::replay_buffer whose transition carries VersionField; T is
/// the parameters' element type (float by default).
template <class Comm, class Buffer, class T = float, fixed_string VersionField = "policy_version">
class dist_learner : private detail::dist_endpoint<Comm, T> {
  static_assert(dist::check_communicator<Comm>());
  static_assert(experience_communicator<Comm, T>,
                "hone::dist_learner: the communicator lacks all_gather and broadcast on "
                "std::int64_t (the blocks' words) or broadcast on the parameters' element type T. "
                "hone::dist::mpi_comm and hone::dist::local_comm have them for float and double.");
  using base = detail::dist_endpoint<Comm, T>;

 public:
  using transition_type = typename Buffer::transition_type;
  using record_type = typename Buffer::record_type;

 private:
  using codec = detail::record_codec<transition_type>;
  using version_of = detail::version_field<transition_type, VersionField>;
  using writer_type = gated_writer<Buffer, VersionField>;

 public:
  /// Collective (round 0): checks every rank's settings, then sends `initial` as version 0.
  dist_learner(Comm& comm, Buffer& buffer, std::span<const T> initial, dist_actor_options o = {})
      : base(comm, o, "hone::dist_learner"), gate_(version_, {.max_lag = o.max_lag}) {
    this->io_->params.assign(initial.begin(), initial.end());
    const std::array<std::int64_t, detail::dist_settings_words> mine{
        detail::dist_magic,
        0,
        o.learner,
        static_cast<std::int64_t>(o.block),
        static_cast<std::int64_t>(codec::bytes),
        static_cast<std::int64_t>(detail::transition_fingerprint<transition_type>()),
        static_cast<std::int64_t>(sizeof(T)),
        static_cast<std::int64_t>(initial.size())};
    this->exchange_settings(mine, codec::words);
    const auto size = static_cast<std::size_t>(comm.size());
    expected_seq_.assign(size, 0);
    received_from_.assign(size, 0);
    writers_.reserve(size);
    for (std::size_t q = 0; q < size; ++q) {
      writers_.push_back(std::make_unique<writer_type>(buffer, gate_));
    }
    this->broadcast_params(0, "sending the initial parameters (broadcast)");
  }

  /// Publishes a copy of `p` as the next version (returned); the actors receive it at the next
  /// round. `p` must have the initial parameters' size.
  std::uint64_t publish(std::span<const T> p) {
    auto& params = this->io_->params;
    HONE_REQUIRE(p.size() == params.size(),
                 "hone::dist_learner::publish: the parameters hold " + std::to_string(p.size()) +
                     " elements but the initial ones held " + std::to_string(params.size()) +
                     "; the actors' copies have that size: publish parameters of the same size");
    HONE_REQUIRE(!this->io_->pending(),
                 "hone::dist_learner::publish: a failed round's broadcast still holds the "
                 "parameters; end the job (hone::dist::mpi_comm::abort)");
    std::copy(p.begin(), p.end(), params.begin());
    const std::uint64_t v = version_.version() + 1;
    version_.set(v);
    return v;
  }

  /// One round (collective; see the top of this file): receives every actor's block, adds its
  /// transitions through the gate, then sends the version (and the parameters when they changed
  /// since the last round). stop = true makes it the last round: the actors' round() returns
  /// false. on_received(rank, record, admitted) is called for every received transition, in
  /// each actor's order, actor ranks in increasing order. Throws hone::dist_error when a
  /// collective fails or times out, naming the round, this rank and (with mpi_comm) the missing
  /// ranks; the round then stays pending: end the job.
  template <class OnReceived>
  dist_round_stats round(bool stop, OnReceived&& on_received) {
    this->refuse_if_broken();
    HONE_REQUIRE(!stopped_,
                 "hone::dist_learner::round: the stop round has been made; the actors have left "
                 "(make the last round with round(true) only once)");
    const std::uint64_t n = ++this->rounds_;
    dist_round_stats st;
    st.round = n;
    auto& io = *this->io_;
    io.own[0] = 0;
    io.own[1] = 0;
    io.own[2] = static_cast<std::int64_t>(n);
    this->gather(n, "receiving the actors' blocks (all_gather)");
    const std::uint64_t current = version_.version();
    try {
      receive(n, current, st, on_received);
    } catch (...) {
      this->broken_ = true;  // the actors wait in this round's broadcast: the job must end
      throw;
    }
    received_ += st.received;
    const bool send_params = current != sent_version_;
    io.header = {static_cast<std::int64_t>(current), stop ? 1 : 0,
                 static_cast<std::int64_t>(received_), send_params ? 1 : 0};
    this->broadcast_header(n, "sending the version (broadcast)");
    if (send_params) {
      this->broadcast_params(n, "sending the parameters (broadcast)");
      sent_version_ = current;
    }
    stopped_ = stop;
    st.version = current;
    st.params_sent = send_params;
    return st;
  }
  dist_round_stats round(bool stop = false) {
    return round(stop, [](int, const record_type&, bool) {});
  }

  /// The version of the last publish() (0: the initial parameters).
  [[nodiscard]] std::uint64_t version() const noexcept { return version_.version(); }
  /// The latest published parameters.
  [[nodiscard]] std::span<const T> params() const noexcept { return this->io_->params; }
  /// Rounds made (not counting round 0, the constructor's).
  [[nodiscard]] std::uint64_t rounds() const noexcept { return this->rounds_; }
  /// Transitions received from all actors so far (accepted or dropped).
  [[nodiscard]] std::uint64_t received() const noexcept { return received_; }
  /// Transitions received from actor rank `rank` so far.
  [[nodiscard]] std::uint64_t received_from(int rank) const {
    HONE_REQUIRE(rank >= 0 && rank < this->comm_->size(),
                 "hone::dist_learner::received_from: rank " + std::to_string(rank) +
                     " is not a rank of the communicator (0.." +
                     std::to_string(this->comm_->size() - 1) + ")");
    return received_from_[static_cast<std::size_t>(rank)];
  }
  /// The staleness gate's counters (accepted, dropped, largest lags).
  [[nodiscard]] gate_stats stats() const noexcept { return gate_.stats(); }
  [[nodiscard]] const dist_actor_options& options() const noexcept { return this->options_; }
  /// Whether the last round was the stop round.
  [[nodiscard]] bool stopped() const noexcept { return stopped_; }
  /// Emits the transitions pending in every actor's n-step window (after the stop round).
  void flush() {
    for (auto& w : writers_) w->flush();
  }

 private:
  template <class OnReceived>
  void receive(std::uint64_t n, std::uint64_t current, dist_round_stats& st,
               OnReceived& on_received) {
    record_type rec{};
    for (int q = 0; q < this->comm_->size(); ++q) {
      if (q == this->options_.learner) continue;
      const auto qi = static_cast<std::size_t>(q);
      const std::int64_t* blk = this->io_->gathered.data() + qi * this->block_words_;
      check_block(q, blk, n);
      const auto count = static_cast<std::size_t>(blk[0]);
      for (std::size_t i = 0; i < count; ++i) {
        codec::unpack(blk + detail::dist_header_words + i * codec::words, rec);
        const std::uint64_t acted = version_of::get(rec);
        if (acted > current) {
          throw dist_error("hone::dist_learner: round " + std::to_string(n) + ": rank " +
                           std::to_string(q) + " sent a transition tagged with policy version " +
                           std::to_string(acted) + " but the learner is at version " +
                           std::to_string(current) +
                           " (a corrupted block: dist_actor::add refuses such transitions)");
        }
        const bool admitted = writers_[qi]->add(rec);
        if (admitted) {
          ++st.accepted;
        } else {
          ++st.dropped;
        }
        on_received(q, static_cast<const record_type&>(rec), admitted);
      }
      expected_seq_[qi] += count;
      received_from_[qi] += count;
      st.received += count;
    }
  }

  void check_block(int q, const std::int64_t* blk, std::uint64_t n) const {
    const auto qi = static_cast<std::size_t>(q);
    if (blk[0] < 0 || static_cast<std::uint64_t>(blk[0]) > this->options_.block ||
        blk[2] != static_cast<std::int64_t>(n) ||
        blk[1] != static_cast<std::int64_t>(expected_seq_[qi])) {
      throw dist_error("hone::dist_learner: round " + std::to_string(n) + ": rank " +
                       std::to_string(q) + " sent a block of " + std::to_string(blk[0]) +
                       " transitions (at most " + std::to_string(this->options_.block) +
                       ") for round " + std::to_string(blk[2]) + " starting at transition " +
                       std::to_string(blk[1]) + " of its stream, but the learner expects round " +
                       std::to_string(n) + " starting at " + std::to_string(expected_seq_[qi]) +
                       "; every rank must call round() once per round with one dist_learner or "
                       "dist_actor each");
    }
  }

  detail::dist_version version_;
  staleness_gate gate_;
  std::vector<std::unique_ptr<writer_type>> writers_;  // one per rank (the learner's unused)
  std::vector<std::uint64_t> expected_seq_, received_from_;
  std::uint64_t received_ = 0, sent_version_ = 0;
  bool stopped_ = false;
};

/// An actor rank's side: queues up to `block` transitions, sends them at round() and picks up
/// the learner's newest parameters (see the top of this file).
template <class Comm, transition_type Transition, class T = float,
          fixed_string VersionField = "policy_version">
class dist_actor : private detail::dist_endpoint<Comm, T> {
  static_assert(dist::check_communicator<Comm>());
  static_assert(experience_communicator<Comm, T>,
                "hone::dist_actor: the communicator lacks all_gather and broadcast on "
                "std::int64_t (the blocks' words) or broadcast on the parameters' element type T. "
                "hone::dist::mpi_comm and hone::dist::local_comm have them for float and double.");
  using base = detail::dist_endpoint<Comm, T>;

 public:
  using transition_type = Transition;
  using record_type = typename Transition::record;

 private:
  using codec = detail::record_codec<Transition>;
  using version_of = detail::version_field<Transition, VersionField>;

 public:
  /// Collective (round 0): checks every rank's settings, then receives the learner's initial
  /// parameters (version 0).
  explicit dist_actor(Comm& comm, dist_actor_options o = {}) : base(comm, o, "hone::dist_actor") {
    const std::array<std::int64_t, detail::dist_settings_words> mine{
        detail::dist_magic,
        1,
        o.learner,
        static_cast<std::int64_t>(o.block),
        static_cast<std::int64_t>(codec::bytes),
        static_cast<std::int64_t>(detail::transition_fingerprint<Transition>()),
        static_cast<std::int64_t>(sizeof(T)),
        -1};
    this->io_->params.assign(this->exchange_settings(mine, codec::words), T{});
    this->broadcast_params(0, "receiving the initial parameters (broadcast)");
  }

  /// Queues one transition for the next round. Its version (VersionField) must not be newer than
  /// version(); at most `block` transitions wait at a time (room() says how many more fit).
  void add(const record_type& r) {
    HONE_REQUIRE(!stopped_,
                 "hone::dist_actor::add: the learner has ended the rounds (round() returned "
                 "false); nothing more can be sent");
    HONE_REQUIRE(pending_ < this->options_.block,
                 "hone::dist_actor::add: the block is full (" +
                     std::to_string(this->options_.block) +
                     " transitions, dist_actor_options::block); call round() to send it before "
                     "adding more (room() says how many fit)");
    HONE_REQUIRE(!this->io_->pending(),
                 "hone::dist_actor::add: a failed round's collective still holds the block; end "
                 "the job (hone::dist::mpi_comm::abort)");
    const std::uint64_t v = version_of::get(r);
    HONE_REQUIRE(v <= version_,
                 "hone::dist_actor::add: the transition is tagged with policy version " +
                     std::to_string(v) + " but this actor holds version " +
                     std::to_string(version_) +
                     "; tag transitions with the version they were acted with "
                     "(dist_actor::version())");
    codec::pack(r, this->io_->own.data() + detail::dist_header_words + pending_ * codec::words);
    ++pending_;
  }

  /// Transitions that still fit in this round's block.
  [[nodiscard]] std::size_t room() const noexcept { return this->options_.block - pending_; }
  /// Transitions queued for the next round.
  [[nodiscard]] std::size_t pending() const noexcept { return pending_; }

  /// One round (collective): sends the queued transitions, receives the learner's version and,
  /// when it changed, its parameters. Returns false when the learner made this the stop round
  /// (the queued transitions were still delivered); round() must not be called again then.
  /// Throws hone::dist_error when a collective fails or times out (the round then stays
  /// pending: end the job).
  bool round() {
    this->refuse_if_broken();
    HONE_REQUIRE(!stopped_,
                 "hone::dist_actor::round: the learner has ended the rounds (the last round() "
                 "returned false)");
    const std::uint64_t n = ++this->rounds_;
    auto& io = *this->io_;
    io.own[0] = static_cast<std::int64_t>(pending_);
    io.own[1] = static_cast<std::int64_t>(sent_);
    io.own[2] = static_cast<std::int64_t>(n);
    this->gather(n, "sending this actor's block (all_gather)");
    sent_ += pending_;
    pending_ = 0;
    this->broadcast_header(n, "receiving the version (broadcast)");
    const auto v = static_cast<std::uint64_t>(io.header[0]);
    if (io.header[3] != 0) {
      this->broadcast_params(n, "receiving the parameters (broadcast)");
      version_ = v;
    }
    learner_received_ = static_cast<std::uint64_t>(io.header[2]);
    stopped_ = io.header[1] != 0;
    return !stopped_;
  }

  /// The parameters this actor holds (the learner's, as of the last round).
  [[nodiscard]] std::span<const T> params() const noexcept { return this->io_->params; }
  /// Their version: tag transitions with it. Never goes back.
  [[nodiscard]] std::uint64_t version() const noexcept { return version_; }
  /// Transitions the learner had received from all actors when the last round ended (a global
  /// step clock, e.g. for an exploration schedule).
  [[nodiscard]] std::uint64_t learner_received() const noexcept { return learner_received_; }
  /// Transitions this actor has sent.
  [[nodiscard]] std::uint64_t sent() const noexcept { return sent_; }
  [[nodiscard]] std::uint64_t rounds() const noexcept { return this->rounds_; }
  /// Whether the learner has ended the rounds.
  [[nodiscard]] bool stopped() const noexcept { return stopped_; }
  [[nodiscard]] const dist_actor_options& options() const noexcept { return this->options_; }

 private:
  std::size_t pending_ = 0;
  std::uint64_t version_ = 0, learner_received_ = 0, sent_ = 0;
  bool stopped_ = false;
};

HONE_NAMESPACE_END

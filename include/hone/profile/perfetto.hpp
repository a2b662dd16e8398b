// hone/profile/perfetto.hpp: a trace sink that writes a Perfetto trace (the protobuf
// perfetto.protos.Trace: a sequence of TracePacket, field 1), encoded by hand and streamed: each
// drain appends its packets, so the file is a valid trace after every drain.
//
// Layout (field numbers from perfetto_trace.proto as shipped in the `perfetto` pip package):
//  - one packet sequence (trusted_packet_sequence_id 1); the first packet clears the incremental
//    state (sequence_flags SEQ_INCREMENTAL_STATE_CLEARED, first_packet_on_sequence) and
//    describes the process track (TrackDescriptor.process: pid, process_name);
//  - a thread track per thread (TrackDescriptor.thread: pid, tid, thread_name; parent the process
//    track), described again when the thread is renamed;
//  - a counter track per counter name (TrackDescriptor.name + counter; parent the process track);
//  - a track per GPU stream that device zones ran on (thread_info::device; TrackDescriptor.name
//    "GPU 0 stream 13", parent the process track), with the device zones as slices;
//  - zones are TrackEvent TYPE_SLICE_BEGIN / TYPE_SLICE_END on their thread's track, counters
//    TYPE_COUNTER with double_counter_value, flows TYPE_INSTANT events inside the open zone with
//    flow_ids (start) or terminating_flow_ids (end);
//  - event names are interned (InternedData.event_names, TrackEvent.name_iid): each name is
//    written once, in the packet of its first use (sequence_flags SEQ_NEEDS_INCREMENTAL_STATE).
// Timestamps are steady_clock nanoseconds (CLOCK_MONOTONIC on Linux) in the trace's default clock
// domain.
#pragma once

#include <bit>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "hone/core/config.hpp"
#include "hone/io/file_io.hpp"
#include "hone/profile/collector.hpp"
#include "hone/profile/detail/protobuf.hpp"

HONE_NAMESPACE_BEGIN
namespace profile {

namespace perfetto_fields {
// perfetto.protos.Trace
inline constexpr std::uint32_t trace_packet = 1;
// perfetto.protos.TracePacket
inline constexpr std::uint32_t timestamp = 8;
inline constexpr std::uint32_t trusted_packet_sequence_id = 10;
inline constexpr std::uint32_t track_event = 11;
inline constexpr std::uint32_t interned_data = 12;
inline constexpr std::uint32_t sequence_flags = 13;
inline constexpr std::uint32_t track_descriptor = 60;
inline constexpr std::uint32_t first_packet_on_sequence = 87;
inline constexpr std::uint32_t seq_incremental_state_cleared = 1;
inline constexpr std::uint32_t seq_needs_incremental_state = 2;
// perfetto.protos.TrackDescriptor
inline constexpr std::uint32_t td_uuid = 1;
inline constexpr std::uint32_t td_name = 2;
inline constexpr std::uint32_t td_process = 3;
inline constexpr std::uint32_t td_thread = 4;
inline constexpr std::uint32_t td_parent_uuid = 5;
inline constexpr std::uint32_t td_counter = 8;
// perfetto.protos.ProcessDescriptor / ThreadDescriptor
inline constexpr std::uint32_t pd_pid = 1;
inline constexpr std::uint32_t pd_process_name = 6;
inline constexpr std::uint32_t thd_pid = 1;
inline constexpr std::uint32_t thd_tid = 2;
inline constexpr std::uint32_t thd_thread_name = 5;
// perfetto.protos.TrackEvent
inline constexpr std::uint32_t te_type = 9;
inline constexpr std::uint32_t te_name_iid = 10;
inline constexpr std::uint32_t te_track_uuid = 11;
inline constexpr std::uint32_t te_double_counter_value = 44;
inline constexpr std::uint32_t te_flow_ids = 47;
inline constexpr std::uint32_t te_terminating_flow_ids = 48;
inline constexpr std::uint32_t type_slice_begin = 1;
inline constexpr std::uint32_t type_slice_end = 2;
inline constexpr std::uint32_t type_instant = 3;
inline constexpr std::uint32_t type_counter = 4;
// perfetto.protos.InternedData / EventName
inline constexpr std::uint32_t id_event_names = 2;
inline constexpr std::uint32_t en_iid = 1;
inline constexpr std::uint32_t en_name = 2;
}  // namespace perfetto_fields

class perfetto_writer final : public trace_sink {
 public:
  /// `process_name` names the process track (empty: none). `source` tells the files of several
  /// processes apart (trace_options::rank + 1; 0: a single-process trace): the packets use
  /// sequence id max(source, 1) and, for source != 0, track ids hashed from (source, pid, ...),
  /// so the files of every rank concatenate into one valid trace (hone/profile/merge.hpp).
  explicit perfetto_writer(const std::filesystem::path& path, std::string process_name = {},
                           std::uint32_t source = 0)
      : file_(path, io::create_mode::truncate, io::write_hashing::off),
        process_name_(std::move(process_name)),
        source_(source),
        sequence_id_(source == 0 ? 1 : source) {}

  void thread(const thread_info& t) override {
    namespace f = perfetto_fields;
    ensure_process(t.pid);
    if (t.device) {
      packet([&](detail::proto_writer& p) {
        p.message(f::track_descriptor, [&](detail::proto_writer& td) {
          td.uint(f::td_uuid, track_uuid(t));
          td.uint(f::td_parent_uuid, process_uuid(t.pid));
          td.bytes(f::td_name, t.name);
        });
      });
      return;
    }
    packet([&](detail::proto_writer& p) {
      p.message(f::track_descriptor, [&](detail::proto_writer& td) {
        td.uint(f::td_uuid, thread_uuid(t));
        td.uint(f::td_parent_uuid, process_uuid(t.pid));
        td.message(f::td_thread, [&](detail::proto_writer& th) {
          th.sint(f::thd_pid, t.pid);
          th.sint(f::thd_tid, static_cast<std::int64_t>(t.tid));
          if (!t.name.empty()) th.bytes(f::thd_thread_name, t.name);
        });
      });
    });
  }

  void event(const thread_info& t, event_kind kind, const char* name, std::uint64_t ns,
             std::uint64_t arg) override {
    namespace f = perfetto_fields;
    if (kind == event_kind::counter) {
      const std::uint64_t track = counter_track(t.pid, name);
      packet([&](detail::proto_writer& p) {
        p.uint(f::timestamp, ns);
        p.message(f::track_event, [&](detail::proto_writer& te) {
          te.uint(f::te_type, f::type_counter);
          te.uint(f::te_track_uuid, track);
          te.f64(f::te_double_counter_value, std::bit_cast<double>(arg));
        });
      });
      return;
    }
    // A name seen for the first time is interned in this packet.
    // (No structured binding: clang 14 cannot capture one in the lambdas below.)
    const auto found = iids_.try_emplace(std::string_view(name), iids_.size() + 1);
    const bool fresh = found.second;
    const std::uint64_t iid = found.first->second;
    packet(
        [&](detail::proto_writer& p) {
          p.uint(f::timestamp, ns);
          p.message(f::track_event, [&](detail::proto_writer& te) {
            std::uint32_t type = f::type_instant;
            if (kind == event_kind::begin) type = f::type_slice_begin;
            if (kind == event_kind::end) type = f::type_slice_end;
            te.uint(f::te_type, type);
            te.uint(f::te_track_uuid, track_uuid(t));
            if (kind != event_kind::end) te.uint(f::te_name_iid, iid);
            if (kind == event_kind::flow_out) te.fixed64(f::te_flow_ids, arg);
            if (kind == event_kind::flow_in) te.fixed64(f::te_terminating_flow_ids, arg);
          });
          if (fresh) {
            p.message(f::interned_data, [&](detail::proto_writer& in) {
              in.message(f::id_event_names, [&](detail::proto_writer& en) {
                en.uint(f::en_iid, iid);
                en.bytes(f::en_name, name);
              });
            });
          }
        },
        f::seq_needs_incremental_state);
  }

  void flush() override {
    if (!buf_.empty()) file_.write(buf_.view());
    buf_.clear();
  }

  void close() {
    flush();
    file_.close();
  }

 private:
  static constexpr std::size_t flush_bytes = std::size_t{1} << 20;

  // Track uuids: unique within the file and, the pid being part of them, across the files of
  // several processes on one host; with a source (a rank), a hash of (kind, source, pid, index),
  // unique across hosts too (pids may repeat there) but for a 2^-64 chance per pair.
  [[nodiscard]] std::uint64_t mix(std::uint64_t kind, std::uint64_t pid,
                                  std::uint64_t index) const {
    auto step = [](std::uint64_t z) {  // splitmix64's finalizer
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      return z ^ (z >> 31);
    };
    return step(step(step((kind << 32) | source_) ^ pid) ^ index);
  }
  [[nodiscard]] std::uint64_t process_uuid(std::uint32_t pid) const {
    if (source_ != 0) return mix(0x70, pid, 0);
    return (std::uint64_t{0x70} << 56) | pid;
  }
  [[nodiscard]] std::uint64_t thread_uuid(const thread_info& t) const {
    if (source_ != 0) return mix(0x50, t.pid, t.serial);
    return (std::uint64_t{0x50} << 56) | (std::uint64_t{t.pid} << 24) | (t.serial & 0xffffff);
  }
  /// A thread's track, or a device track's (kind 0x47: "G").
  [[nodiscard]] std::uint64_t track_uuid(const thread_info& t) const {
    if (!t.device) return thread_uuid(t);
    if (source_ != 0) return mix(0x47, t.pid, t.serial);
    return (std::uint64_t{0x47} << 56) | (std::uint64_t{t.pid} << 24) | (t.serial & 0xffffff);
  }

  /// Writes one TracePacket built by f, with `flags` as its sequence_flags; the first one of the
  /// file also clears the incremental state (starts the sequence).
  template <class F>
  void packet(F&& f, std::uint32_t flags = 0) {
    namespace pf = perfetto_fields;
    detail::proto_writer out(buf_);
    out.message(pf::trace_packet, [&](detail::proto_writer& p) {
      p.uint(pf::trusted_packet_sequence_id, sequence_id_);
      if (first_) {
        flags |= pf::seq_incremental_state_cleared;
        p.uint(pf::first_packet_on_sequence, 1);
        first_ = false;
      }
      if (flags != 0) p.uint(pf::sequence_flags, flags);
      f(p);
    });
    out.finish();
    if (buf_.size() >= flush_bytes) flush();
  }

  void ensure_process(std::uint32_t pid) {
    namespace f = perfetto_fields;
    if (!processes_.try_emplace(pid, 0).second) return;
    packet([&](detail::proto_writer& p) {
      p.message(f::track_descriptor, [&](detail::proto_writer& td) {
        td.uint(f::td_uuid, process_uuid(pid));
        td.message(f::td_process, [&](detail::proto_writer& pd) {
          pd.sint(f::pd_pid, pid);
          if (!process_name_.empty()) pd.bytes(f::pd_process_name, process_name_);
        });
      });
    });
  }

  std::uint64_t counter_track(std::uint32_t pid, const char* name) {
    namespace f = perfetto_fields;
    const auto found = counters_.try_emplace(std::string(name), 0);
    if (!found.second) return found.first->second;
    ensure_process(pid);
    const std::uint64_t uuid =
        source_ != 0 ? mix(0x60, pid, counters_.size())
                     : (std::uint64_t{0x60} << 56) | (std::uint64_t{pid} << 24) | counters_.size();
    found.first->second = uuid;
    packet([&](detail::proto_writer& p) {
      p.message(f::track_descriptor, [&](detail::proto_writer& td) {
        td.uint(f::td_uuid, uuid);
        td.uint(f::td_parent_uuid, process_uuid(pid));
        td.bytes(f::td_name, name);
        td.message(f::td_counter, [](detail::proto_writer&) {});
      });
    });
    return uuid;
  }

  io::output_file file_;
  std::string process_name_;
  std::uint32_t source_;
  std::uint32_t sequence_id_;
  detail::byte_buffer buf_;
  bool first_ = true;
  std::unordered_map<std::string_view, std::uint64_t> iids_;
  std::unordered_map<std::string, std::uint64_t> counters_;
  std::unordered_map<std::uint32_t, int> processes_;
};

}  // namespace profile
HONE_NAMESPACE_END

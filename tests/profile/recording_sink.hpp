// tests/profile/recording_sink.hpp: a trace sink that keeps what a collector hands it, for the
// profile tests.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <hone/profile/collector.hpp>
#include <hone/profile/zone.hpp>

struct recorded_event {
  std::uint64_t serial;  // the thread
  hone::profile::event_kind kind;
  std::string name;
  std::uint64_t ns;
  std::uint64_t arg;
};

struct recording_sink final : hone::profile::trace_sink {
  std::vector<recorded_event> events;
  std::map<std::uint64_t, hone::profile::thread_info> threads;  // by serial, latest name
  int flushes = 0;
  void thread(const hone::profile::thread_info& t) override { threads[t.serial] = t; }
  void event(const hone::profile::thread_info& t, hone::profile::event_kind k, const char* name,
             std::uint64_t ns, std::uint64_t arg) override {
    events.push_back({t.serial, k, name, ns, arg});
  }
  void flush() override { ++flushes; }

  /// "B:name" / "E:name" / "C:name" / ">name" / "<name" per event of one thread.
  std::vector<std::string> script(std::uint64_t serial) const {
    std::vector<std::string> out;
    for (const auto& e : events) {
      if (e.serial != serial) continue;
      const char* tag = "?";
      switch (e.kind) {
        case hone::profile::event_kind::begin:
          tag = "B:";
          break;
        case hone::profile::event_kind::end:
          tag = "E:";
          break;
        case hone::profile::event_kind::counter:
          tag = "C:";
          break;
        case hone::profile::event_kind::flow_out:
          tag = ">";
          break;
        case hone::profile::event_kind::flow_in:
          tag = "<";
          break;
      }
      out.push_back(tag + e.name);
    }
    return out;
  }
};

/// A collector that starts from nothing, with recording on for its lifetime.
struct session {
  hone::profile::collector c;
  session() {
    c.discard();
    hone::profile::set_enabled(true);
  }
  ~session() { hone::profile::set_enabled(false); }
};

/// The calling thread's serial (its events' key in recording_sink).
inline std::uint64_t this_serial() { return hone::profile::detail::this_thread_buffer()->serial; }

/// Drains a collector into a fresh recording_sink.
inline recording_sink drain(hone::profile::collector& c) {
  recording_sink s;
  hone::profile::trace_sink* sinks[] = {&s};
  c.drain(sinks);
  return s;
}

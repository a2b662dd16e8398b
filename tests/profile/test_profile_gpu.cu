// GPU test (label gpu): device zones (hone/profile/cuda/zone.hpp). A kernel that spins on the
// GPU's %globaltimer for a known time runs inside nested device zones, inside a host zone; the
// trace's Perfetto file (read back here with a small protobuf decoder: field numbers from
// hone::profile::perfetto_fields) and its Chrome JSON file (hone's JSON reader) must hold the
// device slices on a "GPU <d> stream <id>" track of their own, nested, each at least as long as
// the spin it covers and as long as cudaEvent pairs recorded by the test itself (the oracle),
// inside the host zone's interval within the calibration's stated error bound. Also: the
// run-time switch off records nothing, and 2 x 10^4 zones reuse the pool's events (the second
// 10^4 create none). Exits 77 (skipped) without a CUDA device.
#define BOOST_TEST_MODULE hone_profile_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <hone/core/cuda/error.hpp>
#include <hone/io/json.hpp>
#include <hone/profile.hpp>
#include <hone/profile/cuda/phase_timer.hpp>
#include <hone/profile/cuda/zone.hpp>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../support/gpu.hpp"

namespace hp = hone::profile;
namespace pf = hone::profile::perfetto_fields;

namespace {

/// Spins until `ns` nanoseconds of the GPU's global timer have passed (one thread).
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long start = 0;
  unsigned long long now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

__global__ void empty_kernel() {}

void spin(cudaStream_t s, std::uint64_t ns) {
  spin_kernel<<<1, 1, 0, s>>>(ns);
  hone::check_last_launch("spin_kernel");
}

struct gpu_fixture {
  gpu_fixture() { hone::test::skip_without_gpu(); }
};

struct stream_holder {
  cudaStream_t s = nullptr;
  stream_holder() { HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~stream_holder() { (void)cudaStreamDestroy(s); }
  stream_holder(const stream_holder&) = delete;
  stream_holder& operator=(const stream_holder&) = delete;
};

struct event_holder {
  cudaEvent_t e = nullptr;
  event_holder() { HONE_CUDA_CHECK(cudaEventCreate(&e)); }
  ~event_holder() { (void)cudaEventDestroy(e); }
  event_holder(const event_holder&) = delete;
  event_holder& operator=(const event_holder&) = delete;
};

std::filesystem::path temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "hone_test_profile_gpu";
  std::filesystem::create_directories(dir);
  return dir / name;
}

std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// ---- a small protobuf reader for the Perfetto file ----

struct pb_field {
  std::uint32_t number = 0;
  std::uint32_t wire = 0;
  std::uint64_t value = 0;  // varint / fixed
  std::string_view bytes;   // length-delimited
};

/// Reads the fields of one message; fails the test on a malformed encoding.
std::vector<pb_field> fields(std::string_view msg) {
  std::vector<pb_field> out;
  std::size_t i = 0;
  auto varint = [&]() -> std::uint64_t {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      BOOST_REQUIRE_MESSAGE(i < msg.size(), "perfetto: a varint runs past its message");
      const auto b = static_cast<unsigned char>(msg[i++]);
      v |= std::uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80u) == 0) return v;
    }
    BOOST_FAIL("perfetto: a varint longer than 10 bytes");
    return 0;
  };
  while (i < msg.size()) {
    const std::uint64_t key = varint();
    pb_field f;
    f.number = static_cast<std::uint32_t>(key >> 3);
    f.wire = static_cast<std::uint32_t>(key & 7);
    if (f.wire == 0) {
      f.value = varint();
    } else if (f.wire == 1 || f.wire == 5) {
      const std::size_t n = f.wire == 1 ? 8 : 4;
      BOOST_REQUIRE_MESSAGE(i + n <= msg.size(), "perfetto: a fixed field runs past its message");
      for (std::size_t k = 0; k < n; ++k)
        f.value |= std::uint64_t{static_cast<unsigned char>(msg[i + k])} << (8 * k);
      i += n;
    } else if (f.wire == 2) {
      const std::uint64_t n = varint();
      BOOST_REQUIRE_MESSAGE(n <= msg.size() - i, "perfetto: a length runs past its message");
      f.bytes = msg.substr(i, n);
      i += n;
    } else {
      BOOST_FAIL("perfetto: wire type " << f.wire << " is not one hone writes");
    }
    out.push_back(f);
  }
  return out;
}

struct slice_event {
  std::uint64_t ts = 0;
  std::uint64_t track = 0;
  bool begin = false;
  std::string name;  // begins only
};

struct perfetto_trace {
  std::map<std::uint64_t, std::string> track_names;  // uuid -> name (a thread's thread_name)
  std::map<std::uint64_t, bool> thread_track;        // uuid -> has a ThreadDescriptor
  std::vector<slice_event> slices;                   // file order

  /// The uuids of tracks whose name starts with `prefix`.
  [[nodiscard]] std::vector<std::uint64_t> tracks_named(std::string_view prefix) const {
    std::vector<std::uint64_t> out;
    for (const auto& [uuid, name] : track_names)
      if (name.starts_with(prefix)) out.push_back(uuid);
    return out;
  }
  /// The slices of one track as (name, begin, end), in begin order; checks their nesting.
  struct slice {
    std::string name;
    std::uint64_t begin = 0;
    std::uint64_t end = 0;
    int depth = 0;
  };
  [[nodiscard]] std::vector<slice> slices_of(std::uint64_t track) const {
    std::vector<slice> out;
    std::vector<std::size_t> open;
    std::uint64_t last = 0;
    for (const auto& e : slices) {
      if (e.track != track) continue;
      BOOST_TEST(e.ts >= last, "perfetto: time goes back on track " << track_names.at(track));
      last = e.ts;
      if (e.begin) {
        open.push_back(out.size());
        out.push_back({e.name, e.ts, 0, static_cast<int>(open.size()) - 1});
      } else {
        BOOST_REQUIRE_MESSAGE(!open.empty(), "perfetto: an end with no open slice on track "
                                                 << track_names.at(track));
        out[open.back()].end = e.ts;
        open.pop_back();
      }
    }
    BOOST_TEST(open.empty(), "perfetto: slices left open on track " << track_names.at(track));
    return out;
  }
};

perfetto_trace read_perfetto(const std::filesystem::path& path) {
  const std::string file = read_bytes(path);
  BOOST_REQUIRE_MESSAGE(!file.empty(), "perfetto: " << path << " is empty");
  perfetto_trace t;
  std::map<std::uint64_t, std::string> names;  // interned event names
  for (const pb_field& pk : fields(file)) {
    BOOST_REQUIRE_MESSAGE(pk.number == pf::trace_packet && pk.wire == 2,
                          "perfetto: the file holds a field other than Trace.packet");
    std::uint64_t ts = 0;
    std::string_view te;
    for (const pb_field& f : fields(pk.bytes)) {
      if (f.number == pf::timestamp) ts = f.value;
      if (f.number == pf::track_event) te = f.bytes;
      if (f.number == pf::interned_data) {
        for (const pb_field& in : fields(f.bytes)) {
          if (in.number != pf::id_event_names) continue;
          std::uint64_t iid = 0;
          std::string name;
          for (const pb_field& en : fields(in.bytes)) {
            if (en.number == pf::en_iid) iid = en.value;
            if (en.number == pf::en_name) name = std::string(en.bytes);
          }
          names[iid] = name;
        }
      }
      if (f.number == pf::track_descriptor) {
        std::uint64_t uuid = 0;
        std::string name;
        bool thread = false;
        for (const pb_field& td : fields(f.bytes)) {
          if (td.number == pf::td_uuid) uuid = td.value;
          if (td.number == pf::td_name) name = std::string(td.bytes);
          if (td.number == pf::td_thread) {
            thread = true;
            for (const pb_field& th : fields(td.bytes))
              if (th.number == pf::thd_thread_name) name = std::string(th.bytes);
          }
        }
        t.track_names[uuid] = name;
        t.thread_track[uuid] = thread;
      }
    }
    if (te.empty()) continue;
    std::uint64_t type = 0, iid = 0, track = 0;
    for (const pb_field& f : fields(te)) {
      if (f.number == pf::te_type) type = f.value;
      if (f.number == pf::te_name_iid) iid = f.value;
      if (f.number == pf::te_track_uuid) track = f.value;
    }
    if (type != pf::type_slice_begin && type != pf::type_slice_end) continue;
    BOOST_REQUIRE_MESSAGE(t.track_names.count(track) == 1,
                          "perfetto: a slice on a track not declared before it");
    const bool begin = type == pf::type_slice_begin;
    if (begin)
      BOOST_REQUIRE_MESSAGE(names.count(iid) == 1, "perfetto: a name used before interned");
    t.slices.push_back({ts, track, begin, begin ? names[iid] : std::string()});
  }
  return t;
}

}  // namespace

BOOST_GLOBAL_FIXTURE(gpu_fixture);

// The device slices of nested zones around spinning kernels: their track, nesting, durations
// against the spin time and the test's own event pairs, and their place in the host zone.
BOOST_AUTO_TEST_CASE(device_zones_time_a_spinning_kernel_on_their_own_track) {
  constexpr std::uint64_t outer_spin = 2'000'000;  // ns
  constexpr std::uint64_t inner_spin = 1'000'000;
  stream_holder s;
  stream_holder s2;
  int dev = 0;
  HONE_CUDA_CHECK(cudaGetDevice(&dev));
  const std::uint64_t err_ns = hp::prepare_cuda_zones(dev);
  BOOST_TEST_MESSAGE("calibration error bound: " << err_ns << " ns");
  BOOST_TEST(err_ns > 0u);
  BOOST_TEST(err_ns < 5'000'000u, "the calibration's bound " << err_ns << " ns is over 5 ms");
  // The slack for "inside the host zone": the calibration bound, twice the events' resolution
  // (0.5 us) and drift between the GPU timer and the host clock over the test (< 10 us).
  const std::uint64_t slack = err_ns + 11'000;

  const auto pf_path = temp_path("zones.pftrace");
  const auto json_path = temp_path("zones.json");
  event_holder o_begin, o_end, i_begin, i_end;
  {
    hp::trace tr({.perfetto = pf_path,
                  .chrome_json = json_path,
                  .flush_interval = std::chrono::milliseconds(0),
                  .process_name = "test_profile_gpu"});
    hp::set_thread_name("gpu_test_main");
    {
      HONE_ZONE("host");
      {
        HONE_CUDA_ZONE(s.s, "outer");
        HONE_CUDA_CHECK(cudaEventRecord(o_begin.e, s.s));
        spin(s.s, outer_spin - inner_spin);
        {
          HONE_CUDA_ZONE(s.s, "inner");
          HONE_CUDA_CHECK(cudaEventRecord(i_begin.e, s.s));
          spin(s.s, inner_spin);
          HONE_CUDA_CHECK(cudaEventRecord(i_end.e, s.s));
        }
        HONE_CUDA_CHECK(cudaEventRecord(o_end.e, s.s));
      }
      {
        HONE_CUDA_ZONE(s2.s, "other_stream");
        spin(s2.s, 100'000);
      }
      HONE_CUDA_CHECK(cudaStreamSynchronize(s.s));
      HONE_CUDA_CHECK(cudaStreamSynchronize(s2.s));
    }
    tr.close();
    BOOST_TEST(tr.dropped_events() == 0u);
    const auto rows = tr.summary();
    bool seen = false;
    for (const auto& r : rows) {
      if (r.name == "outer (device)") {
        seen = true;
        BOOST_TEST(r.count == 1u);
      }
    }
    BOOST_TEST(seen, "trace::summary() has no \"outer (device)\" row");
  }
  float oracle_outer_ms = 0.0f, oracle_inner_ms = 0.0f;
  HONE_CUDA_CHECK(cudaEventElapsedTime(&oracle_outer_ms, o_begin.e, o_end.e));
  HONE_CUDA_CHECK(cudaEventElapsedTime(&oracle_inner_ms, i_begin.e, i_end.e));
  const double oracle_outer = static_cast<double>(oracle_outer_ms) * 1e6;
  const double oracle_inner = static_cast<double>(oracle_inner_ms) * 1e6;

  // -- the Perfetto file --
  const perfetto_trace t = read_perfetto(pf_path);
  const auto gpu_tracks = t.tracks_named("GPU ");
  BOOST_REQUIRE_MESSAGE(gpu_tracks.size() == 2u,
                        "perfetto: " << gpu_tracks.size() << " GPU tracks, expected 2 (2 streams)");
  for (const auto uuid : gpu_tracks)
    BOOST_TEST(!t.thread_track.at(uuid), "perfetto: a GPU track is declared as a thread");
  const auto host_tracks = t.tracks_named("gpu_test_main");
  BOOST_REQUIRE_MESSAGE(host_tracks.size() == 1u, "perfetto: the test's thread track is missing");
  const auto host = t.slices_of(host_tracks[0]);
  BOOST_REQUIRE_MESSAGE(host.size() == 1u && host[0].name == "host",
                        "perfetto: the thread track should hold the one host zone");

  std::vector<perfetto_trace::slice> dev1, dev2;
  for (const auto uuid : gpu_tracks) {
    auto sl = t.slices_of(uuid);
    if (!sl.empty() && sl[0].name == "outer") dev1 = sl;
    if (!sl.empty() && sl[0].name == "other_stream") dev2 = sl;
  }
  BOOST_REQUIRE_MESSAGE(dev1.size() == 2u,
                        "perfetto: the first stream's track should hold "
                        "outer and inner, got "
                            << dev1.size() << " slices");
  BOOST_REQUIRE_MESSAGE(dev2.size() == 1u,
                        "perfetto: the second stream's track should hold "
                        "other_stream alone, got "
                            << dev2.size());
  const auto& outer = dev1[0];
  const auto& inner = dev1[1];
  BOOST_TEST(inner.name == "inner");
  BOOST_TEST(outer.depth == 0);
  BOOST_TEST(inner.depth == 1, "perfetto: inner does not nest in outer");
  BOOST_TEST((inner.begin >= outer.begin && inner.end <= outer.end));
  const double outer_ns = static_cast<double>(outer.end - outer.begin);
  const double inner_ns = static_cast<double>(inner.end - inner.begin);
  BOOST_TEST_MESSAGE("outer " << outer_ns << " ns (oracle " << oracle_outer << "), inner "
                              << inner_ns << " ns (oracle " << oracle_inner << ")");
  // At least the spin (less the events' 0.5 us resolution, twice), and within a sane bound.
  BOOST_TEST(outer_ns >= static_cast<double>(outer_spin) - 1000.0,
             "outer lasted " << outer_ns << " ns, less than its " << outer_spin << " ns spin");
  BOOST_TEST(inner_ns >= static_cast<double>(inner_spin) - 1000.0,
             "inner lasted " << inner_ns << " ns, less than its " << inner_spin << " ns spin");
  BOOST_TEST(outer_ns <= static_cast<double>(outer_spin) + 2e6, "outer lasted " << outer_ns);
  BOOST_TEST(inner_ns <= static_cast<double>(inner_spin) + 2e6, "inner lasted " << inner_ns);
  // The test's own event pairs lie inside the zones' on the stream: the zone is no shorter than
  // the pair (resolution aside) and longer only by the few records between them.
  BOOST_TEST(outer_ns >= oracle_outer - 2000.0,
             "outer " << outer_ns << " < oracle " << oracle_outer);
  BOOST_TEST(outer_ns <= oracle_outer + 50'000.0,
             "outer " << outer_ns << " >> oracle " << oracle_outer);
  BOOST_TEST(inner_ns >= oracle_inner - 2000.0,
             "inner " << inner_ns << " < oracle " << oracle_inner);
  BOOST_TEST(inner_ns <= oracle_inner + 50'000.0,
             "inner " << inner_ns << " >> oracle " << oracle_inner);
  // Inside the host zone, within the mapping's bound.
  const std::vector<const perfetto_trace::slice*> devs = {&outer, &inner, &dev2[0]};
  for (const perfetto_trace::slice* d : devs) {
    BOOST_TEST(d->begin + slack >= host[0].begin,
               d->name << " begins " << (host[0].begin - d->begin) << " ns before the host zone "
                       << "(bound " << slack << " ns)");
    BOOST_TEST(d->end <= host[0].end + slack, d->name << " ends " << (d->end - host[0].end)
                                                      << " ns after the host zone "
                                                      << "(bound " << slack << " ns)");
  }

  // -- the Chrome JSON file: the same slices on a GPU thread of their own --
  const hone::io::json::value doc =
      hone::io::json::parse(read_bytes(json_path), json_path.string());
  std::map<std::uint64_t, std::string> tnames;
  std::vector<std::pair<std::uint64_t, std::string>> gpu_b;  // tid, name of each B
  for (const auto& e : doc.at("traceEvents").as_array()) {
    const std::string ph = e.at("ph").as_string();
    if (ph == "M" && e.at("name").as_string() == "thread_name")
      tnames[e.at("tid").as_u64()] = e.at("args").at("name").as_string();
    if (ph == "B") gpu_b.emplace_back(e.at("tid").as_u64(), e.at("name").as_string());
  }
  int gpu_begins = 0;
  for (const auto& [tid, name] : gpu_b) {
    if (tid < (std::uint64_t{1} << 30)) continue;
    ++gpu_begins;
    BOOST_TEST(tnames[tid].starts_with("GPU "), "json: device tid " << tid << " is not named GPU");
  }
  BOOST_TEST(gpu_begins == 3, "json: " << gpu_begins << " device begins, expected 3");
}

// Recording off (the run-time switch): a device zone records no event and the trace no track.
BOOST_AUTO_TEST_CASE(recording_off_records_no_device_zone) {
  stream_holder s;
  const auto pf_path = temp_path("off.pftrace");
  const auto before = hp::cuda_zone_pool_stats();
  {
    hp::trace tr(
        {.perfetto = pf_path, .flush_interval = std::chrono::milliseconds(0), .enable = false});
    hp::set_enabled(false);
    for (int i = 0; i < 100; ++i) {
      HONE_CUDA_ZONE(s.s, "off");
      hp::cuda_zone z(s.s, "off_direct");
      BOOST_TEST(!z.recorded());
      spin(s.s, 1000);
    }
    HONE_CUDA_CHECK(cudaStreamSynchronize(s.s));
    tr.close();
  }
  const auto after = hp::cuda_zone_pool_stats();
  BOOST_TEST(after.events_created == before.events_created);
  BOOST_TEST(after.marks_pending == 0u);
  BOOST_TEST(after.marks_resolved == 0u);
  const perfetto_trace t = read_perfetto(pf_path);
  BOOST_TEST(t.tracks_named("GPU ").empty(), "a device track was written with recording off");
  BOOST_TEST(t.slices.empty());
}

// 2 x 10^4 zones with at most 200 marks in flight: the pool grows to what is in flight, the second
// 10^4 zones create no event, nothing is dropped, and every zone reaches the statistics.
BOOST_AUTO_TEST_CASE(the_event_pool_is_reused_without_growth) {
  stream_holder s;
  hp::trace tr({.flush_interval = std::chrono::milliseconds(0)});  // no files: statistics only
  auto run = [&] {
    for (int i = 0; i < 10'000; ++i) {
      HONE_CUDA_ZONE(s.s, "tiny");
      empty_kernel<<<1, 1, 0, s.s>>>();
      hone::check_last_launch("empty_kernel");
      if (i % 100 == 99) HONE_CUDA_CHECK(cudaStreamSynchronize(s.s));
    }
    HONE_CUDA_CHECK(cudaStreamSynchronize(s.s));
  };
  run();
  const auto first = hp::cuda_zone_pool_stats();
  BOOST_TEST_MESSAGE("after 10^4 zones: " << first.events_created << " events created");
  BOOST_TEST(first.events_created <= 1024u,
             "the pool grew to " << first.events_created << " events for 200 marks in flight");
  run();
  const auto second = hp::cuda_zone_pool_stats();
  BOOST_TEST(second.events_created == first.events_created,
             "the second 10^4 zones created " << second.events_created - first.events_created
                                              << " events");
  BOOST_TEST(second.dropped == 0u);
  tr.flush(/*wait_device=*/true);
  const auto drained = hp::cuda_zone_pool_stats();
  BOOST_TEST(drained.marks_pending == 0u);
  BOOST_TEST(drained.marks_resolved == 0u);
  // Every event is free again but the calibrations' (one per device in use).
  int devices = 0;
  HONE_CUDA_CHECK(cudaGetDeviceCount(&devices));
  BOOST_TEST(drained.events_free + static_cast<std::size_t>(devices) >= drained.events_created);
  std::uint64_t count = 0;
  for (const auto& r : tr.summary())
    if (r.name == "tiny (device)") count = r.count;
  BOOST_TEST(count == 20'000u, "the statistics saw " << count << " of 20000 device zones");
  tr.close();
  BOOST_TEST(tr.dropped_events() == 0u);
}

// cuda_phase_timer, driven as hone::trainer drives its observer (2 micro-batches, the stream
// waited for in `check`): each phase's device time covers its spins, the host times do not wait
// for them, a step's device times are known once a later step has begun (or after
// synchronize()), the events are reused, and with recording on the GPU track holds "step" over
// the phases.
BOOST_AUTO_TEST_CASE(cuda_phase_timer_times_each_phase_on_the_device) {
  static_assert(std::is_copy_constructible_v<hp::cuda_phase_timer>,
                "hone::trainer copies its policies, so the observer must be copyable");
  using hone::step_phase;
  constexpr std::uint64_t fb_spin = 300'000;   // ns, per micro-batch
  constexpr std::uint64_t opt_spin = 500'000;  // ns
  stream_holder s;
  hp::cuda_phase_timer pt(s.s);
  auto phase = [&](step_phase p, auto&& f) {
    pt.phase_begin(p);
    f();
    pt.phase_end(p);
  };
  auto step = [&] {
    phase(step_phase::checkpoint, [] {});
    for (int mb = 0; mb < 2; ++mb) {
      phase(step_phase::forward_backward, [&] { spin(s.s, fb_spin); });
      phase(step_phase::unscale, [] {});
    }
    phase(step_phase::check, [&] { HONE_CUDA_CHECK(cudaStreamSynchronize(s.s)); });
    phase(step_phase::optimizer, [&] { spin(s.s, opt_spin); });
    phase(step_phase::checkpoint, [] {});
  };
  const auto pf_path = temp_path("phases.pftrace");
  {
    hp::trace tr({.perfetto = pf_path, .flush_interval = std::chrono::milliseconds(0)});
    for (int i = 0; i < 3; ++i) step();
    BOOST_TEST(pt.steps() == 3u);
    // Step 0 was over on the device when step 1's check waited: read when step 2 began.
    BOOST_TEST(pt.device_steps() >= 1u);
    pt.synchronize();
    BOOST_TEST(pt.device_steps() == 3u);
    tr.close();
  }
  const double fb = pt.device_last_step_ns(step_phase::forward_backward);
  const double opt = pt.device_last_step_ns(step_phase::optimizer);
  const double whole = pt.device_last_step_ns();
  BOOST_TEST_MESSAGE("device: forward_backward "
                     << fb << " ns, optimizer " << opt << " ns, step " << whole
                     << " ns; host optimizer " << pt.last_step_ns(step_phase::optimizer) << " ns");
  BOOST_TEST(fb >= 2.0 * fb_spin - 2000.0, "forward_backward's device time " << fb << " ns");
  BOOST_TEST(fb <= 2.0 * fb_spin + 2e6, "forward_backward's device time " << fb << " ns");
  BOOST_TEST(opt >= static_cast<double>(opt_spin) - 1000.0, "optimizer's device time " << opt);
  BOOST_TEST(opt <= static_cast<double>(opt_spin) + 2e6, "optimizer's device time " << opt);
  BOOST_TEST(whole >= fb + opt - 2000.0, "the step's device time " << whole << " < its phases'");
  // The host's optimizer phase only enqueued the spin.
  BOOST_TEST(pt.last_step_ns(step_phase::optimizer) < 0.8 * static_cast<double>(opt_spin));
  const auto row = pt.device_stats(step_phase::forward_backward);
  BOOST_TEST(row.name == "forward_backward (device)");
  BOOST_TEST(row.count == 6u);  // 2 runs x 3 steps
  // Events are reused: 20 more steps create none.
  const std::size_t created = pt.events_created();
  for (int i = 0; i < 20; ++i) step();
  pt.synchronize();
  BOOST_TEST(pt.events_created() == created,
             "20 more steps created " << pt.events_created() - created << " events");
  BOOST_TEST(pt.device_steps() == 23u);

  // The GPU track: "step" holding the 8 phase runs, 3 times.
  const perfetto_trace t = read_perfetto(pf_path);
  std::vector<perfetto_trace::slice> gpu;
  for (const auto uuid : t.tracks_named("GPU ")) {
    auto sl = t.slices_of(uuid);
    if (!sl.empty() && sl[0].name == "step") gpu = sl;
  }
  BOOST_REQUIRE_MESSAGE(gpu.size() == 27u,
                        "the GPU track holds " << gpu.size() << " slices, expected 3 x 9");
  const std::vector<std::string> one = {"step",    "checkpoint",       "forward_backward",
                                        "unscale", "forward_backward", "unscale",
                                        "check",   "optimizer",        "checkpoint"};
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    BOOST_TEST(gpu[i].name == one[i % 9], "GPU slice " << i << " is " << gpu[i].name);
    BOOST_TEST(gpu[i].depth == (i % 9 == 0 ? 0 : 1),
               "GPU slice " << i << " at depth " << gpu[i].depth);
  }
}

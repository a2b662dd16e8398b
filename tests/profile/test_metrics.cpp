// hone::profile::metrics_sink and its writers: CSV content and RFC 4180 quoting, CRC-32C and
// TensorFlow's mask against known vectors, TFRecord framing and the Event protobuf fields (decoded
// here by hand with the field numbers of tensorboard's event.proto and summary.proto written as
// literals, not taken from hone), the queue (a full queue waits, nothing is dropped, order is
// kept), flush() and close(), NaN and infinities, an empty tag, a directory that cannot be
// created, a writer that fails, the step_report and memory_sample helpers.
#define BOOST_TEST_MODULE hone_profile_metrics
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <hone/profile.hpp>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace hp = hone::profile;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("hone_test_metrics_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The lines of a file (without their LF).
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t nl = text.find('\n', at);
    out.push_back(text.substr(at, nl - at));
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  return out;
}

std::uint32_t le32(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<std::uint32_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}
std::uint64_t le64(const std::string& s, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

/// A protobuf message decoded one level: (field, wire type, varint or fixed value, bytes).
struct field {
  std::uint32_t number;
  std::uint32_t wire;
  std::uint64_t num;
  std::string bytes;
};
std::uint64_t varint(const std::string& s, std::size_t& at) {
  std::uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    BOOST_REQUIRE(at < s.size());
    const auto b = static_cast<unsigned char>(s[at++]);
    v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return v;
  }
  BOOST_FAIL("varint too long");
  return 0;
}
std::vector<field> decode(const std::string& s) {
  std::vector<field> out;
  std::size_t at = 0;
  while (at < s.size()) {
    const std::uint64_t key = varint(s, at);
    field f{static_cast<std::uint32_t>(key >> 3), static_cast<std::uint32_t>(key & 7), 0, {}};
    switch (f.wire) {
      case 0:
        f.num = varint(s, at);
        break;
      case 1:
        BOOST_REQUIRE(at + 8 <= s.size());
        f.num = le64(s, at);
        at += 8;
        break;
      case 5:
        BOOST_REQUIRE(at + 4 <= s.size());
        f.num = le32(s, at);
        at += 4;
        break;
      case 2: {
        const std::uint64_t n = varint(s, at);
        BOOST_REQUIRE(at + n <= s.size());
        f.bytes = s.substr(at, n);
        at += n;
        break;
      }
      default:
        BOOST_FAIL("unexpected wire type " << f.wire);
    }
    out.push_back(f);
  }
  return out;
}

/// The payloads of a TFRecord file, checking both masked CRCs of each record with the mask
/// written out here (TensorFlow's), not hone's.
std::vector<std::string> read_records(const std::string& file) {
  auto masked = [](std::string_view b) {
    const std::uint32_t c = hp::detail::crc32c(b);
    return ((c >> 15) | (c << 17)) + 0xa282ead8U;
  };
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < file.size()) {
    BOOST_REQUIRE(at + 12 <= file.size());
    const std::uint64_t n = le64(file, at);
    BOOST_CHECK_EQUAL(le32(file, at + 8), masked(std::string_view(file).substr(at, 8)));
    BOOST_REQUIRE(at + 12 + n + 4 <= file.size());
    std::string payload = file.substr(at + 12, n);
    BOOST_CHECK_EQUAL(le32(file, at + 12 + n), masked(payload));
    out.push_back(std::move(payload));
    at += 12 + n + 4;
  }
  return out;
}

struct decoded_scalar {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string tag;
  float value = 0;
};

/// An Event with a one-value Summary: wall_time = 1 (double), step = 2 (int64), summary = 5;
/// Summary.value = 1; Value.tag = 1 (string), Value.simple_value = 2 (float).
decoded_scalar decode_scalar_event(const std::string& payload) {
  decoded_scalar d;
  int seen = 0;
  for (const field& f : decode(payload)) {
    if (f.number == 1 && f.wire == 1) {
      d.wall_time = std::bit_cast<double>(f.num);
      seen |= 1;
    } else if (f.number == 2 && f.wire == 0) {
      d.step = static_cast<std::int64_t>(f.num);
      seen |= 2;
    } else if (f.number == 5 && f.wire == 2) {
      const auto summary = decode(f.bytes);
      BOOST_REQUIRE_EQUAL(summary.size(), 1U);
      BOOST_REQUIRE_EQUAL(summary[0].number, 1U);
      for (const field& v : decode(summary[0].bytes)) {
        if (v.number == 1 && v.wire == 2) {
          d.tag = v.bytes;
          seen |= 4;
        } else if (v.number == 2 && v.wire == 5) {
          d.value = std::bit_cast<float>(static_cast<std::uint32_t>(v.num));
          seen |= 8;
        } else {
          BOOST_ERROR("unexpected Summary.Value field " << v.number);
        }
      }
    } else {
      BOOST_ERROR("unexpected Event field " << f.number << " wire " << f.wire);
    }
  }
  BOOST_CHECK_EQUAL(seen, 15);
  return d;
}

/// A writer that records batches and can be held inside write() until released.
class gated_writer final : public hp::metric_writer {
 public:
  struct state {
    std::mutex mu;
    std::condition_variable cv;
    bool hold = false;
    bool inside = false;
    std::vector<hp::scalar_event> events;
    int flushes = 0;
    int closes = 0;
    bool fail = false;
  };
  explicit gated_writer(std::shared_ptr<state> s) : s_(std::move(s)) {}
  void write(std::span<const hp::scalar_event> events) override {
    std::unique_lock lock(s_->mu);
    if (s_->fail) throw hone::io_error("gated_writer: the disk is full (test)");
    s_->inside = true;
    s_->cv.notify_all();
    s_->cv.wait(lock, [&] { return !s_->hold; });
    s_->inside = false;
    s_->events.insert(s_->events.end(), events.begin(), events.end());
  }
  void flush() override {
    const std::lock_guard lock(s_->mu);
    ++s_->flushes;
  }
  void close() override {
    const std::lock_guard lock(s_->mu);
    ++s_->closes;
  }

 private:
  std::shared_ptr<state> s_;
};

std::vector<std::unique_ptr<hp::metric_writer>> one(std::unique_ptr<hp::metric_writer> w) {
  std::vector<std::unique_ptr<hp::metric_writer>> v;
  v.push_back(std::move(w));
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(crc32c_matches_known_vectors_and_tensorflows_mask) {
  BOOST_CHECK_EQUAL(hp::detail::crc32c("123456789"), 0xE3069283U);
  BOOST_CHECK_EQUAL(hp::detail::crc32c(""), 0U);
  // RFC 3720 (iSCSI) B.4 vectors.
  BOOST_CHECK_EQUAL(hp::detail::crc32c(std::string(32, '\0')), 0x8A9136AAU);
  BOOST_CHECK_EQUAL(hp::detail::crc32c(std::string(32, '\xff')), 0x62A8AB43U);
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  BOOST_CHECK_EQUAL(hp::detail::crc32c(ascending), 0x46DD794EU);
  // Continuing a CRC over a split gives the CRC of the whole.
  BOOST_CHECK_EQUAL(hp::detail::crc32c("6789", hp::detail::crc32c("12345")), 0xE3069283U);
  // The masked values as tensorboard's own masked_crc32c computes them
  // (tensorboard.compat.tensorflow_stub.pywrap_tensorflow, tensorboard 2.21).
  BOOST_CHECK_EQUAL(hp::detail::masked_crc32c("123456789"), 0xC78AB0E5U);
  BOOST_CHECK_EQUAL(hp::detail::masked_crc32c(""), 0xA282EAD8U);
  const char five[8] = {5, 0, 0, 0, 0, 0, 0, 0};
  BOOST_CHECK_EQUAL(hp::detail::masked_crc32c(std::string_view(five, 8)), 0x3E04B2EAU);
}

BOOST_AUTO_TEST_CASE(a_tfrecord_is_length_crc_payload_crc) {
  hp::detail::byte_buffer out;
  hp::detail::append_tfrecord(out, "hello");
  const std::string r(out.view());
  BOOST_REQUIRE_EQUAL(r.size(), 8U + 4U + 5U + 4U);
  BOOST_CHECK_EQUAL(le64(r, 0), 5U);
  BOOST_CHECK_EQUAL(le32(r, 8), 0x3E04B2EAU);  // masked CRC of the 8 length bytes (tensorboard's)
  BOOST_CHECK_EQUAL(r.substr(12, 5), "hello");
  BOOST_CHECK_EQUAL(le32(r, 17), hp::detail::masked_crc32c("hello"));
  hp::detail::append_tfrecord(out, "");
  BOOST_CHECK_EQUAL(read_records(std::string(out.view())).size(), 2U);
}

BOOST_AUTO_TEST_CASE(csv_rows_quote_tags_as_rfc_4180_says) {
  const fs::path dir = fresh_dir("csv");
  {
    hp::metrics_sink sink({.csv = dir / "sub" / "m.csv"});
    sink.scalar("train/loss", 1, 0.5);
    sink.scalar("a,b", 2, -1.25);
    sink.scalar("say \"hi\"", 3, 3.0);
    sink.scalar("two\nlines", 4, 1e-300);
    sink.scalar("plain", -5, 0.1);
    BOOST_CHECK_EQUAL(sink.csv_path(), dir / "sub" / "m.csv");
  }
  const auto lines = lines_of(read_all(dir / "sub" / "m.csv"));
  BOOST_REQUIRE_EQUAL(lines.size(), 7U);  // the quoted LF splits one row into two lines here
  BOOST_CHECK_EQUAL(lines[0], "step,tag,value,wall_time");
  BOOST_CHECK(lines[1].starts_with("1,train/loss,0.5,"));
  BOOST_CHECK(lines[2].starts_with("2,\"a,b\",-1.25,"));
  BOOST_CHECK(lines[3].starts_with("3,\"say \"\"hi\"\"\",3,"));
  BOOST_CHECK_EQUAL(lines[4], "4,\"two");
  BOOST_CHECK(lines[5].starts_with("lines\",1e-300,"));
  BOOST_CHECK(lines[6].starts_with("-5,plain,0.1,"));
  // wall_time: seconds since the epoch, now give or take a minute.
  const double wall = std::stod(lines[1].substr(lines[1].rfind(',') + 1));
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  BOOST_CHECK_LT(std::abs(wall - now), 60.0);
}

BOOST_AUTO_TEST_CASE(nan_and_infinities_are_written_as_such) {
  const fs::path dir = fresh_dir("nonfinite");
  std::filesystem::path tb;
  {
    hp::metrics_sink sink({.csv = dir / "m.csv", .tensorboard = dir / "tb"});
    sink.scalar("x", 0, std::numeric_limits<double>::quiet_NaN());
    sink.scalar("x", 1, std::numeric_limits<double>::infinity());
    sink.scalar("x", 2, -std::numeric_limits<double>::infinity());
    tb = sink.tensorboard_path();
  }
  const auto lines = lines_of(read_all(dir / "m.csv"));
  BOOST_REQUIRE_EQUAL(lines.size(), 4U);
  BOOST_CHECK(lines[1].starts_with("0,x,nan,"));
  BOOST_CHECK(lines[2].starts_with("1,x,inf,"));
  BOOST_CHECK(lines[3].starts_with("2,x,-inf,"));
  const auto records = read_records(read_all(tb));
  BOOST_REQUIRE_EQUAL(records.size(), 4U);
  BOOST_CHECK(std::isnan(decode_scalar_event(records[1]).value));
  BOOST_CHECK_EQUAL(decode_scalar_event(records[2]).value, std::numeric_limits<float>::infinity());
  BOOST_CHECK_EQUAL(decode_scalar_event(records[3]).value, -std::numeric_limits<float>::infinity());
}

BOOST_AUTO_TEST_CASE(the_event_file_holds_the_file_version_then_one_event_per_scalar) {
  const fs::path dir = fresh_dir("tb");
  fs::path path;
  {
    hp::metrics_sink sink({.tensorboard = dir / "run"});
    path = sink.tensorboard_path();
    sink.scalar("train/loss", 7, 0.1);  // rounds to float32
    sink.scalar("lr", 1'000'000'000'000LL, 3e-4);
  }
  BOOST_CHECK_EQUAL(path.parent_path(), dir / "run");
  BOOST_CHECK(path.filename().string().starts_with("events.out.tfevents."));
  const auto records = read_records(read_all(path));
  BOOST_REQUIRE_EQUAL(records.size(), 3U);
  // The first Event: wall_time (1), step (2) = 0, file_version (3) = "brain.Event:2".
  const auto first = decode(records[0]);
  BOOST_REQUIRE_EQUAL(first.size(), 3U);
  BOOST_CHECK_EQUAL(first[0].number, 1U);
  BOOST_CHECK_EQUAL(first[0].wire, 1U);
  BOOST_CHECK_EQUAL(first[2].number, 3U);
  BOOST_CHECK_EQUAL(first[2].bytes, "brain.Event:2");
  const decoded_scalar a = decode_scalar_event(records[1]);
  BOOST_CHECK_EQUAL(a.tag, "train/loss");
  BOOST_CHECK_EQUAL(a.step, 7);
  BOOST_CHECK_EQUAL(std::bit_cast<std::uint32_t>(a.value), std::bit_cast<std::uint32_t>(0.1f));
  BOOST_CHECK_GT(a.wall_time, 1.6e9);
  const decoded_scalar b = decode_scalar_event(records[2]);
  BOOST_CHECK_EQUAL(b.tag, "lr");
  BOOST_CHECK_EQUAL(b.step, 1'000'000'000'000LL);
  BOOST_CHECK_EQUAL(b.value, 3e-4f);
}

BOOST_AUTO_TEST_CASE(two_sinks_in_one_directory_write_two_files) {
  const fs::path dir = fresh_dir("two");
  hp::metrics_sink a({.tensorboard = dir});
  hp::metrics_sink b({.tensorboard = dir});
  BOOST_CHECK_NE(a.tensorboard_path(), b.tensorboard_path());
}

BOOST_AUTO_TEST_CASE(an_empty_tag_is_rejected_with_a_clear_error) {
  const fs::path dir = fresh_dir("empty_tag");
  hp::metrics_sink sink({.csv = dir / "m.csv"});
  BOOST_CHECK_EXCEPTION(sink.scalar("", 1, 1.0), hone::config_error, [](const auto& e) {
    return std::string(e.what()).find("tag is empty") != std::string::npos;
  });
  sink.scalar("ok", 1, 1.0);  // the sink still works
  sink.close();
  BOOST_CHECK_EQUAL(lines_of(read_all(dir / "m.csv")).size(), 2U);
}

BOOST_AUTO_TEST_CASE(a_directory_that_cannot_be_created_is_an_error_naming_it) {
  const fs::path dir = fresh_dir("unwritable");
  std::ofstream(dir / "file") << "a file, not a directory";
  const fs::path bad = dir / "file" / "tb";
  BOOST_CHECK_EXCEPTION(hp::metrics_sink({.tensorboard = bad}), hone::io_error, [&](const auto& e) {
    const std::string m = e.what();
    return m.find(bad.string()) != std::string::npos &&
           m.find("cannot create") != std::string::npos;
  });
  BOOST_CHECK_EXCEPTION(
      hp::metrics_sink({.csv = bad / "m.csv"}), hone::io_error,
      [&](const auto& e) { return std::string(e.what()).find(bad.string()) != std::string::npos; });
}

BOOST_AUTO_TEST_CASE(bad_options_are_rejected) {
  BOOST_CHECK_THROW(hp::metrics_sink({.queue_capacity = 0}), hone::config_error);
  BOOST_CHECK_THROW(hp::metrics_sink({.flush_interval = std::chrono::milliseconds(0)}),
                    hone::config_error);
}

BOOST_AUTO_TEST_CASE(a_full_queue_waits_and_drops_nothing) {
  auto st = std::make_shared<gated_writer::state>();
  st->hold = true;
  hp::metrics_sink sink({.queue_capacity = 4, .flush_interval = std::chrono::milliseconds(1)},
                        one(std::make_unique<gated_writer>(st)));
  // The first scalar reaches the writer, which holds the thread inside write().
  sink.scalar("s", 0, 0.0);
  {
    std::unique_lock lock(st->mu);
    st->cv.wait(lock, [&] { return st->inside; });
  }
  for (int i = 1; i <= 4; ++i) sink.scalar("s", i, i);  // fills the queue
  BOOST_CHECK_EQUAL(sink.stalls(), 0U);
  std::atomic<bool> returned{false};
  std::thread producer([&] {
    sink.scalar("s", 5, 5.0);  // waits: the queue is full
    returned.store(true);
  });
  while (sink.stalls() == 0) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  BOOST_CHECK(!returned.load());
  {
    const std::lock_guard lock(st->mu);
    st->hold = false;
  }
  st->cv.notify_all();
  producer.join();
  BOOST_CHECK(returned.load());
  sink.flush();
  BOOST_CHECK_EQUAL(sink.logged(), 6U);
  BOOST_CHECK_EQUAL(sink.written(), 6U);
  BOOST_CHECK_EQUAL(sink.stalls(), 1U);
  const std::lock_guard lock(st->mu);
  BOOST_REQUIRE_EQUAL(st->events.size(), 6U);
  for (int i = 0; i < 6; ++i) BOOST_CHECK_EQUAL(st->events[i].step, i);
  BOOST_CHECK_GE(st->flushes, 1);
}

BOOST_AUTO_TEST_CASE(flush_writes_everything_logged_before_it) {
  const fs::path dir = fresh_dir("flush");
  // A long interval: only flush() (or a half-full queue) makes the thread write.
  hp::metrics_sink sink({.csv = dir / "m.csv", .flush_interval = std::chrono::hours(1)});
  for (int i = 0; i < 10; ++i) sink.scalar("a", i, i);
  sink.flush();
  BOOST_CHECK_EQUAL(sink.written(), 10U);
  BOOST_CHECK_EQUAL(lines_of(read_all(dir / "m.csv")).size(), 11U);
  sink.scalar("a", 10, 10);
  sink.close();
  BOOST_CHECK_EQUAL(lines_of(read_all(dir / "m.csv")).size(), 12U);
  sink.close();  // idempotent
  BOOST_CHECK_EXCEPTION(sink.scalar("a", 11, 11), hone::config_error, [](const auto& e) {
    return std::string(e.what()).find("closed") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(the_interval_writes_without_flush) {
  const fs::path dir = fresh_dir("interval");
  hp::metrics_sink sink({.csv = dir / "m.csv", .flush_interval = std::chrono::milliseconds(5)});
  sink.scalar("a", 0, 1.0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (sink.written() < 1 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  BOOST_CHECK_EQUAL(sink.written(), 1U);
  BOOST_CHECK_EQUAL(lines_of(read_all(dir / "m.csv")).size(), 2U);
}

BOOST_AUTO_TEST_CASE(a_failing_writer_stops_the_sink_and_its_error_surfaces_once) {
  auto st = std::make_shared<gated_writer::state>();
  st->fail = true;
  hp::metrics_sink sink({.queue_capacity = 8}, one(std::make_unique<gated_writer>(st)));
  sink.scalar("a", 0, 0.0);
  BOOST_CHECK_EXCEPTION(sink.flush(), hone::io_error, [](const auto& e) {
    return std::string(e.what()).find("disk is full") != std::string::npos;
  });
  BOOST_CHECK_EXCEPTION(sink.scalar("a", 1, 1.0), hone::error, [](const auto& e) {
    return std::string(e.what()).find("failed earlier") != std::string::npos;
  });
  BOOST_CHECK_NO_THROW(sink.close());  // already reported
  const std::lock_guard lock(st->mu);
  BOOST_CHECK_EQUAL(st->closes, 1);
}

BOOST_AUTO_TEST_CASE(a_step_report_and_a_memory_sample_become_scalars) {
  auto st = std::make_shared<gated_writer::state>();
  {
    hp::metrics_sink sink({}, one(std::make_unique<gated_writer>(st)));
    hone::step_report r{.loss = 0.75f,
                        .grad_norm = 2.5,
                        .lr = 1e-3f,
                        .loss_scale = 1024.0f,
                        .skipped = true,
                        .step = 41};
    sink.log(r);
    sink.log(r, 100);
    hp::log_memory(sink, {.host_rss = std::size_t{3} << 20}, 5);
    hp::log_memory(sink, {.host_rss = 1 << 20, .device_used = 2 << 20, .device_total = 8 << 20}, 6);
  }
  const std::lock_guard lock(st->mu);
  BOOST_REQUIRE_EQUAL(st->events.size(), 14U);
  const std::vector<std::string> tags = {"train/loss", "train/grad_norm", "train/lr",
                                         "train/loss_scale", "train/skipped"};
  const std::vector<double> values = {0.75, 2.5, static_cast<double>(1e-3f), 1024.0, 1.0};
  for (std::size_t i = 0; i < 5; ++i) {
    BOOST_CHECK_EQUAL(st->events[i].tag, tags[i]);
    BOOST_CHECK_EQUAL(st->events[i].step, 41);
    BOOST_CHECK_EQUAL(st->events[i].value, values[i]);
    BOOST_CHECK_EQUAL(st->events[5 + i].step, 100);
  }
  BOOST_CHECK_EQUAL(st->events[10].tag, "memory/host_rss_mib");
  BOOST_CHECK_EQUAL(st->events[10].value, 3.0);
  BOOST_CHECK_EQUAL(st->events[10].step, 5);
  BOOST_CHECK_EQUAL(st->events[11].tag, "memory/host_rss_mib");
  BOOST_CHECK_EQUAL(st->events[12].tag, "memory/device_used_mib");
  BOOST_CHECK_EQUAL(st->events[12].value, 2.0);
  BOOST_CHECK_EQUAL(st->events[13].tag, "memory/device_total_mib");
  BOOST_CHECK_EQUAL(st->events[13].value, 8.0);
  BOOST_CHECK_EQUAL(st->closes, 1);
}

// Tests of hone/data/loader.hpp: the batches a loader delivers against an oracle that cuts the
// sampler's epoch order into batches by hand (keep, drop, pad; view and buffer datasets), the same
// bytes for every thread count and prefetch depth (with a seeded transform), bad records stopping
// with the sample's index and the file's byte offset or skipped and counted, and a loader
// destroyed with batches in flight. Label concurrency: CI runs it under ThreadSanitizer.
#define BOOST_TEST_MODULE hone_data_loader
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "loader_common.hpp"

using namespace loader_test;
namespace fs = std::filesystem;

namespace {

/// The oracle: one epoch's batches cut from `order` by hand, values 1000 + 7 i.
std::vector<seen> expected_epoch(const std::vector<std::uint64_t>& order, std::uint64_t epoch,
                                 std::size_t b, data::last_batch last) {
  std::vector<seen> out;
  for (std::size_t first = 0; first < order.size(); first += b) {
    const std::size_t rows = std::min(b, order.size() - first);
    if (rows < b && last == data::last_batch::drop) break;
    seen s;
    s.epoch = epoch;
    s.index = first / b;
    s.first = first;
    s.rows = rows;
    s.indices.assign(order.begin() + static_cast<std::ptrdiff_t>(first),
                     order.begin() + static_cast<std::ptrdiff_t>(first + rows));
    s.padded = last == data::last_batch::pad ? b : rows;
    for (std::size_t r = 0; r < s.padded; ++r)
      s.values.push_back(numbers::value(s.indices[r % rows]));
    out.push_back(s);
  }
  out.push_back(end_of_epoch());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(sequential_batches_keep_drop_and_pad_the_last_one) {
  const numbers ds{10};
  std::vector<std::uint64_t> order(10);
  std::iota(order.begin(), order.end(), 0u);
  for (const auto last : {data::last_batch::keep, data::last_batch::drop, data::last_batch::pad}) {
    for (const std::size_t threads : {0u, 1u, 2u}) {
      data::loader l(ds, batch{std::vector<std::uint64_t>(4)}, put{},
                     {.batch_size = 4, .threads = threads, .prefetch = 2, .last = last});
      std::vector<seen> want;
      for (std::uint64_t e = 0; e < 3; ++e) {
        const auto ep = expected_epoch(order, e, 4, last);
        want.insert(want.end(), ep.begin(), ep.end());
      }
      const std::vector<seen> got = run(l, want.size());
      BOOST_TEST((got == want), "last " << static_cast<int>(last) << " threads " << threads);
      BOOST_TEST(l.state().epoch == 3u);
      BOOST_TEST(l.state().position == 0u);
    }
  }
}

BOOST_AUTO_TEST_CASE(shuffled_epochs_follow_the_samplers_orders) {
  const numbers ds{23};
  const data::shuffled_sampler s;
  data::loader l(ds, batch{std::vector<std::uint64_t>(5)}, put{},
                 {.batch_size = 5, .threads = 2, .prefetch = 3, .seed = 77}, s);
  std::vector<seen> want;
  for (std::uint64_t e = 0; e < 4; ++e) {
    std::vector<std::uint64_t> order;
    s.epoch_order(23, 77, e, order);
    const auto ep = expected_epoch(order, e, 5, data::last_batch::keep);
    want.insert(want.end(), ep.begin(), ep.end());
  }
  BOOST_TEST((run(l, want.size()) == want));
}

BOOST_AUTO_TEST_CASE(a_buffer_dataset_goes_through_the_caller_buffer_form) {
  const triples ds{9};
  struct sums {
    std::vector<std::uint64_t> v = std::vector<std::uint64_t>(4);
  };
  const auto collate = [](sums& b, std::size_t row, const std::vector<std::uint64_t>& x) {
    b.v.at(row) = x.at(0) + x.at(1) + x.at(2);
  };
  const std::vector<double> w{0, 1, 0, 0, 2, 0, 0, 0, 1};
  data::loader l(ds, sums{}, collate, {.batch_size = 4, .threads = 1, .seed = 5},
                 data::weighted_sampler(w, 12));
  std::vector<std::uint64_t> order;
  data::weighted_sampler(w, 12).epoch_order(9, 5, 0, order);
  for (std::size_t k = 0; k < 3; ++k) {
    auto* b = l.next();
    BOOST_REQUIRE(b != nullptr);
    for (std::size_t r = 0; r < 4; ++r) {
      BOOST_TEST(b->info.indices[r] == order[4 * k + r]);
      BOOST_TEST(b->data.v[r] == 6 * order[4 * k + r]);
      BOOST_TEST((order[4 * k + r] == 1 || order[4 * k + r] == 4 || order[4 * k + r] == 8));
    }
  }
  BOOST_TEST(l.next() == nullptr);
}

BOOST_AUTO_TEST_CASE(every_thread_count_and_prefetch_depth_gives_the_same_bytes) {
  const numbers ds{157};
  const auto make = [&](std::size_t threads, std::size_t prefetch) {
    auto l = std::make_unique<data::loader<numbers, batch, put, data::shuffled_sampler>>(
        ds, batch{std::vector<std::uint64_t>(8)}, put{},
        data::loader_options{.batch_size = 8,
                             .threads = threads,
                             .prefetch = prefetch,
                             .seed = 1234,
                             .last = data::last_batch::pad});
    l->set_transform(noisy);
    return l;
  };
  // The oracle: the sampler's orders cut into batches, then the transform applied by hand with
  // the generator keyed by (seed, epoch, first position).
  std::vector<seen> want;
  for (std::uint64_t e = 0; e < 3; ++e) {
    std::vector<std::uint64_t> order;
    data::shuffled_sampler{}.epoch_order(157, 1234, e, order);
    auto ep = expected_epoch(order, e, 8, data::last_batch::pad);
    for (auto& s : ep) {
      if (s.rows == end_of_epoch().rows) continue;
      data::batch_info info;
      info.seed = 1234;
      info.epoch = e;
      info.first_position = s.first;
      hone::replay_rng rng = info.rng();
      for (auto& v : s.values) v ^= rng() & 0xffff0000u;
    }
    want.insert(want.end(), ep.begin(), ep.end());
  }
  for (const std::size_t threads : {0u, 1u, 2u, 4u}) {
    for (const std::size_t prefetch : {1u, 3u, 8u}) {
      auto l = make(threads, prefetch);
      BOOST_TEST((run(*l, want.size()) == want), "threads " << threads << " prefetch " << prefetch);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_bad_record_stops_at_its_batch_with_the_sample_index) {
  numbers ds{40};
  ds.bad = 13;
  for (const std::size_t threads : {0u, 2u}) {
    data::loader l(ds, batch{std::vector<std::uint64_t>(4)}, put{},
                   {.batch_size = 4, .threads = threads, .prefetch = 4});
    for (int k = 0; k < 3; ++k) BOOST_TEST(l.next() != nullptr);  // samples 0..11 are fine
    BOOST_TEST(l.state().position == 12u);
    try {
      (void)l.next();
      BOOST_ERROR("no sample_error");
    } catch (const data::sample_error& e) {
      BOOST_TEST(e.index() == 13u);
      BOOST_TEST(e.position() == 13u);
      BOOST_TEST(e.epoch() == 0u);
      BOOST_TEST(!e.file_offset().has_value());
      const std::string m = e.what();
      for (const char* frag :
           {"sample 13 (epoch 0, position 13", "record 13 is damaged", "on_bad_record::skip"}) {
        BOOST_TEST(m.find(frag) != std::string::npos, m << " lacks " << frag);
      }
    }
    BOOST_TEST(l.state().position == 12u);                  // the failed batch was not consumed
    BOOST_CHECK_THROW((void)l.next(), data::sample_error);  // and the loader stays failed
  }
}

BOOST_AUTO_TEST_CASE(bad_records_can_be_skipped_and_counted) {
  numbers ds{20};
  ds.bad = 6;
  std::vector<seen> first_run;
  for (const std::size_t threads : {0u, 1u, 3u}) {
    data::loader l(ds, batch{std::vector<std::uint64_t>(4)}, put{},
                   {.batch_size = 4,
                    .threads = threads,
                    .last = data::last_batch::pad,
                    .bad_records = data::on_bad_record::skip});
    const std::vector<seen> got = run(l, 12);  // two epochs of 5 batches and their ends
    BOOST_TEST(got[1].rows == 3u);             // samples 4, 5, 7; padded with 4
    BOOST_TEST((got[1].indices == std::vector<std::uint64_t>{4, 5, 7}));
    BOOST_TEST((got[1].values == std::vector<std::uint64_t>{1028, 1035, 1049, 1028}));
    BOOST_TEST(got[1].padded == 4u);
    BOOST_TEST(got[5].rows == end_of_epoch().rows);
    BOOST_TEST(l.skipped() == 2u);  // once per epoch
    BOOST_TEST(l.state().skipped == 2u);
    BOOST_REQUIRE(l.skipped_records().size() == 2u);
    BOOST_TEST(l.skipped_records()[0].index == 6u);
    BOOST_TEST(l.skipped_records()[1].epoch == 1u);
    BOOST_TEST(l.skipped_records()[0].message.find("record 6 is damaged") != std::string::npos);
    if (first_run.empty()) first_run = got;
    BOOST_TEST((got == first_run));
  }
}

BOOST_AUTO_TEST_CASE(a_batch_whose_records_are_all_skipped_is_not_delivered) {
  numbers ds{5};
  ds.bad = 2;
  data::loader l(ds, batch{std::vector<std::uint64_t>(1)}, put{},
                 {.batch_size = 1, .threads = 1, .bad_records = data::on_bad_record::skip});
  std::vector<std::uint64_t> got;
  while (auto* b = l.next()) got.push_back(b->info.indices[0]);
  BOOST_TEST((got == std::vector<std::uint64_t>{0, 1, 3, 4}));
  BOOST_TEST(l.skipped() == 1u);
}

BOOST_AUTO_TEST_CASE(a_line_dataset_error_names_the_file_and_byte_offset) {
  const fs::path file =
      fs::temp_directory_path() / ("hone-loader-lines-" + std::to_string(::getpid()) + ".txt");
  const std::string text = "alpha\nbeta\nBAD record\ngamma\n";
  std::ofstream(file, std::ios::binary) << text;
  data::line_dataset_options lo;
  lo.save_index = false;
  const data::line_dataset ds(file, data::line_format::text, lo);
  struct strings {
    std::vector<std::string> v = std::vector<std::string>(2);
  };
  const auto collate = [](strings& b, std::size_t row, std::string_view rec) {
    if (rec.starts_with("BAD")) throw std::invalid_argument("this record does not parse");
    b.v.at(row) = std::string(rec);
  };
  data::loader l(ds, strings{}, collate, {.batch_size = 2, .threads = 2});
  auto* b = l.next();
  BOOST_REQUIRE(b != nullptr);
  BOOST_TEST(b->data.v[0] == "alpha");
  BOOST_TEST(b->data.v[1] == "beta");
  try {
    (void)l.next();
    BOOST_ERROR("no sample_error");
  } catch (const data::sample_error& e) {
    const auto offset = text.find("BAD");  // the oracle: where the record starts in the file
    BOOST_TEST(e.index() == 2u);
    BOOST_TEST(e.file_offset().value_or(0) == offset);
    const std::string m = e.what();
    const std::string where =
        "the record at byte " + std::to_string(offset) + " of '" + file.string() + "'";
    BOOST_TEST(m.find(where) != std::string::npos, m);
    BOOST_TEST(m.find("this record does not parse") != std::string::npos, m);
  }
  fs::remove(file);
}

BOOST_AUTO_TEST_CASE(bad_options_and_late_calls_are_refused) {
  const numbers ds{4};
  using L = data::loader<numbers, batch, put>;
  BOOST_TEST(message_of([&] {
               L l(ds, batch{}, put{}, {.batch_size = 0});
             }).find("batch_size is 0") != std::string::npos);
  BOOST_TEST(message_of([&] {
               L l(ds, batch{}, put{}, {.batch_size = 1, .prefetch = 0});
             }).find("prefetch is 0") != std::string::npos);
  L l(ds, batch{std::vector<std::uint64_t>(1)}, put{});
  (void)l.next();
  BOOST_TEST(message_of([&] { l.set_transform(noisy); }).find("before the first next()") !=
             std::string::npos);
  BOOST_TEST(message_of([&] { l.restore(l.state()); }).find("before the first next()") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(an_empty_dataset_ends_every_epoch_at_once) {
  const numbers ds{0};
  data::loader l(ds, batch{std::vector<std::uint64_t>(3)}, put{}, {.batch_size = 3, .threads = 2},
                 data::shuffled_sampler{});
  for (std::uint64_t e = 0; e < 3; ++e) {
    BOOST_TEST(l.next() == nullptr);
    BOOST_TEST(l.state().epoch == e + 1);
  }
}

BOOST_AUTO_TEST_CASE(a_loader_destroyed_with_batches_in_flight_waits_for_them) {
  // Many tiny batches, a deep prefetch and more threads than cores; destroyed at every point of
  // the first epochs. Under ThreadSanitizer this checks that no task outlives the loader.
  const numbers ds{300};
  for (std::size_t stop = 0; stop < 40; stop += 3) {
    data::loader l(ds, batch{std::vector<std::uint64_t>(2)}, put{},
                   {.batch_size = 2, .threads = 4, .prefetch = 16, .seed = stop},
                   data::shuffled_sampler{});
    l.set_transform(noisy);
    for (std::size_t k = 0; k < stop; ++k) BOOST_TEST(l.next() != nullptr);
  }
}

// Tests of hone/data/pinned_batch.hpp on the host (no CUDA: pinned_host_space falls back to
// pageable memory here): the layout's offsets and sizes, rows and fields as spans, copies owning
// their own block, the refusals (duplicate names, a wrong element type, a row past the end, zero
// rows), fields of 0 bytes, and a loader on two threads collating into pinned batches against an
// oracle cut from the sampler's order. The device side is test_data_loader_gpu.
#define BOOST_TEST_MODULE hone_data_pinned_batch
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <hone/data.hpp>
#include <string>
#include <vector>

namespace data = hone::data;

namespace {
/// Sample i: 5 values 3 i + c (c = 0..4) and a label i * 0.5.
struct records {
  using buffer_type = std::vector<std::uint32_t>;
  std::size_t n = 0;
  [[nodiscard]] std::size_t size() const { return n; }
  void get(std::size_t i, buffer_type& out) const {
    out.resize(5);
    for (std::uint32_t c = 0; c < 5; ++c) out[c] = static_cast<std::uint32_t>(3 * i + c);
  }
};
struct collate {
  void operator()(data::pinned_batch& b, std::size_t row,
                  const std::vector<std::uint32_t>& s) const {
    auto v = b.row<std::uint32_t>(0, row);
    std::copy(s.begin(), s.end(), v.begin());
    b.row<double>(1, row)[0] = s[0] / 6.0;  // (3 i) / 6 = i * 0.5, exact
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(layout_offsets_and_sizes) {
  data::batch_layout l(3);
  l.add<std::uint32_t>("a", 5).add<double>("b", 1).add<float>("empty", 0).add<std::int8_t>("c", 7);
  BOOST_TEST(l.rows() == 3u);
  BOOST_TEST(l.size() == 4u);
  BOOST_TEST(l.field(0).offset == 0u);
  BOOST_TEST(l.field(1).offset == 256u);  // 60 bytes, rounded up to the field alignment
  BOOST_TEST(l.field(2).offset == 512u);  // 24 bytes
  BOOST_TEST(l.field(3).offset == 512u);  // the empty field has no bytes
  BOOST_TEST(l.bytes() == 512u + 21u);
  BOOST_TEST(l.index_of("c") == 3u);
  BOOST_CHECK_EXCEPTION((void)l.index_of("d"), hone::config_error, [](const auto& e) {
    return std::string(e.what()).find(
               "no field is named 'd'; the fields are 'a', 'b', 'empty', "
               "'c'") != std::string::npos;
  });
  BOOST_CHECK_THROW(l.add<float>("a", 1), hone::config_error);
  BOOST_CHECK_THROW((void)l.field(4), hone::config_error);
  BOOST_CHECK_THROW(data::batch_layout(0), hone::config_error);
  BOOST_CHECK_THROW(data::batch_layout(2).add<double>("huge", ~std::size_t{0} / 8),
                    hone::config_error);
  data::batch_layout same(3);
  same.add<std::uint32_t>("a", 5)
      .add<double>("b", 1)
      .add<float>("empty", 0)
      .add<std::int8_t>("c", 7);
  BOOST_TEST((same == l));
  data::batch_layout other(3);
  other.add<std::uint32_t>("a", 4);
  BOOST_TEST(!(other == l));
  data::batch_layout none(4);
  BOOST_TEST(none.bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(rows_fields_copies_and_refusals) {
  data::batch_layout l(4);
  l.add<std::uint32_t>("v", 3).add<float>("nothing", 0);
  data::pinned_batch b(l);
  BOOST_TEST(b.bytes() == l.bytes());
  BOOST_TEST(b.rows() == 4u);
  for (std::uint32_t x : b.field<std::uint32_t>(0)) BOOST_TEST(x == 0u);  // zeroed
  BOOST_TEST(b.field<std::uint32_t>("v").size() == 12u);
  b.row<std::uint32_t>(0, 2)[1] = 77;
  BOOST_TEST(b.field<std::uint32_t>(0)[2 * 3 + 1] == 77u);
  BOOST_TEST(b.row<float>(1, 3).empty());
  BOOST_TEST(!b.page_locked());  // no CUDA translation unit in this program
  BOOST_CHECK_EXCEPTION((void)b.row<std::uint32_t>(0, 4), hone::config_error, [](const auto& e) {
    return std::string(e.what()).find("row 4 does not exist: the batch holds 4 rows") !=
           std::string::npos;
  });
  BOOST_CHECK_EXCEPTION((void)b.field<double>(0), hone::config_error, [](const auto& e) {
    return std::string(e.what()).find("holds elements of 4 bytes, read here as a type of 8") !=
           std::string::npos;
  });
  data::pinned_batch c(b);  // its own block, same bytes
  BOOST_TEST(c.data() != b.data());
  BOOST_TEST(c.field<std::uint32_t>(0)[7] == 77u);
  c.row<std::uint32_t>(0, 2)[1] = 5;
  BOOST_TEST(b.field<std::uint32_t>(0)[7] == 77u);
  b = c;
  BOOST_TEST(b.field<std::uint32_t>(0)[7] == 5u);
  BOOST_TEST(b.data() != c.data());
  data::pinned_batch empty{data::batch_layout(2)};
  BOOST_TEST(empty.bytes() == 0u);
  BOOST_TEST(empty.data() == nullptr);
  data::pinned_batch copy_of_empty(empty);
  BOOST_TEST(copy_of_empty.bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(loader_collates_into_pinned_batches) {
  const records ds{23};
  const std::size_t bs = 4;
  data::batch_layout l(bs);
  l.add<std::uint32_t>("v", 5).add<double>("label", 1);
  for (const auto last : {data::last_batch::keep, data::last_batch::pad}) {
    data::loader ld(ds, data::pinned_batch(l), collate{},
                    {.batch_size = bs, .threads = 2, .prefetch = 3, .seed = 9, .last = last},
                    data::shuffled_sampler{});
    for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
      std::vector<std::uint64_t> order;
      data::shuffled_sampler{}.epoch_order(ds.n, 9, epoch, order);
      std::size_t first = 0;
      while (auto* b = ld.next()) {
        const std::size_t rows = std::min(bs, order.size() - first);
        BOOST_TEST_CONTEXT("epoch " << epoch << ", first " << first) {
          BOOST_TEST(b->info.rows == rows);
          BOOST_TEST(b->info.padded_rows == (last == data::last_batch::pad ? bs : rows));
          for (std::size_t r = 0; r < b->info.padded_rows; ++r) {
            const std::uint64_t i = order[first + r % rows];
            for (std::uint32_t c = 0; c < 5; ++c) {
              BOOST_TEST(b->data.row<std::uint32_t>(0, r)[c] == 3 * i + c);
            }
            BOOST_TEST(b->data.row<double>(1, r)[0] == static_cast<double>(i) * 0.5);
          }
        }
        first += rows;
      }
      BOOST_TEST(first == ds.n);
    }
  }
  // A loader whose batch_size is larger than the layout's rows: the collate's row() refuses.
  data::loader big(ds, data::pinned_batch(l), collate{}, {.batch_size = bs + 1, .threads = 0});
  BOOST_CHECK_EXCEPTION((void)big.next(), data::sample_error, [](const auto& e) {
    return std::string(e.what()).find("make the layout's rows at least the loader's batch_size") !=
           std::string::npos;
  });
}

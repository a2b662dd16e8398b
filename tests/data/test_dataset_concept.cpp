// Tests of hone/data/dataset.hpp: the module's datasets and user types in both forms satisfy
// hone::data::dataset; types missing a member (or with a non-const or void get) do not.
#define BOOST_TEST_MODULE hone_data_concept
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <hone/data.hpp>

namespace data = hone::data;

namespace {

// The caller-buffer form: fills a reused vector.
struct squares {
  using buffer_type = std::vector<int>;
  std::size_t n = 0;
  [[nodiscard]] std::size_t size() const { return n; }
  void get(std::size_t i, buffer_type& out) const { out.assign(3, static_cast<int>(i * i)); }
};

// The view form: a span into memory the dataset owns.
struct table {
  std::vector<float> values;
  [[nodiscard]] std::size_t size() const { return values.size() / 2; }
  [[nodiscard]] std::span<const float> get(std::size_t i) const {
    return std::span<const float>(values).subspan(2 * i, 2);
  }
};

struct no_size {
  [[nodiscard]] int get(std::size_t) const { return 0; }
};
struct no_get {
  [[nodiscard]] std::size_t size() const { return 0; }
};
struct void_get {
  [[nodiscard]] std::size_t size() const { return 0; }
  void get(std::size_t) const {}
};
struct mutable_get {
  [[nodiscard]] std::size_t size() const { return 0; }
  int get(std::size_t) { return 0; }
};
struct buffer_without_type {
  [[nodiscard]] std::size_t size() const { return 0; }
  void get(std::size_t, std::vector<int>&) const {}
};
struct string_size {
  [[nodiscard]] std::string size() const { return {}; }
  [[nodiscard]] int get(std::size_t) const { return 0; }
};

static_assert(data::dataset<data::line_dataset>);
static_assert(data::dataset<data::megatron_dataset<std::int32_t>>);
static_assert(data::dataset<squares>);
static_assert(data::dataset<table>);
static_assert(data::check_dataset<squares>());
static_assert(data::check_dataset<data::line_dataset>());
static_assert(!data::dataset<no_size>);
static_assert(!data::dataset<no_get>);
static_assert(!data::dataset<void_get>);
static_assert(!data::dataset<mutable_get>);
static_assert(!data::dataset<buffer_without_type>);
static_assert(!data::dataset<string_size>);
static_assert(!data::dataset<int>);
static_assert(!data::dataset<squares&>);
static_assert(std::is_same_v<data::dataset_view_t<table>, std::span<const float>>);

// Generic code over the concept: the sum of every sample's first element, either form.
template <data::dataset D>
double sum_first(const D& d) {
  double s = 0;
  if constexpr (data::dataset_has_buffer_get<D>) {
    typename D::buffer_type buffer;
    for (std::size_t i = 0; i < d.size(); ++i) {
      d.get(i, buffer);
      s += buffer[0];
    }
  } else {
    for (std::size_t i = 0; i < d.size(); ++i) s += d.get(i)[0];
  }
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(generic_code_reads_both_forms) {
  BOOST_TEST(sum_first(squares{4}) == 0.0 + 1 + 4 + 9);
  BOOST_TEST(sum_first(table{{1, 2, 3, 4, 5, 6}}) == 1.0 + 3 + 5);
}

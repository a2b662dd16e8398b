// GPU test (label gpu) of the loader's CUDA stager (hone/data/cuda/staging.hpp): records whose
// bytes are a function of their index are collated into pinned batches, staged to the device on
// the test's stream, and after a slow kernel (a spin of a few ms) queued between batches, a kernel
// copies each device batch into a snapshot array; after the run every snapshot is compared with
// a host oracle built from the sampler's order. The slow kernels hold the copies back while the
// host runs ahead, so a stager that let the loader refill a pinned batch before its copy finished
// would deliver the bytes of a later batch: the negative control does exactly that (copies with
// no event wait) and must see it, which shows the check can go red. Also: next() returns while the
// previous step still runs (overlap), several epochs, thread counts, prefetch depths and device
// rings, short, padded and dropped last batches, fields of 0 bytes, an empty dataset, and the
// size refusals. Exits 77 (skipped) when no CUDA device is present.
#define BOOST_TEST_MODULE hone_data_loader_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <hone/data.hpp>
#include <hone/data/cuda/staging.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../support/gpu.hpp"

namespace data = hone::data;

namespace {
struct gpu_fixture {
  gpu_fixture() { hone::test::skip_without_gpu(); }
};

constexpr std::size_t width = 37;  // uint32 values per record

/// Value c of record i: column 0 is the index itself (so a wrong row names its record).
std::uint32_t value(std::uint64_t i, std::size_t c) {
  if (c == 0) return static_cast<std::uint32_t>(i);
  return static_cast<std::uint32_t>(i * 2654435761u + c * 40503u + 17u);
}
double label(std::uint64_t i) {
  return static_cast<double>(i) * 0.25;
}

/// The buffer form: record i is `width` values.
struct records {
  using buffer_type = std::vector<std::uint32_t>;
  std::size_t n = 0;
  [[nodiscard]] std::size_t size() const { return n; }
  void get(std::size_t i, buffer_type& out) const {
    out.resize(width);
    for (std::size_t c = 0; c < width; ++c) out[c] = value(i, c);
  }
};

/// Field 0 "values" (width uint32), field 1 "nothing" (0 floats), field 2 "label" (one double).
struct collate {
  void operator()(data::pinned_batch& b, std::size_t row,
                  const std::vector<std::uint32_t>& s) const {
    auto v = b.row<std::uint32_t>(0, row);
    std::copy(s.begin(), s.end(), v.begin());
    b.row<double>(2, row)[0] = static_cast<double>(s[0]) * 0.25;
  }
};

data::batch_layout make_layout(std::size_t rows, std::size_t w = width) {
  data::batch_layout l(rows);
  l.add<std::uint32_t>("values", w).add<float>("nothing", 0).add<double>("label", 1);
  return l;
}

/// Spins for `ns` nanoseconds of the GPU's global timer: the "slow step".
__global__ void spin(unsigned long long ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

/// Copies a device field into the snapshot array (what a step reads).
template <class T>
__global__ void snapshot(hone::device_span<const T> src, T* dst) {
  for (std::size_t k = blockIdx.x * blockDim.x + threadIdx.x; k < src.size();
       k += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[k] = src[k];
}

template <class T>
void launch_snapshot(const T* src, std::size_t n, T* dst, cudaStream_t s) {
  if (n == 0) return;
  snapshot<T><<<4, 128, 0, s>>>(hone::device_span<const T>(src, n), dst);
  hone::check_last_launch("snapshot kernel");
}

bool running(cudaEvent_t e) {
  const cudaError_t st = cudaEventQuery(e);
  if (st == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return true;
  }
  HONE_CUDA_CHECK(st);
  return false;
}

struct config {
  std::size_t n = 103, batch = 8, threads = 2, prefetch = 2, device_buffers = 2, epochs = 3;
  data::last_batch last = data::last_batch::keep;
  unsigned long long spin_ns = 2'000'000;
  bool control = false;  // no stager: copies with no event wait (the negative control)
};

std::ostream& operator<<(std::ostream& o, const config& c) {
  return o << "n " << c.n << ", batch " << c.batch << ", threads " << c.threads << ", prefetch "
           << c.prefetch << ", device_buffers " << c.device_buffers << ", last "
           << static_cast<int>(c.last) << (c.control ? ", negative control (no event wait)" : "");
}

struct outcome {
  std::size_t batches = 0, bad_batches = 0, overlapped = 0;
  std::string first_bad;
};

/// One run: every batch of c.epochs epochs through the stager (or the no-wait copies of the
/// control), each followed on the stream by a spin and a snapshot; then every snapshot against
/// the oracle. Batch metadata (rows, indices, block) is checked as it arrives.
outcome run(const config& c) {
  const records ds{c.n};
  const data::batch_layout layout = make_layout(c.batch);
  const std::size_t per_epoch = (c.n + c.batch - 1) / c.batch;
  const std::size_t max_batches = per_epoch * c.epochs;
  hone::buffer<std::uint32_t, hone::cuda_space> snap_v(max_batches * c.batch * width);
  hone::buffer<double, hone::cuda_space> snap_l(max_batches * c.batch);
  struct expect {
    std::uint64_t epoch = 0, first = 0;
    std::vector<std::uint64_t> rows_of;  // the record of each copied row
  };
  std::vector<expect> expected;
  outcome out;

  cudaStream_t stream = nullptr;
  HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t step_done[2] = {nullptr, nullptr};
  HONE_CUDA_CHECK(cudaEventCreateWithFlags(&step_done[0], cudaEventDisableTiming));
  HONE_CUDA_CHECK(cudaEventCreateWithFlags(&step_done[1], cudaEventDisableTiming));
  {
    data::loader ld(ds, data::pinned_batch(layout), collate{},
                    {.batch_size = c.batch,
                     .threads = c.threads,
                     .prefetch = c.prefetch,
                     .seed = 41,
                     .last = c.last},
                    data::shuffled_sampler{});
    // The control's device ring and copies: no event, no wait before the loader refills.
    std::vector<hone::buffer<std::byte, hone::cuda_space>> ring;
    for (std::size_t i = 0; i < c.device_buffers; ++i) ring.emplace_back(layout.bytes());
    std::optional<data::cuda_stager<decltype(ld)>> stager;
    if (!c.control) stager.emplace(ld, layout, stream, data::stager_options{c.device_buffers});

    std::size_t m = 0;
    for (std::uint64_t epoch = 0; epoch < c.epochs; ++epoch) {
      std::vector<std::uint64_t> order;
      data::shuffled_sampler{}.epoch_order(c.n, 41, epoch, order);
      std::uint64_t first = 0;
      for (;;) {
        data::batch_info info;
        const std::uint32_t* values = nullptr;
        const double* labels = nullptr;
        if (!c.control) {
          const data::device_batch* b = stager->next();
          if (b == nullptr) break;
          info = b->info;
          BOOST_TEST(b->block() == m % c.device_buffers);
          BOOST_TEST(b->field<float>(1).empty());
          BOOST_TEST(b->field<float>("nothing").data() == nullptr);
          BOOST_TEST(b->field<std::uint32_t>(0).size() == info.padded_rows * width);
          BOOST_TEST(b->row_elements(0) == width);
          values = b->field<std::uint32_t>("values").data();
          labels = b->field<double>(2).data();
        } else {
          auto* hb = ld.next();
          if (hb == nullptr) break;
          info = hb->info;
          std::byte* dst = ring[m % c.device_buffers].data();
          HONE_CUDA_CHECK(cudaMemcpyAsync(dst, hb->data.data(), layout.bytes(),
                                          cudaMemcpyHostToDevice, stream));
          values = reinterpret_cast<const std::uint32_t*>(dst + layout.field(0).offset);
          labels = reinterpret_cast<const double*>(dst + layout.field(2).offset);
        }
        // next() came back while the previous step (queued before it) still ran: overlap.
        if (m > 0 && running(step_done[(m - 1) % 2])) ++out.overlapped;
        BOOST_TEST_REQUIRE(m < max_batches);
        // Metadata against the sampler's order, cut by hand.
        const std::size_t rows = std::min<std::size_t>(c.batch, order.size() - first);
        BOOST_TEST_CONTEXT("epoch " << epoch << ", batch at position " << first) {
          BOOST_TEST(info.epoch == epoch);
          BOOST_TEST(info.first_position == first);
          BOOST_TEST_REQUIRE(info.rows == rows);
          BOOST_TEST(info.padded_rows == (c.last == data::last_batch::pad ? c.batch : rows));
          for (std::size_t r = 0; r < rows; ++r) BOOST_TEST(info.indices[r] == order[first + r]);
        }
        expect e{epoch, first, {}};
        for (std::size_t r = 0; r < info.padded_rows; ++r)
          e.rows_of.push_back(order[first + r % rows]);
        expected.push_back(std::move(e));
        // The step: slow work, then read the batch (snapshot m).
        spin<<<1, 1, 0, stream>>>(c.spin_ns);
        hone::check_last_launch("spin kernel");
        launch_snapshot(values, info.padded_rows * width, snap_v.data() + m * c.batch * width,
                        stream);
        launch_snapshot(labels, info.padded_rows, snap_l.data() + m * c.batch, stream);
        HONE_CUDA_CHECK(cudaEventRecord(step_done[m % 2], stream));
        first += rows;
        ++m;
      }
      BOOST_TEST(first == (c.last == data::last_batch::drop ? c.n / c.batch * c.batch : c.n),
                 "epoch " << epoch << " ended after " << first << " positions");
    }
    out.batches = m;
    HONE_CUDA_CHECK(cudaStreamSynchronize(stream));  // before the loader's batches go away
  }
  HONE_CUDA_CHECK(cudaEventDestroy(step_done[0]));
  HONE_CUDA_CHECK(cudaEventDestroy(step_done[1]));
  HONE_CUDA_CHECK(cudaStreamDestroy(stream));

  std::vector<std::uint32_t> got_v(snap_v.size());
  std::vector<double> got_l(snap_l.size());
  HONE_CUDA_CHECK(
      cudaMemcpy(got_v.data(), snap_v.data(), snap_v.size_bytes(), cudaMemcpyDeviceToHost));
  HONE_CUDA_CHECK(
      cudaMemcpy(got_l.data(), snap_l.data(), snap_l.size_bytes(), cudaMemcpyDeviceToHost));
  for (std::size_t k = 0; k < expected.size(); ++k) {
    const expect& e = expected[k];
    std::string why;
    for (std::size_t r = 0; r < e.rows_of.size() && why.empty(); ++r) {
      const std::uint64_t i = e.rows_of[r];
      const std::uint32_t* row = got_v.data() + (k * c.batch + r) * width;
      for (std::size_t col = 0; col < width && why.empty(); ++col) {
        if (row[col] != value(i, col)) {
          std::ostringstream s;
          s << "batch " << k << " (epoch " << e.epoch << ", position " << e.first << "), row " << r
            << ", column " << col << ": device " << row[col] << ", expected " << value(i, col)
            << " (record " << i << "; the device row holds record " << row[0]
            << " - a different record means the pinned batch was refilled before its copy ran)";
          why = s.str();
        }
      }
      if (why.empty() && got_l[k * c.batch + r] != label(i)) {
        std::ostringstream s;
        s << "batch " << k << ", row " << r << ": label " << got_l[k * c.batch + r] << ", expected "
          << label(i) << " (record " << i << ")";
        why = s.str();
      }
    }
    if (!why.empty()) {
      if (out.bad_batches++ == 0) out.first_bad = why;
    }
  }
  return out;
}
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(gpu_fixture);

BOOST_AUTO_TEST_CASE(batches_on_the_device_equal_the_oracle) {
  BOOST_TEST_REQUIRE(hone::space_traits<hone::pinned_host_space>::pinned(),
                     "pinned_host_space is not page-locked in a CUDA program");
  std::vector<config> configs;
  configs.push_back({});                                                  // threads 2, ring 2
  configs.push_back({.threads = 0, .prefetch = 1});                       // consumer fills
  configs.push_back({.threads = 1, .prefetch = 1, .device_buffers = 3});  // the shortest host ring
  configs.push_back(
      {.threads = 2, .prefetch = 4, .device_buffers = 4, .last = data::last_batch::pad});
  configs.push_back({.threads = 1, .prefetch = 2, .last = data::last_batch::drop});
  configs.push_back({.n = 64, .batch = 8, .threads = 2, .prefetch = 3});  // no short batch
  for (const config& c : configs) {
    BOOST_TEST_CONTEXT(c) {
      const outcome o = run(c);
      BOOST_TEST_MESSAGE(c << ": " << o.batches << " batches, next() returned during the "
                           << "previous step " << o.overlapped << " times");
      BOOST_TEST(o.bad_batches == 0u, o.bad_batches << " of " << o.batches
                                                    << " device batches differ from the oracle; "
                                                       "first: "
                                                    << o.first_bad);
      // next() waits only for the copy queued behind the step before the previous one.
      BOOST_TEST(o.overlapped * 2 >= o.batches,
                 "next() returned while the previous step was still running for only "
                     << o.overlapped << " of " << o.batches
                     << " batches: the stager blocks the host more than one step");
    }
  }
}

BOOST_AUTO_TEST_CASE(negative_control_without_the_event_wait_is_caught) {
  // The same run with copies that do not wait for their event before the loader refills the
  // pinned batch (threads 1, prefetch 1: a ring of two pinned batches): the snapshots must show
  // bytes of later batches, else this test could not tell a waiting stager from a broken one.
  const config c{.threads = 1, .prefetch = 1, .control = true};
  const outcome o = run(c);
  BOOST_TEST_MESSAGE("negative control: " << o.bad_batches << " of " << o.batches
                                          << " batches overwritten; first: " << o.first_bad);
  BOOST_TEST(o.bad_batches > 0u,
             "the negative control saw no overwritten batch: the slow kernels did not hold the "
             "copies back, so the main test cannot show that the stager waits for its events");
}

BOOST_AUTO_TEST_CASE(zero_bytes_and_empty_dataset) {
  cudaStream_t stream = nullptr;
  HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    // Only fields of 0 bytes: nothing is copied, the batches still come with their info.
    data::batch_layout l(4);
    l.add<float>("a", 0).add<std::int64_t>("b", 0);
    BOOST_TEST(l.bytes() == 0u);
    const records ds{10};
    auto ignore = [](data::pinned_batch&, std::size_t, const std::vector<std::uint32_t>&) {};
    data::loader ld(ds, data::pinned_batch(l), ignore, {.batch_size = 4, .threads = 1});
    data::cuda_stager st(ld, l, stream);
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<std::size_t> rows;
      while (const data::device_batch* b = st.next()) {
        rows.push_back(b->info.rows);
        BOOST_TEST(b->field<float>(0).empty());
        BOOST_TEST(b->field<std::int64_t>("b").data() == nullptr);
      }
      BOOST_TEST(rows == (std::vector<std::size_t>{4, 4, 2}), "epoch " << epoch);
    }
  }
  {
    // An empty dataset: next() ends every epoch at once.
    const records ds{0};
    const data::batch_layout l = make_layout(4);
    data::loader ld(ds, data::pinned_batch(l), collate{}, {.batch_size = 4, .threads = 2});
    data::cuda_stager st(ld, l, stream);
    BOOST_TEST(st.next() == nullptr);
    BOOST_TEST(st.next() == nullptr);
  }
  HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
  HONE_CUDA_CHECK(cudaStreamDestroy(stream));
}

BOOST_AUTO_TEST_CASE(sizes_that_do_not_fit_are_refused) {
  cudaStream_t stream = nullptr;
  HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const records ds{20};
  const auto says = [](const char* text) {
    return [text](const hone::config_error& e) {
      const bool ok = std::string(e.what()).find(text) != std::string::npos;
      if (!ok) BOOST_TEST_MESSAGE("the message was: " << e.what());
      return ok;
    };
  };
  {
    const data::batch_layout l = make_layout(8);
    data::loader ld(ds, data::pinned_batch(l), collate{}, {.batch_size = 8, .threads = 1});
    // A ring of one device buffer.
    BOOST_CHECK_EXCEPTION(data::cuda_stager(ld, l, stream, {.device_buffers = 1}),
                          hone::config_error, says("device_buffers is 1; at least 2"));
    // Blocks of fewer rows than the loader's batch_size.
    BOOST_CHECK_EXCEPTION(data::cuda_stager(ld, make_layout(4), stream), hone::config_error,
                          says("the layout holds 4 rows but the loader's batch_size is 8"));
    // A stager built for narrower rows than the loader's batches.
    data::cuda_stager st(ld, make_layout(8, width - 1), stream);
    BOOST_CHECK_EXCEPTION(
        (void)st.next(), hone::config_error,
        says("its field 0 ('values') has 37 elements of 4 bytes per row, the stager's ('values') "
             "36 elements of 4 bytes"));
  }
  {
    // Reading a field as a type of another size.
    const data::batch_layout l = make_layout(8);
    data::loader ld(ds, data::pinned_batch(l), collate{}, {.batch_size = 8, .threads = 1});
    data::cuda_stager st(ld, l, stream);
    const data::device_batch* b = st.next();
    BOOST_TEST_REQUIRE(b != nullptr);
    BOOST_CHECK_EXCEPTION((void)b->field<double>(0), hone::config_error,
                          says("holds elements of 4 bytes, read here as a type of 8 bytes"));
    BOOST_CHECK_EXCEPTION((void)b->field<double>("labels"), hone::config_error,
                          says("no field is named 'labels'; the fields are 'values', 'nothing', "
                               "'label'"));
  }
  HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
  HONE_CUDA_CHECK(cudaStreamDestroy(stream));
}

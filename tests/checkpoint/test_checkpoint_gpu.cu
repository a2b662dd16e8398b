// GPU test (label gpu) of checkpoints from device memory (hone/checkpoint/cuda/snapshot.cuh):
//  - device tensors (an arena, a bf16 tensor widened to F32, an F32 tensor exported as BF16, an
//    I64 tensor) saved through the async writer give files whose bytes equal the device data
//    copied back with cudaMemcpy (the conversions against a scalar round-to-nearest-even written
//    here); the arena's slots are one cudaMemcpyAsync; overwriting the device tensors right after
//    save() returns (training goes on) does not change the files;
//  - the staging buffer is page-locked (cudaPointerGetAttributes: cudaMemoryTypeHost, where a
//    host-only snapshot's is unregistered) and is the same buffer in the next save;
//  - bad records are refused with config_error before anything is copied;
//  - a CUDA trainer saved through the async writer (capture) and restored into a fresh trainer
//    (restore) trains on bit-identically to the run that never stopped: fp32 AdamW (master
//    weights bound zero-copy), bf16 SGD with momentum, fp16 with a dynamic loss scale and
//    injected infs before and after the save;
//  - the files of a CUDA trainer are the host trainer's: a host checkpoint restores into the CUDA
//    trainer bit for bit, and capturing it again gives the same tensor bytes;
//  - the every_n_steps policy checkpoints a CUDA trainer (capture chosen by its constraint);
//  - a CUDA trainer with the offload role (master weights and state in host memory, saved by the
//    host capture) checkpoints through every_n_steps, and its checkpoint resumes bit for bit both
//    in a fresh offloaded trainer and in the plain CUDA trainer.
// Exits 77 (skipped) when no CUDA device is present.
#define BOOST_TEST_MODULE hone_checkpoint_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <hone/checkpoint/cuda/snapshot.cuh>
#include <hone/checkpoint/policy.hpp>
#include <hone/checkpoint/trainer_checkpoint.hpp>
#include <hone/checkpoint/writer.hpp>
#include <hone/core/arena.hpp>
#include <hone/core/bfloat16.hpp>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <hone/core/cuda/math_mode.cuh>
#include <hone/offload/optimizer_to_host.hpp>
#include <hone/optim/sgd.hpp>
#include <hone/train/cuda/trainer.cuh>
#include <hone/train/trainer.hpp>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../support/gpu.hpp"
#include "../support/linear_model.hpp"
#include "../support/temp_dir.hpp"

namespace fs = std::filesystem;
namespace ck = hone::checkpoint;
namespace io = hone::io;

namespace {
struct gpu_fixture {
  gpu_fixture() {
    hone::test::skip_without_gpu();
    hone::require_ieee_device_math(
        "tests/checkpoint/test_checkpoint_gpu.cu");  // it compares device and host bits
  }
};

using temp_root = hone_test::temp_dir;

template <class T>
std::vector<T> download(const T* p, std::size_t n) {
  std::vector<T> h(n);
  if (n != 0) {
    HONE_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  return h;
}
template <class T>
void upload(T* p, const std::vector<T>& h) {
  if (!h.empty()) {
    HONE_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
}
template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// The raw bytes of tensor `name` in tensor file `path`.
std::vector<std::byte> file_bytes(const fs::path& path, const std::string& name) {
  const ck::tensor_file f = ck::tensor_file::open(path);
  const ck::tensor_info& t = f.at(name);
  std::vector<std::byte> out(static_cast<std::size_t>(t.size_bytes()));
  f.read(t, out);
  return out;
}

/// F32 -> BF16 by round to nearest even on the bits, written independently of hone (finite
/// values only, which is what the test feeds).
std::uint16_t reference_bf16(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  const std::uint32_t lsb = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16);
}

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Device tensors of every kind the device snapshot handles.
struct device_tensors {
  hone::arena_layout layout{sizeof(float)};
  hone::arena<float, hone::cuda_space> moments;
  hone::buffer<hone::bfloat16, hone::cuda_space> half_precision{37};
  hone::buffer<float, hone::cuda_space> exported{50};
  hone::buffer<std::int64_t, hone::cuda_space> ids{13};
  hone::buffer<float, hone::cuda_space> empty{};

  device_tensors() {
    layout.add("a", 29);  // 29 floats: the next slot starts after 12 bytes of padding
    layout.add("b", 1);
    layout.add("c", 100);
    moments = hone::arena<float, hone::cuda_space>(layout);
  }
  /// Fills every tensor with values that depend on `seed`.
  void fill(unsigned seed) {
    for (std::size_t i = 0; i < layout.size(); ++i) {
      upload(moments.view(i).data(),
             random_floats(layout[i].count, seed + static_cast<unsigned>(i)));
    }
    std::vector<hone::bfloat16> h;
    for (float f : random_floats(half_precision.size(), seed + 10)) h.emplace_back(f);
    upload(half_precision.data(), h);
    upload(exported.data(), random_floats(exported.size(), seed + 11));
    std::vector<std::int64_t> i64(ids.size());
    for (std::size_t i = 0; i < i64.size(); ++i) {
      i64[i] = static_cast<std::int64_t>(seed) * 1000003 - static_cast<std::int64_t>(i * i * 7919);
    }
    upload(ids.data(), i64);
  }
  /// Records everything into `d`; returns the number of copies finish() must issue.
  std::size_t record(ck::device_snapshot& d) {
    d.add_arena(ck::files::optimizer, "exp_avg.", moments);  // one copy for three slots
    d.add(ck::files::weights, "half", {half_precision.size()}, half_precision.view(),
          io::dtype::f32);                                                             // widened
    d.add(ck::files::weights, "exported", {5, 10}, exported.view(), io::dtype::bf16);  // narrowed
    d.add(ck::files::weights, "ids", {ids.size()}, ids.view());                        // as is
    d.add(ck::files::weights, "empty", {0}, empty.view());                             // no copy
    return 4;
  }
  /// Every file tensor of the checkpoint `dir` against the device data copied back now.
  void check_files(const fs::path& dir) {
    const fs::path opt = dir / ck::files::optimizer;
    const fs::path w = dir / ck::files::weights;
    for (std::size_t i = 0; i < layout.size(); ++i) {
      BOOST_TEST_CONTEXT("slot " << layout[i].name) {
        BOOST_TEST((file_bytes(opt, "exp_avg." + layout[i].name) ==
                    bytes_of(download(moments.view(i).data(), layout[i].count))));
      }
    }
    std::vector<float> widened;
    for (hone::bfloat16 b : download(half_precision.data(), half_precision.size())) {
      std::uint16_t bits = 0;
      std::memcpy(&bits, &b, 2);
      const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;  // exact widening
      float f = 0;
      std::memcpy(&f, &u, 4);
      widened.push_back(f);
    }
    BOOST_TEST((file_bytes(w, "half") == bytes_of(widened)));
    std::vector<std::uint16_t> narrowed;
    for (float f : download(exported.data(), exported.size()))
      narrowed.push_back(reference_bf16(f));
    BOOST_TEST((file_bytes(w, "exported") == bytes_of(narrowed)));
    BOOST_TEST((file_bytes(w, "ids") == bytes_of(download(ids.data(), ids.size()))));
    BOOST_TEST(file_bytes(w, "empty").empty());
    const ck::tensor_file f = ck::tensor_file::open(w);
    BOOST_TEST((f.at("exported").shape == ck::shape_type{5, 10}));
    BOOST_TEST((f.at("exported").type == io::dtype::bf16));
    BOOST_TEST((f.at("half").type == io::dtype::f32));
    BOOST_TEST((f.at("ids").type == io::dtype::i64));
  }
};

cudaMemoryType memory_type(const void* p) {
  cudaPointerAttributes a{};
  HONE_CUDA_CHECK(cudaPointerGetAttributes(&a, p));
  return a.type;
}

// ---- a linear regression whose forward/backward runs on the host, tensors on the device ----

/// The same model with its tensors in two device arenas (values, gradients): with fp32 weights the
/// CUDA trainer binds them as its master weights (zero copy).
template <class T>
struct device_linear {
  std::size_t dim;
  hone::arena_layout layout{sizeof(T)};
  hone::arena<T, hone::cuda_space> values, grads;
  float nan_in_grad = 0;  // passed to the host twin (fault injection)
  explicit device_linear(std::size_t d) : dim(d) {
    layout.add("w", d);
    layout.add("bias", 1);
    values = hone::arena<T, hone::cuda_space>(layout);
    grads = hone::arena<T, hone::cuda_space>(layout);
    linear<T> init(d);
    upload(w(), init.w);
    upload(b(), init.b);
  }
  T* w() { return values.view(0).data(); }
  T* b() { return values.view(1).data(); }
  std::vector<hone::parameter<T, hone::cuda_space>> parameters() {
    return {{"w", {dim}, values.view(0), grads.view(0)},
            {"bias", {1}, values.view(1), grads.view(1)}};
  }
  float forward_backward(const batch& bt, float scale) {
    linear<T> m(dim);
    m.w = download(w(), dim);
    m.b = download(b(), 1);
    m.nan_in_grad = nan_in_grad;
    const float loss = m.forward_backward(bt, scale);
    upload(grads.view(0).data(), m.gw);
    upload(grads.view(1).data(), m.gb);
    return loss;
  }
};

constexpr std::size_t dim = 29;

std::vector<batch> batches_of(int step) {
  return {make_batch(6, dim, static_cast<unsigned>(300 + 2 * step)),
          make_batch(10, dim, static_cast<unsigned>(301 + 2 * step))};
}

/// Everything a device trainer's future depends on, copied to the host.
template <class Trainer, class Model>
struct device_state {
  std::vector<float> master;
  std::vector<std::vector<std::byte>> optimizer;
  std::vector<std::byte> working;
  std::uint64_t steps = 0;

  device_state(Trainer& t, Model& m) {
    master = download(t.master_weights().data(), t.layout().total());
    t.optimizer_state().for_each_tensor([&](std::string_view, const auto& a) {
      optimizer.push_back(bytes_of(download(a.all().data(), a.all().size())));
    });
    working = bytes_of(download(m.w(), m.dim));
    const auto bias = bytes_of(download(m.b(), 1));
    working.insert(working.end(), bias.begin(), bias.end());
    steps = t.steps_done();
  }
};

/// Trains `before` steps, saves through the async writer, trains `after` more (during the
/// write); a fresh trainer restored from the checkpoint must then train the same `after` steps
/// bit for bit. Infs are injected at the steps in `poison`.
template <class T, class... Policies>
void check_resume(int before, int after, std::vector<int> poison, Policies... policies) {
  temp_root root;
  device_linear<T> am(dim);
  hone::trainer a(am, policies...);
  static_assert(ck::device_trainer<decltype(a)>);
  BOOST_TEST((a.zero_copy() == std::is_same_v<T, float>));
  const auto run_step = [&](auto& t, auto& m, int s) {
    m.nan_in_grad = std::find(poison.begin(), poison.end(), s) != poison.end()
                        ? std::numeric_limits<float>::infinity()
                        : 0.0f;
    const std::vector<batch> parts = batches_of(s);
    return t.step(std::span<const batch>(parts));
  };
  for (int s = 0; s < before; ++s) (void)run_step(a, am, s);
  const auto scaler_at_save = a.scaler().state();
  const std::vector<float> master_at_save = download(a.master_weights().data(), a.layout().total());

  ck::checkpoint_writer w({.root = root.path, .async = true, .sync = false});
  ck::training_state extra;
  extra.data.set("cursor", static_cast<std::uint64_t>(before));
  BOOST_TEST(w.save(a.steps_done(), [&](ck::snapshot& s) { ck::capture(a, s, extra); }));
  std::vector<hone::step_report> live;
  for (int s = before; s < before + after; ++s) live.push_back(run_step(a, am, s));
  w.wait();
  const device_state<decltype(a), device_linear<T>> want(a, am);

  const fs::path dir = *w.last_committed();
  BOOST_TEST(ck::verify_directory(dir, true).ok());
  {
    const ck::tensor_file f = ck::tensor_file::open(dir / ck::files::weights);
    for (const auto& slot : a.layout().slots()) {
      std::vector<float> saved(slot.count);
      f.read_into(slot.name, std::span<float>(saved));
      const std::vector<float> at_save(
          master_at_save.begin() + static_cast<long>(slot.offset),
          master_at_save.begin() + static_cast<long>(slot.offset + slot.count));
      BOOST_TEST_CONTEXT("master weights of " << slot.name << " at the save") {
        BOOST_TEST(same_bits(saved, at_save));
      }
    }
  }

  device_linear<T> bm(dim);
  hone::trainer b(bm, policies...);
  const ck::training_state st = ck::restore(b, dir);
  BOOST_TEST(st.data.at("cursor").as_u64() == static_cast<std::uint64_t>(before));
  BOOST_TEST(b.steps_done() == st.step);
  BOOST_TEST((b.scaler().state() == scaler_at_save));
  for (int s = before; s < before + after; ++s) {
    const hone::step_report r = run_step(b, bm, s);
    const hone::step_report& l = live[static_cast<std::size_t>(s - before)];
    BOOST_TEST_CONTEXT("step " << s) {
      BOOST_TEST(r.skipped == l.skipped);
      BOOST_TEST(r.step == l.step);
      BOOST_TEST(r.loss_scale == l.loss_scale);
      BOOST_TEST(std::memcmp(&r.loss, &l.loss, sizeof(float)) == 0);
    }
  }
  const device_state<decltype(b), device_linear<T>> got(b, bm);
  BOOST_TEST(same_bits(got.master, want.master));
  BOOST_TEST(got.optimizer.size() == want.optimizer.size());
  for (std::size_t i = 0; i < got.optimizer.size() && i < want.optimizer.size(); ++i) {
    BOOST_TEST_CONTEXT("optimizer arena " << i) {
      BOOST_TEST((got.optimizer[i] == want.optimizer[i]));
    }
  }
  BOOST_TEST((got.working == want.working));
  BOOST_TEST(got.steps == want.steps);
  BOOST_TEST((b.scaler().state() == a.scaler().state()));
}
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(gpu_fixture);

BOOST_AUTO_TEST_CASE(device_tensors_saved_async_equal_the_device_bytes) {
  temp_root root;
  device_tensors dt;
  dt.fill(1);
  cudaStream_t stream = nullptr;
  HONE_CUDA_CHECK(cudaStreamCreate(&stream));
  ck::checkpoint_writer w({.root = root.path, .async = true, .sync = false});
  std::size_t copies = 0, expected_copies = 0;
  BOOST_TEST(w.save(1, [&](ck::snapshot& s) {
    ck::device_snapshot d(s, stream);
    expected_copies = dt.record(d);
    // pending() counts tensors: the arena's three slots, half, exported, ids and empty (the
    // copies finish() issues are fewer: record's count).
    BOOST_TEST(d.pending() == 7u);
    d.finish();
    BOOST_TEST(d.pending() == 0u);
    copies = d.last_copies();
    s.state.step = 1;
  }));
  // Training goes on while the files are written: the snapshot owns its bytes.
  const std::vector<std::byte> ids_at_save = bytes_of(download(dt.ids.data(), dt.ids.size()));
  device_tensors keep;  // the values at the save, for the comparison below
  keep.fill(1);
  HONE_CUDA_CHECK(
      cudaMemsetAsync(dt.moments.all().data(), 0xff, dt.moments.all().size_bytes(), stream));
  HONE_CUDA_CHECK(cudaMemsetAsync(dt.ids.data(), 0x5a, dt.ids.size_bytes(), stream));
  HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
  w.wait();
  BOOST_TEST(copies == expected_copies);
  BOOST_TEST(w.saves_committed() == 1u);
  const fs::path dir = *w.last_committed();
  BOOST_TEST(ck::verify_directory(dir, true).ok());
  keep.check_files(dir);
  BOOST_TEST((file_bytes(dir / ck::files::weights, "ids") == ids_at_save));
  BOOST_TEST((file_bytes(dir / ck::files::weights, "ids") !=
              bytes_of(download(dt.ids.data(), dt.ids.size()))));
  HONE_CUDA_CHECK(cudaStreamDestroy(stream));
}

BOOST_AUTO_TEST_CASE(staging_is_pinned_and_reused_across_saves) {
  temp_root root;
  ck::snapshot host_only;
  const std::vector<float> v(100, 1.5f);
  host_only.add(ck::files::weights, "v", {100}, v);
  BOOST_TEST(!host_only.allocator().page_locked);
  BOOST_TEST(memory_type(host_only.staging_data()) == cudaMemoryTypeUnregistered);

  device_tensors dt;
  ck::checkpoint_writer w({.root = root.path, .async = true, .sync = false});
  const std::byte* first = nullptr;
  std::size_t capacity = 0;
  for (unsigned save = 1; save <= 3; ++save) {
    dt.fill(10 * save);
    BOOST_TEST(w.save(save, [&](ck::snapshot& s) {
      ck::device_snapshot d(s);  // the legacy default stream
      (void)dt.record(d);
      d.finish();
      s.state.step = save;
    }));
    w.wait();
    BOOST_TEST_CONTEXT("save " << save) {
      const ck::snapshot& s = w.staging();
      BOOST_TEST(s.allocator().page_locked);
      BOOST_TEST(memory_type(s.staging_data()) == cudaMemoryTypeHost);
      if (save == 1) {
        first = s.staging_data();
        capacity = s.capacity();
        BOOST_TEST(capacity >= s.bytes());
      } else {
        BOOST_TEST(static_cast<const void*>(s.staging_data()) == static_cast<const void*>(first));
        BOOST_TEST(s.capacity() == capacity);
      }
      dt.check_files(*w.last_committed());  // the new values, not the first save's
    }
  }
  BOOST_TEST(w.saves_committed() == 3u);
}

BOOST_AUTO_TEST_CASE(bad_records_are_refused_before_copying) {
  ck::snapshot s;
  ck::device_snapshot d(s);
  hone::buffer<float, hone::cuda_space> x(8);
  hone::buffer<std::uint8_t, hone::cuda_space> u(8);
  BOOST_CHECK_THROW(d.add(ck::files::weights, "x", {3, 3}, x.view()), hone::config_error);
  BOOST_CHECK_THROW(d.add(ck::files::state, "x", {8}, x.view()), hone::config_error);
  BOOST_CHECK_THROW(d.add(ck::files::weights, "u", {8}, u.view(), io::dtype::f32),
                    hone::config_error);
  BOOST_CHECK_THROW(
      d.add_bytes(ck::files::weights, "n", io::dtype::f32, io::dtype::f32, {2}, nullptr, 8),
      hone::config_error);
  BOOST_TEST(d.pending() == 0u);
  d.finish();
  BOOST_TEST(d.last_copies() == 0u);
  BOOST_TEST(s.bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(fp32_adamw_zero_copy_resumes_bitwise) {
  check_resume<float>(4, 3, {}, hone::fp32{}, hone::adamw{.weight_decay = 0.1f},
                      hone::accumulate::steps<2>{}, hone::constant_lr{.base_lr = 0.01});
}

BOOST_AUTO_TEST_CASE(bf16_sgd_momentum_resumes_bitwise) {
  check_resume<hone::bfloat16>(5, 4, {}, hone::bf16_mixed{},
                               hone::sgd{.momentum = 0.9f, .weight_decay = 0.01f},
                               hone::accumulate::steps<2>{}, hone::constant_lr{.base_lr = 0.05});
}

BOOST_AUTO_TEST_CASE(fp16_dynamic_scale_with_infs_resumes_bitwise) {
  check_resume<hone::half>(
      5, 5, {2, 7}, hone::fp16_mixed<>{.scaler = {.init_scale = 1024, .growth_interval = 2}},
      hone::adamw{}, hone::accumulate::steps<2>{}, hone::constant_lr{.base_lr = 0.01});
}

BOOST_AUTO_TEST_CASE(host_checkpoint_restores_into_the_cuda_trainer) {
  temp_root root;
  linear<float> hm(dim);
  hone::trainer ht(hm, hone::fp32{}, hone::adamw{}, hone::accumulate::steps<2>{},
                   hone::constant_lr{.base_lr = 0.01});
  for (int s = 0; s < 3; ++s) {
    const std::vector<batch> parts = batches_of(s);
    (void)ht.step(std::span<const batch>(parts));
  }
  fs::create_directories(root.path / "host");
  fs::create_directories(root.path / "device");
  ck::snapshot hs;
  ck::capture(ht, hs);
  const fs::path host_dir = ck::write_snapshot(root.path / "host", ht.steps_done(), hs,
                                               {.compression = std::nullopt, .sync = false});

  device_linear<float> dm(dim);
  hone::trainer dt(dm, hone::fp32{}, hone::adamw{}, hone::accumulate::steps<2>{},
                   hone::constant_lr{.base_lr = 0.01});
  (void)ck::restore(dt, host_dir);
  BOOST_TEST(dt.steps_done() == ht.steps_done());
  const std::span<const float> hmaster = ht.master_weights();
  BOOST_TEST(same_bits(download(dt.master_weights().data(), dt.layout().total()),
                       std::vector<float>(hmaster.begin(), hmaster.end())));

  ck::snapshot ds;
  ck::capture(dt, ds);
  const fs::path dev_dir = ck::write_snapshot(root.path / "device", dt.steps_done(), ds,
                                              {.compression = std::nullopt, .sync = false});
  for (const std::string_view file : {ck::files::weights, ck::files::optimizer}) {
    const ck::tensor_file hf = ck::tensor_file::open(host_dir / file);
    for (const ck::tensor_info& t : hf.tensors()) {
      BOOST_TEST_CONTEXT(file << " " << t.name) {
        BOOST_TEST((file_bytes(dev_dir / file, t.name) == file_bytes(host_dir / file, t.name)));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(every_n_steps_policy_checkpoints_a_cuda_trainer) {
  temp_root root;
  device_linear<float> m(dim);
  hone::trainer t(
      m, hone::fp32{}, hone::adamw{}, hone::accumulate::steps<2>{},
      hone::constant_lr{.base_lr = 0.01},
      ck::every_n_steps{.root = root.path, .every = 2, .writer = {.async = true, .sync = false}});
  std::vector<float> master_at_4;
  for (int s = 0; s < 5; ++s) {
    const std::vector<batch> parts = batches_of(s);
    (void)t.step(std::span<const batch>(parts));
    if (t.steps_done() == 4) master_at_4 = download(t.master_weights().data(), t.layout().total());
  }
  t.checkpointer().wait();
  BOOST_TEST(t.checkpointer().writer().saves_committed() == 2u);
  const auto newest = ck::newest_valid(root.path);
  BOOST_REQUIRE(newest.has_value());
  BOOST_TEST(newest->path.filename().string() == "step-000000004");
  device_linear<float> fresh(dim);
  hone::trainer r(fresh, hone::fp32{}, hone::adamw{}, hone::accumulate::steps<2>{},
                  hone::constant_lr{.base_lr = 0.01});
  (void)ck::restore(r, newest->path);
  BOOST_TEST(r.steps_done() == 4u);
  BOOST_TEST(same_bits(download(r.master_weights().data(), r.layout().total()), master_at_4));
}

BOOST_AUTO_TEST_CASE(offloaded_cuda_trainer_checkpoints_and_resumes_bitwise) {
  using T = hone::bfloat16;
  temp_root root;
  const hone::offload::optimizer_to_host off{.bucket_bytes = 40};  // buckets inside "w"
  auto run = [](auto& t, int s) {
    const std::vector<batch> parts = batches_of(s);
    return t.step(std::span<const batch>(parts));
  };
  device_linear<T> am(dim);
  hone::trainer a(
      am, hone::bf16_mixed{}, hone::adamw{.weight_decay = 0.01f}, hone::accumulate::steps<2>{},
      hone::constant_lr{.base_lr = 0.01}, off,
      ck::every_n_steps{.root = root.path, .every = 3, .writer = {.async = true, .sync = false}});
  static_assert(decltype(a)::offloaded);
  static_assert(!ck::device_trainer<decltype(a)>);
  std::vector<hone::step_report> live;
  for (int s = 0; s < 7; ++s) {
    const auto r = run(a, s);
    if (s >= 3) live.push_back(r);
  }
  a.checkpointer().wait();
  const auto newest_at_3 = root.path / "step-000000003";
  BOOST_REQUIRE(ck::verify_directory(newest_at_3, true).ok());
  const std::span<float> a_master = a.master_weights();
  const std::vector<float> want_master(a_master.begin(), a_master.end());
  std::vector<std::vector<float>> want_state;
  a.optimizer_state().for_each_tensor([&](std::string_view, const auto& arena) {
    want_state.emplace_back(arena.all().begin(), arena.all().end());
  });
  const auto want_w = download(am.w(), dim);

  auto check_resumed = [&](auto& t, device_linear<T>& m, bool offloaded) {
    BOOST_TEST_CONTEXT("restored into the " << (offloaded ? "offloaded" : "plain") << " trainer") {
      (void)ck::restore(t, newest_at_3);
      BOOST_TEST(t.steps_done() == 3u);
      for (int s = 3; s < 7; ++s) {
        const auto r = run(t, s);
        const auto& l = live[static_cast<std::size_t>(s - 3)];
        BOOST_TEST(std::memcmp(&r.loss, &l.loss, sizeof(float)) == 0, "loss at step " << s);
        BOOST_TEST(r.step == l.step);
      }
      std::vector<float> master;
      std::vector<std::vector<float>> state;
      if constexpr (std::remove_reference_t<decltype(t)>::offloaded) {
        const std::span<float> mm = t.master_weights();
        master.assign(mm.begin(), mm.end());
        t.optimizer_state().for_each_tensor([&](std::string_view, const auto& arena) {
          state.emplace_back(arena.all().begin(), arena.all().end());
        });
      } else {
        master = download(t.master_weights().data(), t.layout().total());
        t.optimizer_state().for_each_tensor([&](std::string_view, const auto& arena) {
          state.push_back(download(arena.all().data(), arena.all().size()));
        });
      }
      BOOST_TEST(same_bits(master, want_master), "master weights");
      BOOST_TEST(state.size() == want_state.size());
      for (std::size_t i = 0; i < state.size() && i < want_state.size(); ++i) {
        BOOST_TEST(same_bits(state[i], want_state[i]), "optimizer tensor " << i);
      }
      BOOST_TEST(same_bits(download(m.w(), dim), want_w), "working weights");
    }
  };
  device_linear<T> bm(dim);
  hone::trainer b(bm, hone::bf16_mixed{}, hone::adamw{.weight_decay = 0.01f},
                  hone::accumulate::steps<2>{}, hone::constant_lr{.base_lr = 0.01}, off);
  check_resumed(b, bm, true);
  device_linear<T> cm(dim);
  hone::trainer c(cm, hone::bf16_mixed{}, hone::adamw{.weight_decay = 0.01f},
                  hone::accumulate::steps<2>{}, hone::constant_lr{.base_lr = 0.01});
  check_resumed(c, cm, false);
}

// A CUDA restore stages through two bounded pinned buffers: with 24-byte buffers every tensor
// crosses many chunk boundaries (6 floats each, odd tensor sizes), and the result is still the
// host checkpoint's bits while no staging buffer grows past the bound.
BOOST_AUTO_TEST_CASE(device_restore_stages_through_bounded_pinned_buffers) {
  temp_root root;
  linear<float> hm(dim);
  hone::trainer ht(hm, hone::fp32{}, hone::adamw{}, hone::accumulate::steps<2>{},
                   hone::constant_lr{.base_lr = 0.01});
  for (int s = 0; s < 2; ++s) {
    const std::vector<batch> parts = batches_of(s);
    (void)ht.step(std::span<const batch>(parts));
  }
  ck::snapshot hs;
  ck::capture(ht, hs);
  const fs::path dir = ck::write_snapshot(root.path, ht.steps_done(), hs,
                                          {.compression = std::nullopt, .sync = false});
  device_linear<float> dm(dim);
  hone::trainer dt(dm, hone::fp32{}, hone::adamw{}, hone::accumulate::steps<2>{},
                   hone::constant_lr{.base_lr = 0.01});
  const ck::tensor_file weights = ck::tensor_file::open(dir / ck::files::weights);
  const ck::tensor_file optimizer = ck::tensor_file::open(dir / ck::files::optimizer);
  ck::detail::trainer_loader<true> load(dt, 24);
  const auto master = dt.master_weights();
  for (std::size_t i = 0; i < dt.layout().size(); ++i) {
    const auto& slot = dt.layout()[i];
    load.load_weights(weights, slot.name, master.subspan(slot.offset, slot.count));
  }
  dt.optimizer_state().for_each_tensor([&](std::string_view name, auto& a) {
    load.load_state(optimizer, a, std::string(name) + ".");
  });
  load.finish();
  BOOST_TEST(load.staging_capacity() <= 24u);
  const std::span<const float> hmaster = ht.master_weights();
  BOOST_TEST(same_bits(download(master.data(), dt.layout().total()),
                       std::vector<float>(hmaster.begin(), hmaster.end())));
  std::vector<std::vector<float>> host_state, device_state;
  ht.optimizer_state().for_each_tensor([&](std::string_view, const auto& a) {
    host_state.emplace_back(a.all().begin(), a.all().end());
  });
  dt.optimizer_state().for_each_tensor([&](std::string_view, const auto& a) {
    device_state.push_back(download(a.all().data(), a.all().size()));
  });
  BOOST_TEST_REQUIRE(host_state.size() == device_state.size());
  for (std::size_t k = 0; k < host_state.size(); ++k) {
    BOOST_TEST(same_bits(device_state[k], host_state[k]));
  }
}

// The C++ side of qat_per_channel_interop.py: hone's per-channel activation fake quantizer
// (hone/compress/qat_activations_per_channel.hpp) and its state files (qat_checkpoint.hpp)
// against torch.ao.quantization.FakeQuantize with a per-channel observer.
//
//   qat_per_channel_interop_helper run <dir>
//     for each scenario: runs a quantizer over training-like batches with the switches toggled,
//     writes every step to <dir>/<scenario>.bin, and the quantizer's state after `save` steps to
//     <dir>/<scenario>.safetensors under the scenario's prefix (checking that hone reads it back
//     to the same state); lists "<scenario> <prefix> <save>" lines in <dir>/scenarios.txt (prefix
//     "-" for none)
//   qat_per_channel_interop_helper continue <state file> <prefix> <input> <output>
//     restores a quantizer (options, channels in <input>) from a file torch wrote
//     (safetensors.torch.save_file of a state_dict) under <prefix>, runs the batches of <input>
//     (the first with the restored switches) and writes <output>
//
// <scenario>.bin and <output>, little-endian: "HQATPC01"; i32 observer (0 moving-average, 1
// min-max); f32 averaging constant; i32 scheme (0 affine, 1 symmetric); i32 quant_min; i32
// quant_max; u32 channels; u32 inner; u32 steps; per step: u8 observer_enabled; u8
// fake_quant_enabled; u16 0; u32 n; f32 x[n]; f32 y[n]; u8 mask[n]; f32 grad_y[n]; f32 grad_x[n];
// u32 k; f32 scale[k]; i32 zero_point[k]; u32 r; f32 min_val[r]; f32 max_val[r] (after the step).
// The activation of a step is [n / (channels * inner), channels, inner].
// <input>: "HQATPI01"; the same header (through inner and steps); per step: u8 observer_enabled;
// u8 fake_quant_enabled; u16 0; u32 n; f32 x[n].
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <hone/checkpoint/tensor_file.hpp>
#include <hone/checkpoint/tensor_writer.hpp>
#include <hone/compress/qat_activations_per_channel.hpp>
#include <hone/compress/qat_checkpoint.hpp>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace hc = hone::compress;
namespace ck = hone::checkpoint;

namespace {

struct step {
  std::vector<float> x;
  bool observe = true, fake_quant = true;
};

template <class T>
void put(std::ofstream& f, T v) {
  f.write(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class T>
void put(std::ofstream& f, std::span<const T> v) {
  f.write(reinterpret_cast<const char*>(v.data()),
          static_cast<std::streamsize>(v.size() * sizeof(T)));
}

void put_header(std::ofstream& f, const char* magic, const hc::activation_fake_quant_options& o,
                std::size_t channels, std::size_t inner, std::size_t steps) {
  f.write(magic, 8);
  put<std::int32_t>(f, o.observer == hc::fake_quant_observer::minmax ? 1 : 0);
  put<float>(f, o.averaging_constant);
  put<std::int32_t>(f, o.scheme == hc::fake_quant_scheme::symmetric ? 1 : 0);
  put<std::int32_t>(f, o.quant_min);
  put<std::int32_t>(f, o.quant_max);
  put<std::uint32_t>(f, static_cast<std::uint32_t>(channels));
  put<std::uint32_t>(f, static_cast<std::uint32_t>(inner));
  put<std::uint32_t>(f, static_cast<std::uint32_t>(steps));
}

/// Runs one step (switches first unless `keep`) and writes it.
void run_step(std::ofstream& f, hc::activation_fake_quant_per_channel& fq, const step& s,
              std::size_t inner, std::mt19937& rng, bool keep) {
  if (!keep) {
    fq.enable_observer(s.observe);
    fq.enable_fake_quant(s.fake_quant);
  }
  const std::size_t n = s.x.size();
  std::vector<float> y(n), gy(n), gx(n);
  fq.forward(s.x, y, inner);
  std::vector<std::uint8_t> mask(n);
  for (std::size_t i = 0; i < n; ++i) mask[i] = fq.passes(i) ? 1 : 0;
  std::uniform_real_distribution<float> gd(0.5f, 2.0f);
  for (auto& g : gy) g = gd(rng);
  fq.backward(gy, gx);
  put<std::uint8_t>(f, fq.observer_enabled() ? 1 : 0);
  put<std::uint8_t>(f, fq.fake_quant_enabled() ? 1 : 0);
  put<std::uint16_t>(f, 0);
  put<std::uint32_t>(f, static_cast<std::uint32_t>(n));
  put<float>(f, std::span<const float>(s.x));
  put<float>(f, std::span<const float>(y));
  put<std::uint8_t>(f, std::span<const std::uint8_t>(mask));
  put<float>(f, std::span<const float>(gy));
  put<float>(f, std::span<const float>(gx));
  put<std::uint32_t>(f, static_cast<std::uint32_t>(fq.scales().size()));
  put<float>(f, fq.scales());
  put<std::int32_t>(f, fq.zero_points());
  put<std::uint32_t>(f, static_cast<std::uint32_t>(fq.min_vals().size()));
  put<float>(f, fq.min_vals());
  put<float>(f, fq.max_vals());
}

/// Training-like batches [outer, channels, inner]: per-channel means and spreads, ReLU-like
/// channels, outliers; the observer frozen for steps 20..25 (wider batches: clipping), fake
/// quantization off at 26 and 27, the observer off at 27, all on after.
std::vector<step> sequence(std::size_t channels, std::size_t inner, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<step> s;
  for (std::size_t b = 0; b < 32; ++b) {
    const std::size_t outer = b % 5 == 2 ? 1 : 1 + (b * 53) % 97;
    std::vector<float> x(outer * channels * inner);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::size_t c = (i / inner) % channels;
      std::normal_distribution<float> d(
          0.35f * static_cast<float>(c % 5) - 0.6f + 0.04f * static_cast<float>(b % 7),
          0.15f + 0.25f * static_cast<float>((c * 3 + b) % 6));
      float v = d(rng);
      if (c % 4 == 1) v = std::max(v, 0.0f);
      if (b >= 20 && b < 26) v *= 3.0f;
      x[i] = v;
    }
    if (b % 6 == 4) x[x.size() / 3] = 22.0f;
    if (b % 7 == 5) x[0] = -16.0f;
    step st{std::move(x)};
    st.observe = !(b >= 20 && b < 26) && b != 27;
    st.fake_quant = b != 26 && b != 27;
    s.push_back(std::move(st));
  }
  return s;
}

int run(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const hc::activation_fake_quant_options restricted = {.observer = hc::fake_quant_observer::minmax,
                                                        .scheme = hc::fake_quant_scheme::symmetric,
                                                        .quant_min = -127,
                                                        .quant_max = 127};
  const struct {
    const char* name;
    const char* prefix;
    hc::activation_fake_quant_options o;
    std::size_t channels, inner, save;
  } scenarios[] = {
      {"quint8_affine_moving_average_linear", "fc1.act", hc::quint8_affine_activations(), 24, 1, 9},
      {"quint8_affine_minmax_nchw", "-",
       hc::quint8_affine_activations(hc::fake_quant_observer::minmax), 6, 12, 22},
      {"qint8_symmetric_moving_average_nchw", "net.conv2.act", hc::qint8_symmetric_activations(), 5,
       9, 27},
      {"qint8_affine_moving_average_c025_linear",
       "q",
       {.averaging_constant = 0.25f, .quant_min = -128, .quant_max = 127},
       7,
       1,
       1},
      {"qint8_restricted_symmetric_minmax_linear", "r", restricted, 3, 1, 14},
      {"quint8_affine_one_channel", "one", hc::quint8_affine_activations(), 1, 1, 0},
  };
  std::ofstream list(dir / "scenarios.txt");
  unsigned seed = 500;
  for (const auto& sc : scenarios) {
    const std::vector<step> steps = sequence(sc.channels, sc.inner, seed++);
    hc::activation_fake_quant_per_channel fq(sc.channels, sc.o);
    std::ofstream f(dir / (std::string(sc.name) + ".bin"), std::ios::binary);
    put_header(f, "HQATPC01", sc.o, sc.channels, sc.inner, steps.size());
    std::mt19937 rng(seed * 7);
    const std::string prefix = std::string(sc.prefix) == "-" ? "" : sc.prefix;
    for (std::size_t k = 0; k <= steps.size(); ++k) {
      if (k == sc.save) {
        // the state before step k, with step k's switches (torch loads it and runs step k on)
        fq.enable_observer(k < steps.size() ? steps[k].observe : true);
        fq.enable_fake_quant(k < steps.size() ? steps[k].fake_quant : true);
        const hc::fake_quant_tensors t({{prefix, fq}});
        ck::tensor_writer w;
        t.add_to(w);
        const auto path = dir / (std::string(sc.name) + ".safetensors");
        ck::write_tensors(w, path);
        hc::activation_fake_quant_per_channel back(sc.channels, sc.o);
        hc::read_fake_quants(ck::tensor_file::open(path), {{prefix, back}});
        const auto a = fq.state(), b = back.state();
        if (a.scale != b.scale || a.zero_point != b.zero_point || a.min_val != b.min_val ||
            a.max_val != b.max_val || a.observations != b.observations ||
            a.observer_enabled != b.observer_enabled ||
            a.fake_quant_enabled != b.fake_quant_enabled) {
          throw std::runtime_error(std::string(sc.name) + ": the file did not read back");
        }
      }
      if (k < steps.size()) run_step(f, fq, steps[k], sc.inner, rng, false);
    }
    if (!f) throw std::runtime_error(std::string("cannot write ") + sc.name);
    list << sc.name << " " << sc.prefix << " " << sc.save << "\n";
  }
  return list ? 0 : 1;
}

template <class T>
T get(std::ifstream& f) {
  T v{};
  f.read(reinterpret_cast<char*>(&v), sizeof v);
  return v;
}

int continue_from(const std::filesystem::path& state, std::string prefix,
                  const std::filesystem::path& input, const std::filesystem::path& output) {
  if (prefix == "-") prefix.clear();
  std::ifstream in(input, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  if (std::memcmp(magic, "HQATPI01", 8) != 0) throw std::runtime_error("bad input magic");
  hc::activation_fake_quant_options o;
  o.observer = get<std::int32_t>(in) == 1 ? hc::fake_quant_observer::minmax
                                          : hc::fake_quant_observer::moving_average_minmax;
  o.averaging_constant = get<float>(in);
  o.scheme =
      get<std::int32_t>(in) == 1 ? hc::fake_quant_scheme::symmetric : hc::fake_quant_scheme::affine;
  o.quant_min = get<std::int32_t>(in);
  o.quant_max = get<std::int32_t>(in);
  const auto channels = get<std::uint32_t>(in);
  const auto inner = get<std::uint32_t>(in);
  const auto count = get<std::uint32_t>(in);
  std::vector<step> steps(count);
  for (step& s : steps) {
    s.observe = get<std::uint8_t>(in) == 1;
    s.fake_quant = get<std::uint8_t>(in) == 1;
    (void)get<std::uint16_t>(in);
    s.x.resize(get<std::uint32_t>(in));
    in.read(reinterpret_cast<char*>(s.x.data()), static_cast<std::streamsize>(s.x.size() * 4));
  }
  if (!in) throw std::runtime_error("truncated input " + input.string());
  hc::activation_fake_quant_per_channel fq(channels, o);
  hc::read_fake_quants(ck::tensor_file::open(state), {{prefix, fq}});
  if (fq.observer_enabled() != steps[0].observe || fq.fake_quant_enabled() != steps[0].fake_quant) {
    throw std::runtime_error("the restored switches are not those of the first step");
  }
  std::ofstream f(output, std::ios::binary);
  put_header(f, "HQATPC01", o, channels, inner, steps.size());
  std::mt19937 rng(99);
  for (std::size_t k = 0; k < steps.size(); ++k) run_step(f, fq, steps[k], inner, rng, k == 0);
  return f ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "run" && argc == 3) return run(argv[2]);
    if (mode == "continue" && argc == 6) return continue_from(argv[2], argv[3], argv[4], argv[5]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qat_per_channel_interop_helper: %s\n", e.what());
    return 1;
  }
  std::fprintf(
      stderr,
      "usage: qat_per_channel_interop_helper run <dir>\n"
      "       qat_per_channel_interop_helper continue <state> <prefix> <input> <output>\n");
  return 2;
}

// The C++ side of qat_activations_interop.py: runs hone's activation_fake_quant over sequences of
// batches and writes, per scenario, the inputs and everything hone computed, for the script to
// feed the same batches through torch.ao.quantization.FakeQuantize and compare.
//
//   qat_activations_interop_helper <dir>
//     writes <dir>/<scenario>.bin for each scenario and <dir>/scenarios.txt (their names)
//
// <scenario>.bin, little-endian:
//   "HQATACT1" (8 bytes); i32 observer (0 moving-average min-max, 1 min-max); f32 averaging
//   constant; i32 scheme (0 affine, 1 symmetric); i32 quant_min; i32 quant_max; u32 steps
//   per step: u8 observer_enabled; u8 fake_quant_enabled; u16 0; u32 n; f32 x[n]; f32 y[n]
//   (forward); u8 mask[n]; f32 grad_y[n] (the gradient fed to backward); f32 grad_x[n] (backward's
//   result); f32 scale; i32 zero_point; f32 observer min; f32 observer max (after the step)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <hone/compress/qat_activations.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "qat_interop_io.hpp"

namespace hc = hone::compress;

namespace {

using qat_interop::normal;
using qat_interop::step;

/// A training-like sequence: sizes from 1 to 4096, mixed sign, ReLU-like, drifting, outliers;
/// then the observer frozen, fake quantization off for a step, and both back on.
std::vector<step> training_sequence(unsigned seed) {
  std::vector<step> s;
  for (std::size_t b = 0; b < 48; ++b) {
    const std::size_t n = b == 3 ? 1 : (b % 4 == 0 ? 4096 : 1 + (b * 211) % 700);
    std::vector<float> v =
        normal(n, seed + static_cast<unsigned>(b), 0.2f * static_cast<float>(b % 5) - 0.3f,
               0.3f + 0.2f * static_cast<float>(b % 9));
    if (b % 3 == 1) {
      for (auto& x : v) x = std::max(x, 0.0f);
    }
    if (b % 13 == 6) v[n / 2] = 25.0f;
    if (b % 17 == 9) v[0] = -18.0f;
    s.push_back({std::move(v)});
  }
  for (std::size_t b = 0; b < 6; ++b) {  // frozen range, wider batches: clipping
    s.push_back({normal(999, seed + 100 + static_cast<unsigned>(b), 0.5f, 4.0f), false, true});
  }
  s.push_back({normal(300, seed + 200, 0.0f, 2.0f), true, false});  // fake quantization off
  s.push_back({normal(300, seed + 201, 0.0f, 2.0f), false, false});
  for (std::size_t b = 0; b < 4; ++b) {
    s.push_back({normal(513, seed + 300 + static_cast<unsigned>(b), 0.1f, 1.5f)});
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: qat_activations_interop_helper <dir>\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  // ties: a frozen range of scale 1 and values on .5 boundaries (round half to even, the clamps)
  std::vector<step> ties = {{{0.0f, 255.0f}}};
  ties.push_back({{2.5f, 3.5f, -0.5f, -0.6f, 255.4f, 255.5f, 254.5f, 300.0f, -7.0f, 0.0f, -0.0f},
                  false,
                  true});
  std::vector<step> ties_sym = {{{-127.5f, 3.0f}}};
  ties_sym.push_back(
      {{127.4f, 127.5f, 126.5f, -128.4f, -128.5f, -128.6f, -0.2f, 0.5f, -1.5f}, false, true});
  std::vector<step> ties_zp = {{{-1.0f, 254.0f}}};  // zero point 1
  ties_zp.push_back({{-1.4f, -1.5f, -1.6f, 254.5f, 254.6f, 0.5f}, false, true});

  const struct {
    const char* name;
    hc::activation_fake_quant_options o;
    std::vector<step> steps;
  } scenarios[] = {
      {"quint8_affine_moving_average", hc::quint8_affine_activations(), training_sequence(1)},
      {"quint8_affine_minmax", hc::quint8_affine_activations(hc::fake_quant_observer::minmax),
       training_sequence(2)},
      {"qint8_symmetric_moving_average", hc::qint8_symmetric_activations(), training_sequence(3)},
      {"qint8_affine_moving_average_c025",
       {.averaging_constant = 0.25f, .quant_min = -128, .quant_max = 127},
       training_sequence(4)},
      {"qint8_restricted_symmetric_minmax",
       {.observer = hc::fake_quant_observer::minmax,
        .scheme = hc::fake_quant_scheme::symmetric,
        .quant_min = -127,
        .quant_max = 127},
       training_sequence(5)},
      {"ties_quint8", hc::quint8_affine_activations(hc::fake_quant_observer::minmax), ties},
      {"ties_quint8_zero_point_1", hc::quint8_affine_activations(hc::fake_quant_observer::minmax),
       ties_zp},
      {"ties_qint8_symmetric", hc::qint8_symmetric_activations(hc::fake_quant_observer::minmax),
       ties_sym},
  };
  std::ofstream list(dir / "scenarios.txt");
  unsigned seed = 77;
  for (const auto& s : scenarios) {
    hc::activation_fake_quant fq(s.o);
    qat_interop::run_and_write(fq, s.steps, dir / (std::string(s.name) + ".bin"), seed++);
    list << s.name << "\n";
  }
  return list ? 0 : 1;
}

// tests/compress/qat_interop_io.hpp: what the per-tensor activation fake quantization interop
// helpers share (qat_activations_interop_helper.cpp, qat_checkpoint_interop_helper.cpp): a step
// of a sequence (its batch and switches), normally distributed batches, and the "HQATACT1" file
// that their Python scripts read: the options, then per step the switches, the batch, hone's
// forward values, mask, the gradient fed to backward and backward's result, the scale, zero point
// and observer range.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <hone/compress/qat_activations.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace qat_interop {

namespace hc = hone::compress;

struct step {
  std::vector<float> x;
  bool observe = true, fake_quant = true;
};

inline std::vector<float> normal(std::size_t n, unsigned seed, float mean, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

template <class T>
void put(std::ofstream& f, T v) {
  f.write(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class T>
void put(std::ofstream& f, const std::vector<T>& v) {
  f.write(reinterpret_cast<const char*>(v.data()),
          static_cast<std::streamsize>(v.size() * sizeof(T)));
}

/// Runs `steps` through `fq` and writes them as "HQATACT1" to `path` (backward's input gradients
/// drawn from `seed`). Each step sets its switches first, except the first when
/// `first_keeps_switches` (a restored quantizer), whose switches must then equal the step's.
inline void run_and_write(hc::activation_fake_quant& fq, const std::vector<step>& steps,
                          const std::filesystem::path& path, unsigned seed,
                          bool first_keeps_switches = false) {
  const hc::activation_fake_quant_options& o = fq.options();
  std::ofstream f(path, std::ios::binary);
  f.write("HQATACT1", 8);
  put<std::int32_t>(f, o.observer == hc::fake_quant_observer::minmax ? 1 : 0);
  put<float>(f, o.averaging_constant);
  put<std::int32_t>(f, o.scheme == hc::fake_quant_scheme::symmetric ? 1 : 0);
  put<std::int32_t>(f, o.quant_min);
  put<std::int32_t>(f, o.quant_max);
  put<std::uint32_t>(f, static_cast<std::uint32_t>(steps.size()));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> gd(0.5f, 2.0f);
  for (std::size_t k = 0; k < steps.size(); ++k) {
    const step& s = steps[k];
    if (k == 0 && first_keeps_switches) {
      if (fq.observer_enabled() != s.observe || fq.fake_quant_enabled() != s.fake_quant) {
        throw std::runtime_error("the restored switches (observer " +
                                 std::to_string(fq.observer_enabled()) + ", fake quantization " +
                                 std::to_string(fq.fake_quant_enabled()) +
                                 ") are not those of the first step");
      }
    } else {
      fq.enable_observer(s.observe);
      fq.enable_fake_quant(s.fake_quant);
    }
    const std::size_t n = s.x.size();
    std::vector<float> y(n), gy(n), gx(n);
    fq.forward(s.x, y);
    std::vector<std::uint8_t> mask(n);
    for (std::size_t i = 0; i < n; ++i) mask[i] = fq.passes(i) ? 1 : 0;
    for (auto& g : gy) g = gd(rng);
    fq.backward(gy, gx);
    put<std::uint8_t>(f, s.observe ? 1 : 0);
    put<std::uint8_t>(f, s.fake_quant ? 1 : 0);
    put<std::uint16_t>(f, 0);
    put<std::uint32_t>(f, static_cast<std::uint32_t>(n));
    put(f, s.x);
    put(f, y);
    put(f, mask);
    put(f, gy);
    put(f, gx);
    put<float>(f, fq.scale());
    put<std::int32_t>(f, fq.zero_point());
    put<float>(f, fq.observed_range().lo);
    put<float>(f, fq.observed_range().hi);
  }
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace qat_interop

// The C++ side of qat_checkpoint_interop.py: hone's activation fake quantizer state files
// (hone/compress/qat_checkpoint.hpp) against torch.ao.quantization.FakeQuantize's state_dict.
//
//   qat_checkpoint_interop_helper save <dir>
//     for each scenario: runs a quantizer over training-like batches, writes its state to
//     <dir>/<scenario>.safetensors under the scenario's prefix (and checks that hone reads it back
//     to the same state), continues the quantizer and writes what it does over the next batches
//     to <dir>/<scenario>.bin; lists
//     "<scenario> <prefix>" lines in <dir>/scenarios.txt (prefix "-" for none)
//   qat_checkpoint_interop_helper continue <state file> <prefix> <input> <output>
//     restores a quantizer (the options in <input>) from a state file written by torch
//     (safetensors.torch.save_file of a state_dict) under <prefix> ("-" for none), checks that its
//     switches are those of the first step, runs the batches of <input>, writes <output>
//
// <scenario>.bin and <output>: the format of qat_activations_interop_helper.cpp ("HQATACT1"...;
// the first step keeps the switches the quantizer was restored with).
// <input>, little-endian: "HQATIN01"; i32 observer (0 moving-average min-max, 1 min-max); f32
// averaging constant; i32 scheme (0 affine, 1 symmetric); i32 quant_min; i32 quant_max; u32 steps;
// per step: u8 observer_enabled; u8 fake_quant_enabled; u16 0; u32 n; f32 x[n].
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <hone/checkpoint/tensor_file.hpp>
#include <hone/checkpoint/tensor_writer.hpp>
#include <hone/compress/qat_activations.hpp>
#include <hone/compress/qat_checkpoint.hpp>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "qat_interop_io.hpp"

namespace hc = hone::compress;
namespace ck = hone::checkpoint;

namespace {

using qat_interop::normal;
using qat_interop::step;

std::vector<float> batch(std::size_t b, unsigned seed) {
  const std::size_t n = b % 7 == 3 ? 1 : 1 + (b * 389) % 2000;
  std::vector<float> v =
      normal(n, seed + static_cast<unsigned>(b), 0.2f * static_cast<float>(b % 5) - 0.3f,
             0.3f + 0.25f * static_cast<float>(b % 9));
  if (b % 3 == 1) {
    for (auto& x : v) x = std::max(x, 0.0f);
  }
  if (b % 11 == 6) v[n / 2] = 19.0f;
  if (b % 13 == 9) v[0] = -14.0f;
  return v;
}

bool same_state(const hc::activation_fake_quant_state& a,
                const hc::activation_fake_quant_state& b) {
  const auto bits = [](float v) { return std::bit_cast<std::uint32_t>(v); };
  return a.seen == b.seen && bits(a.range.lo) == bits(b.range.lo) &&
         bits(a.range.hi) == bits(b.range.hi) && bits(a.qparams.scale) == bits(b.qparams.scale) &&
         a.qparams.zero_point == b.qparams.zero_point && a.observations == b.observations &&
         a.observer_enabled == b.observer_enabled && a.fake_quant_enabled == b.fake_quant_enabled;
}

int save(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  struct scenario {
    const char* name;
    const char* prefix;  // "" for none
    hc::activation_fake_quant_options o;
    std::size_t before;        // batches before the save
    bool observe, fake_quant;  // the switches at the save
  };
  const scenario scenarios[] = {
      {"quint8_affine_moving_average", "model.act1", hc::quint8_affine_activations(), 20, true,
       true},
      {"quint8_affine_minmax_switches_off", "",
       hc::quint8_affine_activations(hc::fake_quant_observer::minmax), 12, false, false},
      {"qint8_symmetric_moving_average_frozen", "fc2.input", hc::qint8_symmetric_activations(), 15,
       false, true},
      {"qint8_affine_moving_average_c025",
       "x",
       {.averaging_constant = 0.25f, .quant_min = -128, .quant_max = 127},
       9,
       true,
       true},
      {"qint8_restricted_symmetric_minmax",
       "blocks.3.mlp.act",
       {.observer = hc::fake_quant_observer::minmax,
        .scheme = hc::fake_quant_scheme::symmetric,
        .quant_min = -127,
        .quant_max = 127},
       17,
       true,
       true},
      {"quint8_affine_fresh", "fresh", hc::quint8_affine_activations(), 0, true, true},
  };
  std::ofstream list(dir / "scenarios.txt");
  unsigned seed = 500;
  for (const scenario& s : scenarios) {
    seed += 50;
    hc::activation_fake_quant fq(s.o);
    for (std::size_t b = 0; b < s.before; ++b) {
      const std::vector<float> x = batch(b, seed);
      std::vector<float> y(x.size());
      fq.forward(x, y);
    }
    fq.enable_observer(s.observe);
    fq.enable_fake_quant(s.fake_quant);
    const std::filesystem::path state = dir / (std::string(s.name) + ".safetensors");
    {
      const hc::fake_quant_tensors t{{s.prefix, fq}};
      ck::tensor_writer w;
      t.add_to(w);
      ck::write_tensors(w, state);
    }
    // hone reads its own file back to the same state (test_compress_qat_checkpoint shows that a
    // restored quantizer continues as the original does)
    hc::activation_fake_quant resumed(s.o);
    hc::read_fake_quants(ck::tensor_file::open(state), {{s.prefix, resumed}});
    if (!same_state(resumed.state(), fq.state())) {
      throw std::runtime_error(std::string(s.name) + ": the file does not restore the state saved");
    }
    std::vector<step> next;
    next.push_back({batch(100, seed), s.observe, s.fake_quant});
    for (std::size_t b = 1; b < 10; ++b) {
      // the switches back on, then the observer frozen and fake quantization off for a step
      next.push_back({batch(100 + b, seed), b < 7, b != 8});
    }
    // the saved quantizer continues, uninterrupted: what torch must do after loading the file
    qat_interop::run_and_write(fq, next, dir / (std::string(s.name) + ".bin"), seed + 7, true);
    list << s.name << " " << (*s.prefix ? s.prefix : "-") << "\n";
  }
  return list ? 0 : 1;
}

template <class T>
T take(const std::vector<char>& d, std::size_t& off) {
  if (off + sizeof(T) > d.size()) throw std::runtime_error("the input is truncated");
  T v;
  std::memcpy(&v, d.data() + off, sizeof v);
  off += sizeof v;
  return v;
}

int resume(const std::filesystem::path& state, std::string prefix,
           const std::filesystem::path& input, const std::filesystem::path& output) {
  if (prefix == "-") prefix.clear();
  std::ifstream in(input, std::ios::binary);
  const std::vector<char> d((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (d.size() < 8 || std::memcmp(d.data(), "HQATIN01", 8) != 0) {
    throw std::runtime_error(input.string() + ": bad magic");
  }
  std::size_t off = 8;
  hc::activation_fake_quant_options o;
  o.observer = take<std::int32_t>(d, off) == 1 ? hc::fake_quant_observer::minmax
                                               : hc::fake_quant_observer::moving_average_minmax;
  o.averaging_constant = take<float>(d, off);
  o.scheme = take<std::int32_t>(d, off) == 1 ? hc::fake_quant_scheme::symmetric
                                             : hc::fake_quant_scheme::affine;
  o.quant_min = take<std::int32_t>(d, off);
  o.quant_max = take<std::int32_t>(d, off);
  const auto count = take<std::uint32_t>(d, off);
  std::vector<step> steps(count);
  for (step& s : steps) {
    s.observe = take<std::uint8_t>(d, off) != 0;
    s.fake_quant = take<std::uint8_t>(d, off) != 0;
    (void)take<std::uint16_t>(d, off);
    s.x.resize(take<std::uint32_t>(d, off));
    for (float& v : s.x) v = take<float>(d, off);
  }
  if (off != d.size()) throw std::runtime_error(input.string() + ": trailing bytes");
  hc::activation_fake_quant fq(o);
  hc::read_fake_quants(ck::tensor_file::open(state), {{prefix, fq}});
  std::printf("  hone restored '%s' from %s: scale %.9g, zero point %d, %s, %llu observation(s)\n",
              prefix.c_str(), state.filename().string().c_str(), static_cast<double>(fq.scale()),
              fq.zero_point(), fq.state().seen ? "range seen" : "no range yet",
              static_cast<unsigned long long>(fq.observations()));
  qat_interop::run_and_write(fq, steps, output, 4242, true);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> a(argv + 1, argv + argc);
    if (a.size() == 2 && a[0] == "save") return save(a[1]);
    if (a.size() == 5 && a[0] == "continue") return resume(a[1], a[2], a[3], a[4]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qat_checkpoint_interop_helper: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr,
               "usage: qat_checkpoint_interop_helper save <dir>\n"
               "       qat_checkpoint_interop_helper continue <state> <prefix> <input> <output>\n");
  return 2;
}

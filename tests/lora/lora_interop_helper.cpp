// The C++ side of peft_interop.py. The model: x [rows, 12] -> fc1 (12 -> 10, bias) -> ReLU ->
// block.proj (10 -> 6, no bias), as the script's torch module.
//
//   lora_interop_helper write <dir>
//     base.safetensors       fc1.weight, fc1.bias, block.proj.weight (torch's state_dict names)
//     x.safetensors          x [5, 12]
//     hone_adapter/          hone's adapters (save_lora): r 4, alpha 8, dropout 0.05, B nonzero
//     hone_out.safetensors   y (hone's eval forward with the adapters), y_merged (after merge()),
//                            fc1.weight / block.proj.weight as merged
//     exits 1 if unmerge() does not restore the base bit for bit
//   lora_interop_helper check <dir> <adapter dir> <expected.safetensors>
//     loads <adapter dir> (PEFT's files) onto the base of <dir>, runs x through it and compares
//     with "y" of <expected.safetensors>: exit 0 when
//     max |hone - expected| <= 1e-5 * max |expected|
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <hone/compress/lora_io.hpp>
#include <random>
#include <string>
#include <vector>

namespace hc = hone::compress;
namespace ck = hone::checkpoint;

namespace {

constexpr std::size_t rows = 5, in = 12, hidden = 10, out = 6;

struct base_net {
  std::vector<float> w1, b1, w2;
  std::vector<hc::linear_ref> refs() {
    return {{"fc1", w1, b1, hidden, in}, {"block.proj", w2, {}, out, hidden}};
  }
};

std::vector<float> random_vector(std::size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> read_tensor(const ck::safetensors_file& f, std::string_view name,
                               std::size_t count) {
  const ck::tensor_info& t = f.at(name);
  std::vector<float> v(count);
  if (t.elements() != count) {
    throw hone::checkpoint_error(f.context() + ": tensor '" + std::string(name) + "' has " +
                                 std::to_string(t.elements()) + " elements, expected " +
                                 std::to_string(count));
  }
  f.read(t, std::as_writable_bytes(std::span(v)), hone::io::dtype::f32);
  return v;
}

std::vector<float> run(hc::lora_model& m, const std::vector<float>& x) {
  std::vector<float> h(rows * hidden), y(rows * out);
  m.forward(0, x, rows, h);
  for (auto& v : h) v = std::max(v, 0.0f);
  m.forward(1, h, rows, y);
  return y;
}

int write(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  base_net net{random_vector(hidden * in, 1, 0.3f), random_vector(hidden, 2, 0.1f),
               random_vector(out * hidden, 3, 0.3f)};
  const auto x = random_vector(rows * in, 4, 1.0f);
  ck::tensor_writer base;
  base.add("fc1.weight", {hidden, in}, net.w1)
      .add("fc1.bias", {hidden}, net.b1)
      .add("block.proj.weight", {out, hidden}, net.w2);
  base.write(dir / "base.safetensors");
  ck::tensor_writer xs;
  xs.add("x", {rows, in}, x);
  xs.write(dir / "x.safetensors");

  hc::lora_model m(net.refs(), {.r = 4, .alpha = 8, .dropout = 0.05f, .seed = 11});
  for (std::size_t i = 0; i < m.size(); ++i) {  // as if trained: B = 0 would hide a wrong B
    const auto b = random_vector(m.lora_B(i).size(), 20 + unsigned(i), 0.4f);
    std::copy(b.begin(), b.end(), m.lora_B(i).begin());
  }
  hc::save_lora(m, dir / "hone_adapter");
  m.eval();
  const auto y = run(m, x);
  const auto w1 = net.w1, w2 = net.w2;
  m.merge();
  const auto y_merged = run(m, x);
  const auto m1 = net.w1, m2 = net.w2;
  m.unmerge();
  if (std::memcmp(w1.data(), net.w1.data(), w1.size() * 4) != 0 ||
      std::memcmp(w2.data(), net.w2.data(), w2.size() * 4) != 0) {
    std::fprintf(stderr, "unmerge did not restore the base weights bit for bit\n");
    return 1;
  }
  ck::tensor_writer o;
  o.add("y", {rows, out}, y)
      .add("y_merged", {rows, out}, y_merged)
      .add("fc1.weight", {hidden, in}, m1)
      .add("block.proj.weight", {out, hidden}, m2);
  o.write(dir / "hone_out.safetensors");
  std::printf("wrote %s\n", dir.c_str());
  return 0;
}

int check(const std::filesystem::path& dir, const std::filesystem::path& adapter,
          const std::filesystem::path& expected) {
  const auto base = ck::safetensors_file::open(dir / "base.safetensors");
  base_net net{read_tensor(base, "fc1.weight", hidden * in), read_tensor(base, "fc1.bias", hidden),
               read_tensor(base, "block.proj.weight", out * hidden)};
  const auto x = read_tensor(ck::safetensors_file::open(dir / "x.safetensors"), "x", rows * in);
  const auto want = read_tensor(ck::safetensors_file::open(expected), "y", rows * out);
  auto m = hc::lora_model_from_pretrained(net.refs(), adapter);
  m.eval();
  const auto y = run(m, x);
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    err = std::max(err, double(std::abs(y[i] - want[i])));
    scale = std::max(scale, double(std::abs(want[i])));
  }
  std::printf("hone on %s: r %zu, scaling %g, max |hone - expected| = %.3g (max |expected| %.3g)\n",
              adapter.c_str(), m.rank(), double(m.scaling()), err, scale);
  return err <= 1e-5 * scale ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "write" && argc == 3) return write(argv[2]);
    if (cmd == "check" && argc == 5) return check(argv[2], argv[3], argv[4]);
    std::fprintf(stderr,
                 "usage: lora_interop_helper write <dir> | check <dir> <adapter dir> "
                 "<expected.safetensors>\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lora_interop_helper: %s\n", e.what());
    return 1;
  }
}

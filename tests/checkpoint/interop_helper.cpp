// tests/checkpoint/interop_helper.cpp: hone's side of the interop test (interop.py drives it).
//
//   interop_helper write <dir>     writes hone_numpy.safetensors (every dtype numpy has),
//                                  hone_bf16.safetensors (F32 weights exported as BF16),
//                                  hone_roundtrip.safetensors (written compressed, converted back)
//   interop_helper check <dir>     reads py_numpy.safetensors and py_bf16.safetensors written by
//                                  Python and compares every value with the same formulas
//   interop_helper recompress <in> <out>
//                                  plain -> compressed -> plain (hone's conversion tool path)
//
// Values are functions of the element index that both sides compute (tests/checkpoint/interop.py
// has the Python twin of expected_*).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <hone/checkpoint/compress.hpp>
#include <hone/checkpoint/tensor_file.hpp>

namespace {

namespace ck = hone::checkpoint;
namespace io = hone::io;
namespace fs = std::filesystem;

// The shared formulas (interop.py: expected()).
template <class T>
std::vector<T> expected(const std::string& name, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::int64_t>(i);
    if constexpr (std::is_same_v<T, bool>) {
      v[i] = (i % 3) == 0;
    } else if constexpr (std::is_floating_point_v<T>) {
      v[i] = static_cast<T>(static_cast<double>(k) * 0.25 - 3.0);
    } else if constexpr (std::is_same_v<T, hone::half>) {
      v[i] = hone::half(static_cast<float>(k) * 0.5f - 2.0f);
    } else if constexpr (std::is_signed_v<T>) {
      v[i] = static_cast<T>(k * 37 - 100);  // wraps for narrow types as numpy's astype does
    } else {
      v[i] = static_cast<T>(k * 37 + 5);
    }
  }
  (void)name;
  return v;
}

/// F32 "weights" for the BF16 export: values that are not bf16-exact.
std::vector<float> weights(std::size_t n) {
  std::vector<float> w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = std::sin(static_cast<float>(i) * 0.37f) * 0.05f;
  return w;
}

struct numpy_set {
  std::vector<double> f64 = expected<double>("f64", 12);
  std::vector<float> f32 = expected<float>("f32", 12);
  std::vector<hone::half> f16 = expected<hone::half>("f16", 12);
  std::vector<std::int64_t> i64 = expected<std::int64_t>("i64", 6);
  std::vector<std::int32_t> i32 = expected<std::int32_t>("i32", 6);
  std::vector<std::int16_t> i16 = expected<std::int16_t>("i16", 6);
  std::vector<std::int8_t> i8 = expected<std::int8_t>("i8", 6);
  std::vector<std::uint64_t> u64 = expected<std::uint64_t>("u64", 6);
  std::vector<std::uint32_t> u32 = expected<std::uint32_t>("u32", 6);
  std::vector<std::uint16_t> u16 = expected<std::uint16_t>("u16", 6);
  std::vector<std::uint8_t> u8 = expected<std::uint8_t>("u8", 6);
  std::vector<std::uint8_t> boolean;  // bool as bytes 0/1
  std::vector<float> scalar{42.5f};
  std::vector<float> empty;

  numpy_set() {
    for (bool b : expected<bool>("bool", 7)) boolean.push_back(b ? 1 : 0);
  }
  void add_to(ck::tensor_writer& w) const {
    w.add("f64", {3, 4}, f64);
    w.add("f32", {3, 4}, f32);
    w.add("f16", {2, 6}, f16);
    w.add("i64", {6}, i64);
    w.add("i32", {2, 3}, i32);
    w.add("i16", {6}, i16);
    w.add("i8", {6}, i8);
    w.add("u64", {6}, u64);
    w.add("u32", {6}, u32);
    w.add("u16", {6}, u16);
    w.add("u8", {6}, u8);
    w.add("bool", io::dtype::boolean, {7}, std::as_bytes(std::span(boolean)));
    w.add("scalar", {}, scalar);
    w.add("empty", {0, 4}, empty);
    w.set_metadata("framework", "hone");
    w.set_metadata("step", "1200");
  }
};

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "MISMATCH: %s\n", what.c_str());
    ++failures;
  }
}

template <class T>
void check_tensor(const ck::tensor_file& f, const std::string& name, const std::vector<T>& want,
                  const ck::shape_type& shape) {
  const ck::tensor_info* t = f.find(name);
  if (t == nullptr) {
    expect(false, f.context() + ": no tensor " + name);
    return;
  }
  expect(t->type == io::dtype_of<T>, name + ": dtype " + std::string(io::dtype_name(t->type)));
  expect(t->shape == shape, name + ": shape " + ck::shape_string(t->shape));
  std::vector<std::byte> got(static_cast<std::size_t>(t->size_bytes()));
  f.read(*t, got);
  expect(got.size() == want.size() * sizeof(T) &&
             (want.empty() || std::memcmp(got.data(), want.data(), got.size()) == 0),
         name + ": values differ");
}

void check_numpy_file(const ck::tensor_file& f) {
  const numpy_set s;
  check_tensor(f, "f64", s.f64, {3, 4});
  check_tensor(f, "f32", s.f32, {3, 4});
  check_tensor(f, "f16", s.f16, {2, 6});
  check_tensor(f, "i64", s.i64, {6});
  check_tensor(f, "i32", s.i32, {2, 3});
  check_tensor(f, "i16", s.i16, {6});
  check_tensor(f, "i8", s.i8, {6});
  check_tensor(f, "u64", s.u64, {6});
  check_tensor(f, "u32", s.u32, {6});
  check_tensor(f, "u16", s.u16, {6});
  check_tensor(f, "u8", s.u8, {6});
  const ck::tensor_info& b = f.at("bool");
  expect(b.type == io::dtype::boolean && b.shape == ck::shape_type{7}, "bool: dtype/shape");
  std::vector<std::uint8_t> got(7);
  f.read(b, std::as_writable_bytes(std::span(got)));
  expect(got == s.boolean, "bool: values differ");
  check_tensor(f, "scalar", s.scalar, {});
  check_tensor(f, "empty", s.empty, {0, 4});
  const auto it = f.metadata().find("framework");
  expect(it != f.metadata().end() && it->second == "python", "metadata framework=python");
}

int run(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "write" && argc == 3) {
    const fs::path dir = argv[2];
    fs::create_directories(dir);
    const numpy_set s;
    ck::tensor_writer w;
    s.add_to(w);
    (void)w.write(dir / "hone_numpy.safetensors");
    const std::vector<float> wts = weights(1000);
    ck::tensor_writer b;
    b.add("w", {10, 100}, wts, io::dtype::bf16);
    b.add("w_f32", {10, 100}, wts);
    (void)b.write(dir / "hone_bf16.safetensors");
    // Compressed, then converted back: what `hone-ckpt` will give Python.
    (void)ck::write_compressed(w, dir / "hone_numpy.hct", {.level = 1, .chunk_bytes = 16});
    (void)ck::decompress_to_safetensors(dir / "hone_numpy.hct", dir / "hone_roundtrip.safetensors");
    return 0;
  }
  if (cmd == "check" && argc == 3) {
    const fs::path dir = argv[2];
    check_numpy_file(ck::tensor_file::open(dir / "py_numpy.safetensors"));
    const auto bf = ck::tensor_file::open(dir / "py_bf16.safetensors");
    const ck::tensor_info& t = bf.at("w");
    expect(t.type == io::dtype::bf16 && t.shape == ck::shape_type{10, 100}, "py bf16: dtype/shape");
    const std::vector<float> wts = weights(1000);
    const std::vector<float> got = bf.read_as<float>("w");  // BF16 -> F32 conversion on read
    for (std::size_t i = 0; i < wts.size(); ++i) {
      const float want = static_cast<float>(hone::bfloat16(wts[i]));
      if (got[i] != want) {
        expect(false, "py bf16 element " + std::to_string(i));
        break;
      }
    }
    // And compressed by hone, then decompressed: byte-identical data section.
    const fs::path hct = dir / "py_numpy.hct";
    (void)ck::compress_safetensors(dir / "py_numpy.safetensors", hct,
                                   {.level = 3, .chunk_bytes = 32});
    check_numpy_file(ck::tensor_file::open(hct));
    std::printf("check: %d mismatches\n", failures);
    return failures == 0 ? 0 : 1;
  }
  if (cmd == "recompress" && argc == 4) {
    const fs::path tmp = fs::path(argv[3]).replace_extension(".hct");
    (void)ck::compress_safetensors(argv[2], tmp);
    (void)ck::decompress_to_safetensors(tmp, argv[3]);
    return 0;
  }
  std::fprintf(stderr, "usage: %s write <dir> | check <dir> | recompress <in> <out>\n", argv[0]);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "interop_helper: %s\n", e.what());
    return 1;
  }
}

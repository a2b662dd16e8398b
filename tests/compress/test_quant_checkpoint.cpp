// hone::compress quantized weights in hone's tensor files: per-channel and per-tensor codes and
// scales written as I8 + F32 safetensors (and the compressed format), read back bit for bit, the
// dtypes and shapes in the file checked through the generic reader, a layer built from the loaded
// weights gives the same outputs; wrong dtypes, shapes and codes are refused with sentences naming
// the tensor.
#define BOOST_TEST_MODULE hone_compress_quant_checkpoint
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <hone/checkpoint/compressed_writer.hpp>
#include <hone/checkpoint/tensor_file.hpp>
#include <hone/checkpoint/tensor_writer.hpp>
#include <hone/compress/quant_checkpoint.hpp>
#include <hone/compress/quant_linear.hpp>
#include <random>
#include <string>
#include <vector>

#include "../support/error_text.hpp"
#include "../support/temp_dir.hpp"

namespace hc = hone::compress;
namespace ck = hone::checkpoint;

namespace {

std::vector<float> normal(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(round_trip_bit_for_bit_in_both_formats) {
  hone_test::temp_dir dir("compress_quant_ckpt");
  const std::size_t n = 24, k = 40;
  const auto w = normal(n * k, 1);
  const auto qc = hc::quantize_weights(w, n, k, hc::quant_granularity::per_channel);
  const auto qt = hc::quantize_weights(w, n, k, hc::quant_granularity::per_tensor);
  for (const bool compressed : {false, true}) {
    const auto path = dir / (compressed ? "q.hone" : "q.safetensors");
    ck::tensor_writer tw;
    hc::add_quantized(tw, "fc1", qc);
    hc::add_quantized(tw, "fc2", qt);
    if (compressed) {
      ck::write_compressed(tw, path);
    } else {
      tw.write(path);
    }
    const auto f = ck::tensor_file::open(path);
    // the generic reader sees I8 [24, 40] + F32 [24] and F32 []
    BOOST_TEST((f.at("fc1.qweight").type == hone::io::dtype::i8));
    BOOST_TEST((f.at("fc1.qweight").shape == ck::shape_type{24, 40}));
    BOOST_TEST((f.at("fc1.scale").type == hone::io::dtype::f32));
    BOOST_TEST((f.at("fc1.scale").shape == ck::shape_type{24}));
    BOOST_TEST(f.at("fc2.scale").shape.empty());
    BOOST_TEST(f.read_as<float>("fc2.scale").size() == 1u);
    const auto lc = hc::read_quantized(f, "fc1");
    const auto lt = hc::read_quantized(f, "fc2");
    BOOST_TEST((lc.granularity == hc::quant_granularity::per_channel));
    BOOST_TEST((lt.granularity == hc::quant_granularity::per_tensor));
    BOOST_TEST(lc.values == qc.values, boost::test_tools::per_element());
    BOOST_TEST(lc.scales == qc.scales, boost::test_tools::per_element());
    BOOST_TEST(lt.values == qt.values, boost::test_tools::per_element());
    BOOST_TEST(lt.scales == qt.scales, boost::test_tools::per_element());
    // a layer from the loaded weights computes the same outputs
    const auto x = normal(3 * k, 2);
    std::vector<float> y0(3 * n), y1(3 * n);
    hc::dynamic_int8_linear(qc).forward(x, 3, y0);
    hc::dynamic_int8_linear(lc).forward(x, 3, y1);
    BOOST_TEST(y0 == y1, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(wrong_tensors_are_refused_with_sentences) {
  hone_test::temp_dir dir("compress_quant_ckpt_bad");
  const std::vector<float> codes_f32(6, 1.0f), scales(2, 0.5f), bad_scales(3, 0.5f);
  std::vector<std::int8_t> codes(6, 1);
  const std::vector<float> negative{0.5f, -1.0f};
  const auto write = [&](const std::string& file, auto&& fill) {
    ck::tensor_writer tw;
    fill(tw);
    tw.write(dir / file);
    return ck::tensor_file::open(dir / file);
  };
  const auto f1 = write("a.safetensors", [&](ck::tensor_writer& tw) {
    tw.add("l.qweight", ck::shape_type{2, 3}, codes_f32);
    tw.add("l.scale", ck::shape_type{2}, scales);
  });
  const auto m1 =
      hone_test::error_of<hone::checkpoint_error>([&] { (void)hc::read_quantized(f1, "l"); });
  BOOST_TEST(m1.find("2-D I8") != std::string::npos, m1);
  BOOST_TEST(m1.find("weights 'l'") != std::string::npos, m1);
  const auto f2 = write("b.safetensors", [&](ck::tensor_writer& tw) {
    tw.add("l.qweight", ck::shape_type{2, 3}, codes);
    tw.add("l.scale", ck::shape_type{3}, bad_scales);
  });
  const auto m2 =
      hone_test::error_of<hone::checkpoint_error>([&] { (void)hc::read_quantized(f2, "l"); });
  BOOST_TEST(m2.find("[2] (one per row)") != std::string::npos, m2);
  const auto f3 = write("c.safetensors", [&](ck::tensor_writer& tw) {
    tw.add("l.qweight", ck::shape_type{2, 3}, codes);
    tw.add("l.scale", ck::shape_type{2}, negative);
  });
  const auto m3 =
      hone_test::error_of<hone::checkpoint_error>([&] { (void)hc::read_quantized(f3, "l"); });
  BOOST_TEST(m3.find("scale 1") != std::string::npos, m3);
  codes[4] = -128;
  const auto f4 = write("d.safetensors", [&](ck::tensor_writer& tw) {
    tw.add("l.qweight", ck::shape_type{2, 3}, codes);
    tw.add("l.scale", ck::shape_type{2}, scales);
  });
  const auto m4 =
      hone_test::error_of<hone::checkpoint_error>([&] { (void)hc::read_quantized(f4, "l"); });
  BOOST_TEST(m4.find("row 1, column 1") != std::string::npos, m4);
  const auto m5 =
      hone_test::error_of<hone::checkpoint_error>([&] { (void)hc::read_quantized(f4, "missing"); });
  BOOST_TEST(m5.find("missing.qweight") != std::string::npos, m5);
}

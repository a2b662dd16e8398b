// hone/compress/qat_checkpoint.hpp: the state of activation fake quantizers (qat_activations.hpp)
// in checkpoints, in the layout of PyTorch's FakeQuantize.state_dict(), so that a resumed QAT run
// continues its quantizers bit for bit instead of starting new ranges, and a file moves between
// hone and torch both ways. docs/quant.md.
//
//   namespace hc = hone::compress;
//   hc::activation_fake_quant fq1, fq2;       // the quantizers of the user's forward
//   w.save(step, [&](ck::snapshot& s) {        // a trainer checkpoint (checkpoint/writer.hpp)
//     ck::capture(t, s);                       // quantizers.safetensors below:
//     hc::capture_fake_quants(s, {{"fc1.input", fq1}, {"fc2.input", fq2}});
//   });
//   ...
//   ck::restore(t, dir);
//   hc::restore_fake_quants(dir, {{"fc1.input", fq1}, {"fc2.input", fq2}});
//
//   // a plain file (the tensor_writer borrows the tensors: keep `t` alive until written)
//   const hc::fake_quant_tensors t({{"fc1.input", fq1}});
//   ck::tensor_writer w;
//   t.add_to(w);
//   ck::write_tensors(w, "quantizers.safetensors");
//   hc::read_fake_quants(ck::tensor_file::open("quantizers.safetensors"), {{"fc1.input", fq1}});
//
// The layout: a quantizer named N is the tensors of torch's FakeQuantize.state_dict() with prefix
// "N." (no prefix for the name "", as a bare FakeQuantize's own state_dict), names, dtypes and
// shapes exactly torch's (torch 2.x):
//   N.fake_quant_enabled                   U8  [1]  1 on, 0 off
//   N.observer_enabled                     U8  [1]  1 on, 0 off
//   N.scale                                F32 [1]
//   N.zero_point                           I32 [1]
//   N.activation_post_process.eps          F32 [1]  float32's epsilon (2^-23)
//   N.activation_post_process.min_val      F32 []   +inf before the first batch
//   N.activation_post_process.max_val      F32 []   -inf before the first batch
// so torch's fq.load_state_dict({k[len("N."):]: v for k, v in load_file(path).items() if
// k.startswith("N.")}) loads hone's file, and hone reads safetensors.torch.save_file of a
// FakeQuantize's (or a model's) state_dict. What torch does not store goes into the file's
// metadata, under the same prefix:
//   N.hone.observations       the batches observed (decimal)
//   N.hone.observer           "moving_average_minmax" or "minmax"
//   N.hone.averaging_constant the moving average's constant ("%.9g": reads back exactly)
//   N.hone.qscheme            "per_tensor_affine" or "per_tensor_symmetric"
//   N.hone.quant_min, N.hone.quant_max
// A file without N.hone.observations (torch's) is read with the restored quantizer's own options
// (torch's state_dict does not hold them: the caller must construct the quantizer as torch's was
// configured, as for torch's own load_state_dict), and observations = 1 when the observer has seen
// a batch (min_val != +inf or max_val != -inf), else 0.
//
// Errors: hone::checkpoint_error sentences naming the file and the quantizer for a missing file or
// tensor, a wrong dtype or shape, a switch other than 0 / 1, an eps other than float32's, bad hone
// metadata, and every state activation_fake_quant::restore refuses (options that differ, a scale
// that is not finite and positive, a zero point outside [quant_min, quant_max], a seen range that
// is not finite with lo <= hi); a damaged file is the tensor file reader's checkpoint_error.
// Restoring a set is all or nothing: every quantizer is read and checked before any changes.
// hone::config_error for a set naming a quantizer twice.
#pragma once

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hone/checkpoint/tensor_file.hpp"
#include "hone/checkpoint/tensor_writer.hpp"
#include "hone/checkpoint/writer.hpp"
#include "hone/compress/qat_activations.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

/// The file of a checkpoint that holds the fake quantizers' state.
inline constexpr std::string_view fake_quant_file = "quantizers.safetensors";

/// A quantizer and the name (prefix) of its tensors; "" for none (a bare FakeQuantize's keys).
struct named_fake_quant {
  std::string name;
  activation_fake_quant& quantizer;
};

namespace detail {

/// The file key of quantizer `name`'s entry `key` (torch's prefix + key).
inline std::string fq_key(const std::string& name, std::string_view key) {
  return name.empty() ? std::string(key) : name + "." + std::string(key);
}

inline std::string fq_who(const std::string& name) {
  return name.empty() ? std::string("the fake quantizer without prefix")
                      : "fake quantizer '" + name + "'";
}

inline void check_distinct_fake_quant_names(std::span<const named_fake_quant> q, const char* who) {
  for (std::size_t i = 0; i < q.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      HONE_REQUIRE(q[i].name != q[j].name,
                   std::string(who) + ": two quantizers are named '" + q[i].name +
                       "'; each quantizer needs its own name (its tensors' prefix).");
    }
  }
}

[[noreturn]] inline void fq_fail(const checkpoint::tensor_file& f, const std::string& name,
                                 const std::string& what) {
  // The same form as the checkpoint readers' messages: "hone: '<file>': ...".
  throw checkpoint_error("hone: '" + f.context() + "': " + fq_who(name) + ": " + what);
}

/// Reads quantizer `name`'s one-element tensor `key` (T's dtype, shape `shape`) into `out`; false
/// when it is absent and `optional`, a sentence when absent otherwise or of another dtype or shape.
template <class T>
bool read_fq_tensor(const checkpoint::tensor_file& f, const std::string& name, std::string_view key,
                    const checkpoint::shape_type& shape, T& out, bool optional = false) {
  const std::string k = fq_key(name, key);
  const checkpoint::tensor_info* t = f.find(k);
  constexpr io::dtype type = io::dtype_of<T>;
  if (t == nullptr) {
    if (optional) return false;
    const bool partial = f.find(fq_key(name, "scale")) != nullptr ||
                         f.find(fq_key(name, "fake_quant_enabled")) != nullptr;
    fq_fail(f, name,
            "tensor '" + k +
                (partial ? "' is missing while others of the quantizer are there; the file is "
                           "damaged or not a FakeQuantize's state_dict."
                         : "' is missing; the file holds no such quantizer (is it saved under "
                           "another name?)."));
  }
  if (t->type != type || t->shape != shape) {
    fq_fail(f, name,
            "tensor '" + k + "' is " + std::string(io::dtype_name(t->type)) + " of shape " +
                checkpoint::shape_string(t->shape) + ", but torch's FakeQuantize stores it as " +
                std::string(io::dtype_name(type)) + " of shape " + checkpoint::shape_string(shape) +
                ".");
  }
  f.read(*t, std::as_writable_bytes(std::span<T>(&out, 1)));
  return true;
}

/// The hone metadata entry `key` of quantizer `name` (fails naming it when absent).
inline const std::string& fq_metadata(const checkpoint::tensor_file& f, const std::string& name,
                                      std::string_view key) {
  const std::string k = fq_key(name, key);
  const auto it = f.metadata().find(k);
  if (it == f.metadata().end()) {
    fq_fail(f, name,
            "the metadata has " + fq_key(name, "hone.observations") + " but no " + k +
                "; the file is damaged (hone writes them together).");
  }
  return it->second;
}

inline std::int64_t fq_metadata_integer(const checkpoint::tensor_file& f, const std::string& name,
                                        std::string_view key) {
  const std::string& v = fq_metadata(f, name, key);
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || end == v.c_str() || *end != '\0' || errno != 0) {
    fq_fail(f, name, "the metadata " + fq_key(name, key) + " is '" + v + "', not an integer.");
  }
  return x;
}

}  // namespace detail

/// The state of a set of named quantizers as torch's FakeQuantize tensors and hone's metadata
/// (see the top of this file), copied out when added: what add_to() hands a tensor_writer (which
/// borrows the tensors: keep this object alive until the file is written) or a snapshot (which
/// copies them).
class fake_quant_tensors {
 public:
  fake_quant_tensors() = default;
  explicit fake_quant_tensors(std::span<const named_fake_quant> q) {
    for (const named_fake_quant& n : q) add(n.name, n.quantizer);
  }
  fake_quant_tensors(std::initializer_list<named_fake_quant> q)
      : fake_quant_tensors(std::span<const named_fake_quant>(q.begin(), q.size())) {}

  /// Copies quantizer `fq`'s state under `name` ("" for no prefix). config_error when the name is
  /// already taken.
  void add(std::string name, const activation_fake_quant& fq) {
    for (const record& r : records_) {
      HONE_REQUIRE(r.name != name,
                   "hone::compress::fake_quant_tensors::add: two quantizers are "
                   "named '" +
                       name +
                       "'; each quantizer needs its own name (its tensors' "
                       "prefix).");
    }
    record r;
    r.name = std::move(name);
    r.state = fq.state();
    r.fake_quant_enabled = r.state.fake_quant_enabled ? 1 : 0;
    r.observer_enabled = r.state.observer_enabled ? 1 : 0;
    r.scale = r.state.qparams.scale;
    r.zero_point = r.state.qparams.zero_point;
    r.min_val = r.state.seen ? r.state.range.lo : std::numeric_limits<float>::infinity();
    r.max_val = r.state.seen ? r.state.range.hi : -std::numeric_limits<float>::infinity();
    records_.push_back(std::move(r));
  }

  /// How many quantizers are held.
  [[nodiscard]] std::size_t size() const noexcept { return records_.size(); }

  /// Adds every quantizer's tensors and metadata to `w` (borrowed: keep *this alive and unchanged
  /// until the file is written).
  void add_to(checkpoint::tensor_writer& w) const {
    for (const record& r : records_) {
      for (const tensor& t : tensors(r)) w.add(t.key, t.type, t.shape, t.bytes);
      for (const auto& [k, v] : metadata(r)) w.set_metadata(k, v);
    }
  }

  /// Adds every quantizer's tensors and metadata to file `file` of snapshot `s` (copied).
  void add_to(checkpoint::snapshot& s, std::string_view file = fake_quant_file) const {
    for (const record& r : records_) {
      for (const tensor& t : tensors(r)) s.add_bytes(file, t.key, t.type, t.type, t.shape, t.bytes);
      for (const auto& [k, v] : metadata(r)) s.set_metadata(file, k, v);
    }
  }

 private:
  struct record {
    std::string name;
    activation_fake_quant_state state;
    std::uint8_t fake_quant_enabled = 1, observer_enabled = 1;
    float scale = 1.0f;
    std::int32_t zero_point = 0;
    float eps = std::numeric_limits<float>::epsilon();
    float min_val = 0.0f, max_val = 0.0f;
  };
  struct tensor {
    std::string key;
    io::dtype type;
    checkpoint::shape_type shape;
    std::span<const std::byte> bytes;
  };

  template <class T>
  static std::span<const std::byte> bytes_of(const T& v) noexcept {
    return std::as_bytes(std::span<const T>(&v, 1));
  }

  static std::vector<tensor> tensors(const record& r) {
    const std::string& n = r.name;
    return {
        {detail::fq_key(n, "fake_quant_enabled"),
         io::dtype::u8,
         {1},
         bytes_of(r.fake_quant_enabled)},
        {detail::fq_key(n, "observer_enabled"), io::dtype::u8, {1}, bytes_of(r.observer_enabled)},
        {detail::fq_key(n, "scale"), io::dtype::f32, {1}, bytes_of(r.scale)},
        {detail::fq_key(n, "zero_point"), io::dtype::i32, {1}, bytes_of(r.zero_point)},
        {detail::fq_key(n, "activation_post_process.eps"), io::dtype::f32, {1}, bytes_of(r.eps)},
        {detail::fq_key(n, "activation_post_process.min_val"),
         io::dtype::f32,
         {},
         bytes_of(r.min_val)},
        {detail::fq_key(n, "activation_post_process.max_val"),
         io::dtype::f32,
         {},
         bytes_of(r.max_val)},
    };
  }

  static std::vector<std::pair<std::string, std::string>> metadata(const record& r) {
    const activation_fake_quant_options& o = r.state.options;
    char c[32];
    std::snprintf(c, sizeof c, "%.9g", static_cast<double>(o.averaging_constant));
    const std::string& n = r.name;
    return {
        {detail::fq_key(n, "hone.observations"), std::to_string(r.state.observations)},
        {detail::fq_key(n, "hone.observer"),
         o.observer == fake_quant_observer::minmax ? "minmax" : "moving_average_minmax"},
        {detail::fq_key(n, "hone.averaging_constant"), c},
        {detail::fq_key(n, "hone.qscheme"),
         o.scheme == fake_quant_scheme::symmetric ? "per_tensor_symmetric" : "per_tensor_affine"},
        {detail::fq_key(n, "hone.quant_min"), std::to_string(o.quant_min)},
        {detail::fq_key(n, "hone.quant_max"), std::to_string(o.quant_max)},
    };
  }

  std::deque<record> records_;  // a deque: adding keeps the earlier records where they are
};

/// Adds the quantizers' state to snapshot `s` (file quantizers.safetensors).
inline void capture_fake_quants(checkpoint::snapshot& s, std::span<const named_fake_quant> q) {
  fake_quant_tensors(q).add_to(s);
}
inline void capture_fake_quants(checkpoint::snapshot& s,
                                std::initializer_list<named_fake_quant> q) {
  capture_fake_quants(s, std::span<const named_fake_quant>(q.begin(), q.size()));
}

/// Reads the state of quantizer `name` from `f` for a quantizer with options `options` (see the
/// top of this file for the layout, the defaults of a torch-written file and the errors); changes
/// nothing.
[[nodiscard]] inline activation_fake_quant_state read_fake_quant_state(
    const checkpoint::tensor_file& f, const std::string& name,
    const activation_fake_quant_options& options) {
  activation_fake_quant_state s;
  std::uint8_t fq_on = 0, obs_on = 0;
  float eps = 0.0f, lo = 0.0f, hi = 0.0f;
  detail::read_fq_tensor(f, name, "fake_quant_enabled", {1}, fq_on);
  detail::read_fq_tensor(f, name, "observer_enabled", {1}, obs_on);
  detail::read_fq_tensor(f, name, "scale", {1}, s.qparams.scale);
  detail::read_fq_tensor(f, name, "zero_point", {1}, s.qparams.zero_point);
  const bool has_eps = detail::read_fq_tensor(f, name, "activation_post_process.eps", {1}, eps,
                                              /*optional=*/true);
  detail::read_fq_tensor(f, name, "activation_post_process.min_val", {}, lo);
  detail::read_fq_tensor(f, name, "activation_post_process.max_val", {}, hi);
  for (const auto& [key, v] : {std::pair<const char*, std::uint8_t>{"fake_quant_enabled", fq_on},
                               {"observer_enabled", obs_on}}) {
    if (v > 1) {
      detail::fq_fail(f, name,
                      "tensor '" + detail::fq_key(name, key) + "' holds " + std::to_string(v) +
                          "; a switch is 0 (off) or 1 (on).");
    }
  }
  constexpr float flt_eps = std::numeric_limits<float>::epsilon();
  if (has_eps && std::bit_cast<std::uint32_t>(eps) != std::bit_cast<std::uint32_t>(flt_eps)) {
    detail::fq_fail(f, name,
                    "tensor '" + detail::fq_key(name, "activation_post_process.eps") + "' is " +
                        detail::fq_number(eps) + ", but hone's quantizer uses float32's epsilon " +
                        detail::fq_number(flt_eps) +
                        " (torch's default); a FakeQuantize with another eps cannot be restored "
                        "here.");
  }
  s.fake_quant_enabled = fq_on == 1;
  s.observer_enabled = obs_on == 1;
  constexpr float inf = std::numeric_limits<float>::infinity();
  s.seen = !(lo == inf && hi == -inf);  // torch's test for a fresh observer
  if (s.seen) s.range = {lo, hi};
  if (f.metadata().contains(detail::fq_key(name, "hone.observations"))) {
    const std::string& count = detail::fq_metadata(f, name, "hone.observations");
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(count.c_str(), &end, 10);
    if (count.empty() || count[0] < '0' || count[0] > '9' || *end != '\0' || errno != 0) {
      detail::fq_fail(f, name,
                      "the metadata " + detail::fq_key(name, "hone.observations") + " is '" +
                          count + "', not a count of batches.");
    }
    s.observations = n;
    activation_fake_quant_options& o = s.options;
    const std::string& observer = detail::fq_metadata(f, name, "hone.observer");
    if (observer == "minmax") {
      o.observer = fake_quant_observer::minmax;
    } else if (observer == "moving_average_minmax") {
      o.observer = fake_quant_observer::moving_average_minmax;
    } else {
      detail::fq_fail(f, name,
                      "the metadata " + detail::fq_key(name, "hone.observer") + " is '" + observer +
                          "'; it is 'moving_average_minmax' or 'minmax'.");
    }
    const std::string& c = detail::fq_metadata(f, name, "hone.averaging_constant");
    end = nullptr;
    o.averaging_constant = std::strtof(c.c_str(), &end);
    if (c.empty() || *end != '\0') {
      detail::fq_fail(f, name,
                      "the metadata " + detail::fq_key(name, "hone.averaging_constant") + " is '" +
                          c + "', not a number.");
    }
    const std::string& scheme = detail::fq_metadata(f, name, "hone.qscheme");
    if (scheme == "per_tensor_affine") {
      o.scheme = fake_quant_scheme::affine;
    } else if (scheme == "per_tensor_symmetric") {
      o.scheme = fake_quant_scheme::symmetric;
    } else {
      detail::fq_fail(f, name,
                      "the metadata " + detail::fq_key(name, "hone.qscheme") + " is '" + scheme +
                          "'; it is 'per_tensor_affine' or 'per_tensor_symmetric'.");
    }
    const std::int64_t qmin = detail::fq_metadata_integer(f, name, "hone.quant_min");
    const std::int64_t qmax = detail::fq_metadata_integer(f, name, "hone.quant_max");
    if (qmin < -32768 || qmax > 65535 || qmin >= qmax) {
      detail::fq_fail(f, name,
                      "the metadata's codes [" + std::to_string(qmin) + ", " +
                          std::to_string(qmax) +
                          "] are not a code range (-32768 <= quant_min < quant_max <= 65535).");
    }
    o.quant_min = static_cast<std::int32_t>(qmin);
    o.quant_max = static_cast<std::int32_t>(qmax);
  } else {
    s.options = options;  // torch's file: the options are the caller's
    s.observations = s.seen ? 1 : 0;
  }
  const std::string problem = detail::fake_quant_state_problem(s, options);
  if (!problem.empty()) detail::fq_fail(f, name, problem);
  return s;
}

/// Restores every quantizer of `q` from `f`: all are read and checked first, so a refused file
/// changes none of them (checkpoint_error; config_error for a name given twice).
inline void read_fake_quants(const checkpoint::tensor_file& f,
                             std::span<const named_fake_quant> q) {
  detail::check_distinct_fake_quant_names(q, "hone::compress::read_fake_quants");
  std::vector<activation_fake_quant_state> states;
  states.reserve(q.size());
  for (const named_fake_quant& n : q) {
    states.push_back(read_fake_quant_state(f, n.name, n.quantizer.options()));
  }
  for (std::size_t i = 0; i < q.size(); ++i) q[i].quantizer.restore(states[i]);
}
inline void read_fake_quants(const checkpoint::tensor_file& f,
                             std::initializer_list<named_fake_quant> q) {
  read_fake_quants(f, std::span<const named_fake_quant>(q.begin(), q.size()));
}

/// Restores the quantizers saved by capture_fake_quants from checkpoint directory `dir`
/// (quantizers.safetensors); checkpoint_error when the file is missing or refused.
inline void restore_fake_quants(const std::filesystem::path& dir,
                                std::span<const named_fake_quant> q) {
  const std::filesystem::path path = dir / fake_quant_file;
  if (!std::filesystem::exists(path)) {
    throw checkpoint_error("hone::compress::restore_fake_quants: " + path.string() +
                           ": no such file; the checkpoint was saved without "
                           "capture_fake_quants().");
  }
  read_fake_quants(checkpoint::tensor_file::open(path), q);
}
inline void restore_fake_quants(const std::filesystem::path& dir,
                                std::initializer_list<named_fake_quant> q) {
  restore_fake_quants(dir, std::span<const named_fake_quant>(q.begin(), q.size()));
}

}  // namespace compress
HONE_NAMESPACE_END

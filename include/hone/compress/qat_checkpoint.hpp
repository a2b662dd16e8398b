// hone/compress/qat_checkpoint.hpp: the state of activation fake quantizers (qat_activations.hpp,
// qat_activations_per_channel.hpp)
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
// A per-channel quantizer (activation_fake_quant_per_channel, qat_activations_per_channel.hpp)
// has the same seven tensors in torch's per-channel shapes (a FakeQuantize whose observer is
// MovingAveragePerChannelMinMaxObserver or PerChannelMinMaxObserver), C the channel count:
//   N.scale F32 [C], N.zero_point I32 [C]  ([1] = {1} and [1] = {0} before the first batch)
//   N.activation_post_process.min_val / max_val F32 [C]  ([0]: empty, before the first batch)
// with N.hone.qscheme "per_channel_affine" or "per_channel_symmetric" and N.hone.channels (C).
// Sets of per-channel quantizers go through the same functions (named_fake_quant_per_channel);
// read_fake_quants / restore_fake_quants / capture_fake_quants take a per-tensor set and a
// per-channel set together for one all-or-nothing file.
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

#include <algorithm>
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
#include "hone/compress/qat_activations_per_channel.hpp"
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

/// A per-channel quantizer and the name (prefix) of its tensors.
struct named_fake_quant_per_channel {
  std::string name;
  activation_fake_quant_per_channel& quantizer;
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

/// The state of a set of named quantizers (per tensor and per channel) as torch's FakeQuantize
/// tensors and hone's metadata (see the top of this file), copied out when added: what add_to()
/// hands a tensor_writer (which borrows the tensors: keep this object alive until the file is
/// written) or a snapshot (which copies them).
class fake_quant_tensors {
 public:
  fake_quant_tensors() = default;
  explicit fake_quant_tensors(std::span<const named_fake_quant> q) {
    for (const named_fake_quant& n : q) add(n.name, n.quantizer);
  }
  fake_quant_tensors(std::initializer_list<named_fake_quant> q)
      : fake_quant_tensors(std::span<const named_fake_quant>(q.begin(), q.size())) {}
  explicit fake_quant_tensors(std::span<const named_fake_quant_per_channel> q) {
    for (const named_fake_quant_per_channel& n : q) add(n.name, n.quantizer);
  }
  fake_quant_tensors(std::initializer_list<named_fake_quant_per_channel> q)
      : fake_quant_tensors(std::span<const named_fake_quant_per_channel>(q.begin(), q.size())) {}

  /// Copies quantizer `fq`'s state under `name` ("" for no prefix). config_error when the name is
  /// already taken.
  void add(std::string name, const activation_fake_quant& fq) {
    const activation_fake_quant_state s = fq.state();
    record& r = new_record(std::move(name), s.options, s.observations, s.fake_quant_enabled,
                           s.observer_enabled);
    r.scale = {s.qparams.scale};
    r.zero_point = {s.qparams.zero_point};
    r.min_val = {s.seen ? s.range.lo : std::numeric_limits<float>::infinity()};
    r.max_val = {s.seen ? s.range.hi : -std::numeric_limits<float>::infinity()};
  }

  /// Copies per-channel quantizer `fq`'s state under `name` (torch's per-channel shapes: scale,
  /// zero point, min_val and max_val of [channels]; [1], [1], [0], [0] before the first batch).
  void add(std::string name, const activation_fake_quant_per_channel& fq) {
    activation_fake_quant_per_channel_state s = fq.state();
    record& r = new_record(std::move(name), s.options, s.observations, s.fake_quant_enabled,
                           s.observer_enabled);
    r.channels = s.channels;
    r.scale = std::move(s.scale);
    r.zero_point = std::move(s.zero_point);
    r.min_val = std::move(s.min_val);
    r.max_val = std::move(s.max_val);
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
    activation_fake_quant_options options;
    std::uint64_t observations = 0;
    std::size_t channels = 0;  // 0: per tensor
    std::uint8_t fake_quant_enabled = 1, observer_enabled = 1;
    float eps = std::numeric_limits<float>::epsilon();
    std::vector<float> scale, min_val, max_val;
    std::vector<std::int32_t> zero_point;
  };
  struct tensor {
    std::string key;
    io::dtype type;
    checkpoint::shape_type shape;
    std::span<const std::byte> bytes;
  };

  record& new_record(std::string name, const activation_fake_quant_options& o,
                     std::uint64_t observations, bool fq_on, bool obs_on) {
    for (const record& r : records_) {
      HONE_REQUIRE(r.name != name,
                   "hone::compress::fake_quant_tensors::add: two quantizers are named '" + name +
                       "'; each quantizer needs its own name (its tensors' prefix).");
    }
    record& r = records_.emplace_back();
    r.name = std::move(name);
    r.options = o;
    r.observations = observations;
    r.fake_quant_enabled = fq_on ? 1 : 0;
    r.observer_enabled = obs_on ? 1 : 0;
    return r;
  }

  template <class T>
  static std::span<const std::byte> bytes_of(const std::vector<T>& v) noexcept {
    return std::as_bytes(std::span<const T>(v));
  }

  static std::vector<tensor> tensors(const record& r) {
    const std::string& n = r.name;
    using shape = checkpoint::shape_type;
    // per tensor: min_val / max_val are 0-d; per channel: [channels] ([0] before a batch)
    const shape range = r.channels == 0 ? shape{} : shape{r.min_val.size()};
    return {
        {detail::fq_key(n, "fake_quant_enabled"),
         io::dtype::u8,
         {1},
         std::as_bytes(std::span<const std::uint8_t>(&r.fake_quant_enabled, 1))},
        {detail::fq_key(n, "observer_enabled"),
         io::dtype::u8,
         {1},
         std::as_bytes(std::span<const std::uint8_t>(&r.observer_enabled, 1))},
        {detail::fq_key(n, "scale"), io::dtype::f32, {r.scale.size()}, bytes_of(r.scale)},
        {detail::fq_key(n, "zero_point"),
         io::dtype::i32,
         {r.zero_point.size()},
         bytes_of(r.zero_point)},
        {detail::fq_key(n, "activation_post_process.eps"),
         io::dtype::f32,
         {1},
         std::as_bytes(std::span<const float>(&r.eps, 1))},
        {detail::fq_key(n, "activation_post_process.min_val"), io::dtype::f32, range,
         bytes_of(r.min_val)},
        {detail::fq_key(n, "activation_post_process.max_val"), io::dtype::f32, range,
         bytes_of(r.max_val)},
    };
  }

  static std::vector<std::pair<std::string, std::string>> metadata(const record& r) {
    const activation_fake_quant_options& o = r.options;
    char c[32];
    std::snprintf(c, sizeof c, "%.9g", static_cast<double>(o.averaging_constant));
    const std::string& n = r.name;
    const std::string granularity = r.channels == 0 ? "per_tensor_" : "per_channel_";
    std::vector<std::pair<std::string, std::string>> m = {
        {detail::fq_key(n, "hone.observations"), std::to_string(r.observations)},
        {detail::fq_key(n, "hone.observer"),
         o.observer == fake_quant_observer::minmax ? "minmax" : "moving_average_minmax"},
        {detail::fq_key(n, "hone.averaging_constant"), c},
        {detail::fq_key(n, "hone.qscheme"),
         granularity + (o.scheme == fake_quant_scheme::symmetric ? "symmetric" : "affine")},
        {detail::fq_key(n, "hone.quant_min"), std::to_string(o.quant_min)},
        {detail::fq_key(n, "hone.quant_max"), std::to_string(o.quant_max)},
    };
    if (r.channels > 0)
      m.emplace_back(detail::fq_key(n, "hone.channels"), std::to_string(r.channels));
    return m;
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
/// Adds the quantizers' state, per tensor and per channel, to snapshot `s` (one file).
inline void capture_fake_quants(checkpoint::snapshot& s,
                                std::span<const named_fake_quant> per_tensor,
                                std::span<const named_fake_quant_per_channel> per_channel) {
  fake_quant_tensors t(per_tensor);
  for (const named_fake_quant_per_channel& n : per_channel) t.add(n.name, n.quantizer);
  t.add_to(s);
}
inline void capture_fake_quants(checkpoint::snapshot& s,
                                std::initializer_list<named_fake_quant> per_tensor,
                                std::initializer_list<named_fake_quant_per_channel> per_channel) {
  capture_fake_quants(
      s, std::span<const named_fake_quant>(per_tensor.begin(), per_tensor.size()),
      std::span<const named_fake_quant_per_channel>(per_channel.begin(), per_channel.size()));
}
inline void capture_fake_quants(checkpoint::snapshot& s,
                                std::initializer_list<named_fake_quant_per_channel> q) {
  capture_fake_quants(s, {}, std::span<const named_fake_quant_per_channel>(q.begin(), q.size()));
}

namespace detail {

/// Reads quantizer `name`'s switches and eps (checked) into `s`'s switches.
template <class State>
void read_fq_switches(const checkpoint::tensor_file& f, const std::string& name, State& s) {
  std::uint8_t fq_on = 0, obs_on = 0;
  float eps = 0.0f;
  read_fq_tensor(f, name, "fake_quant_enabled", {1}, fq_on);
  read_fq_tensor(f, name, "observer_enabled", {1}, obs_on);
  const bool has_eps = read_fq_tensor(f, name, "activation_post_process.eps", {1}, eps,
                                      /*optional=*/true);
  for (const auto& [key, v] : {std::pair<const char*, std::uint8_t>{"fake_quant_enabled", fq_on},
                               {"observer_enabled", obs_on}}) {
    if (v > 1) {
      fq_fail(f, name,
              "tensor '" + fq_key(name, key) + "' holds " + std::to_string(v) +
                  "; a switch is 0 (off) or 1 (on).");
    }
  }
  constexpr float flt_eps = std::numeric_limits<float>::epsilon();
  if (has_eps && std::bit_cast<std::uint32_t>(eps) != std::bit_cast<std::uint32_t>(flt_eps)) {
    fq_fail(f, name,
            "tensor '" + fq_key(name, "activation_post_process.eps") + "' is " + fq_number(eps) +
                ", but hone's quantizer uses float32's epsilon " + fq_number(flt_eps) +
                " (torch's default); a FakeQuantize with another eps cannot be restored here.");
  }
  s.fake_quant_enabled = fq_on == 1;
  s.observer_enabled = obs_on == 1;
}

/// Reads hone's metadata of quantizer `name` (the options and the observations count) into `o`
/// and `observations`; false, reading nothing, for a file without it (torch's).
inline bool read_fq_metadata(const checkpoint::tensor_file& f, const std::string& name,
                             bool per_channel, activation_fake_quant_options& o,
                             std::uint64_t& observations) {
  if (!f.metadata().contains(fq_key(name, "hone.observations"))) return false;
  const std::string& count = fq_metadata(f, name, "hone.observations");
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(count.c_str(), &end, 10);
  if (count.empty() || count[0] < '0' || count[0] > '9' || *end != '\0' || errno != 0) {
    fq_fail(f, name,
            "the metadata " + fq_key(name, "hone.observations") + " is '" + count +
                "', not a count of batches.");
  }
  observations = n;
  const std::string& observer = fq_metadata(f, name, "hone.observer");
  if (observer == "minmax") {
    o.observer = fake_quant_observer::minmax;
  } else if (observer == "moving_average_minmax") {
    o.observer = fake_quant_observer::moving_average_minmax;
  } else {
    fq_fail(f, name,
            "the metadata " + fq_key(name, "hone.observer") + " is '" + observer +
                "'; it is 'moving_average_minmax' or 'minmax'.");
  }
  const std::string& c = fq_metadata(f, name, "hone.averaging_constant");
  end = nullptr;
  o.averaging_constant = std::strtof(c.c_str(), &end);
  if (c.empty() || *end != '\0') {
    fq_fail(f, name,
            "the metadata " + fq_key(name, "hone.averaging_constant") + " is '" + c +
                "', not a number.");
  }
  const std::string& scheme = fq_metadata(f, name, "hone.qscheme");
  const std::string mine = per_channel ? "per_channel_" : "per_tensor_";
  const std::string other = per_channel ? "per_tensor_" : "per_channel_";
  if (scheme == mine + "affine") {
    o.scheme = fake_quant_scheme::affine;
  } else if (scheme == mine + "symmetric") {
    o.scheme = fake_quant_scheme::symmetric;
  } else if (scheme == other + "affine" || scheme == other + "symmetric") {
    fq_fail(f, name,
            "the metadata " + fq_key(name, "hone.qscheme") + " is '" + scheme +
                "': the file holds a " + (per_channel ? "per-tensor" : "per-channel") +
                " quantizer; restore it into an activation_fake_quant" +
                (per_channel ? "" : "_per_channel") + ".");
  } else {
    fq_fail(f, name,
            "the metadata " + fq_key(name, "hone.qscheme") + " is '" + scheme + "'; it is '" +
                mine + "affine' or '" + mine + "symmetric'.");
  }
  const std::int64_t qmin = fq_metadata_integer(f, name, "hone.quant_min");
  const std::int64_t qmax = fq_metadata_integer(f, name, "hone.quant_max");
  if (qmin < -32768 || qmax > 65535 || qmin >= qmax) {
    fq_fail(f, name,
            "the metadata's codes [" + std::to_string(qmin) + ", " + std::to_string(qmax) +
                "] are not a code range (-32768 <= quant_min < quant_max <= 65535).");
  }
  o.quant_min = static_cast<std::int32_t>(qmin);
  o.quant_max = static_cast<std::int32_t>(qmax);
  return true;
}

/// Reads quantizer `name`'s 1-d tensor `key` of T (any length) into `out`.
template <class T>
void read_fq_vector(const checkpoint::tensor_file& f, const std::string& name, std::string_view key,
                    std::vector<T>& out) {
  const std::string k = fq_key(name, key);
  const checkpoint::tensor_info* t = f.find(k);
  if (t == nullptr) {
    T unused{};
    read_fq_tensor(f, name, key, {1}, unused);  // fails with the missing tensor's sentence
  }
  constexpr io::dtype type = io::dtype_of<T>;
  if (t->type != type || t->shape.size() != 1) {
    fq_fail(f, name,
            "tensor '" + k + "' is " + std::string(io::dtype_name(t->type)) + " of shape " +
                checkpoint::shape_string(t->shape) +
                ", but torch's per-channel FakeQuantize stores it as " +
                std::string(io::dtype_name(type)) +
                " of shape [channels] (is this a per-tensor quantizer's file?).");
  }
  out.assign(static_cast<std::size_t>(t->shape[0]), T{});
  if (!out.empty()) f.read(*t, std::as_writable_bytes(std::span<T>(out)));
}

}  // namespace detail

/// Reads the state of quantizer `name` from `f` for a quantizer with options `options` (see the
/// top of this file for the layout, the defaults of a torch-written file and the errors); changes
/// nothing.
[[nodiscard]] inline activation_fake_quant_state read_fake_quant_state(
    const checkpoint::tensor_file& f, const std::string& name,
    const activation_fake_quant_options& options) {
  activation_fake_quant_state s;
  float lo = 0.0f, hi = 0.0f;
  detail::read_fq_switches(f, name, s);
  detail::read_fq_tensor(f, name, "scale", {1}, s.qparams.scale);
  detail::read_fq_tensor(f, name, "zero_point", {1}, s.qparams.zero_point);
  detail::read_fq_tensor(f, name, "activation_post_process.min_val", {}, lo);
  detail::read_fq_tensor(f, name, "activation_post_process.max_val", {}, hi);
  constexpr float inf = std::numeric_limits<float>::infinity();
  s.seen = !(lo == inf && hi == -inf);  // torch's test for a fresh observer
  if (s.seen) s.range = {lo, hi};
  if (!detail::read_fq_metadata(f, name, /*per_channel=*/false, s.options, s.observations)) {
    s.options = options;  // torch's file: the options are the caller's
    s.observations = s.seen ? 1 : 0;
  }
  const std::string problem = detail::fake_quant_state_problem(s, options);
  if (!problem.empty()) detail::fq_fail(f, name, problem);
  return s;
}

/// Reads the state of per-channel quantizer `name` from `f` for a quantizer of `channels`
/// channels with options `options` (torch's per-channel layout: see the top of this file);
/// changes nothing.
[[nodiscard]] inline activation_fake_quant_per_channel_state read_fake_quant_per_channel_state(
    const checkpoint::tensor_file& f, const std::string& name,
    const activation_fake_quant_options& options, std::size_t channels) {
  activation_fake_quant_per_channel_state s;
  detail::read_fq_switches(f, name, s);
  detail::read_fq_vector(f, name, "scale", s.scale);
  detail::read_fq_vector(f, name, "zero_point", s.zero_point);
  detail::read_fq_vector(f, name, "activation_post_process.min_val", s.min_val);
  detail::read_fq_vector(f, name, "activation_post_process.max_val", s.max_val);
  s.channels = channels;
  if (detail::read_fq_metadata(f, name, /*per_channel=*/true, s.options, s.observations)) {
    const std::int64_t c = detail::fq_metadata_integer(f, name, "hone.channels");
    if (c <= 0) {
      detail::fq_fail(f, name,
                      "the metadata " + detail::fq_key(name, "hone.channels") + " is " +
                          std::to_string(c) + "; a channel count is positive.");
    }
    s.channels = static_cast<std::size_t>(c);
  } else {
    s.options = options;  // torch's file: the options are the caller's
    s.observations = s.seen() ? 1 : 0;
  }
  const std::string problem = detail::fake_quant_per_channel_state_problem(s, options, channels);
  if (!problem.empty()) detail::fq_fail(f, name, problem);
  return s;
}

/// Restores every quantizer of `per_tensor` and `per_channel` from `f`: all are read and checked
/// first, so a refused file changes none of them (checkpoint_error; config_error for a name given
/// twice, in either set).
inline void read_fake_quants(const checkpoint::tensor_file& f,
                             std::span<const named_fake_quant> per_tensor,
                             std::span<const named_fake_quant_per_channel> per_channel) {
  constexpr const char* who = "hone::compress::read_fake_quants";
  detail::check_distinct_fake_quant_names(per_tensor, who);
  for (std::size_t i = 0; i < per_channel.size(); ++i) {
    const std::string& n = per_channel[i].name;
    const bool twice =
        std::ranges::any_of(per_channel.first(i),
                            [&](const named_fake_quant_per_channel& o) { return o.name == n; }) ||
        std::ranges::any_of(per_tensor, [&](const named_fake_quant& o) { return o.name == n; });
    HONE_REQUIRE(!twice, std::string(who) + ": two quantizers are named '" + n +
                             "'; each quantizer needs its own name (its tensors' prefix).");
  }
  std::vector<activation_fake_quant_state> states;
  states.reserve(per_tensor.size());
  for (const named_fake_quant& n : per_tensor) {
    states.push_back(read_fake_quant_state(f, n.name, n.quantizer.options()));
  }
  std::vector<activation_fake_quant_per_channel_state> pc_states;
  pc_states.reserve(per_channel.size());
  for (const named_fake_quant_per_channel& n : per_channel) {
    pc_states.push_back(read_fake_quant_per_channel_state(f, n.name, n.quantizer.options(),
                                                          n.quantizer.channels()));
  }
  for (std::size_t i = 0; i < per_tensor.size(); ++i) per_tensor[i].quantizer.restore(states[i]);
  for (std::size_t i = 0; i < per_channel.size(); ++i) {
    per_channel[i].quantizer.restore(pc_states[i]);
  }
}
inline void read_fake_quants(const checkpoint::tensor_file& f,
                             std::span<const named_fake_quant> q) {
  read_fake_quants(f, q, {});
}
inline void read_fake_quants(const checkpoint::tensor_file& f,
                             std::span<const named_fake_quant_per_channel> q) {
  read_fake_quants(f, {}, q);
}
inline void read_fake_quants(const checkpoint::tensor_file& f,
                             std::initializer_list<named_fake_quant> q) {
  read_fake_quants(f, std::span<const named_fake_quant>(q.begin(), q.size()), {});
}
inline void read_fake_quants(const checkpoint::tensor_file& f,
                             std::initializer_list<named_fake_quant> per_tensor,
                             std::initializer_list<named_fake_quant_per_channel> per_channel) {
  read_fake_quants(
      f, std::span<const named_fake_quant>(per_tensor.begin(), per_tensor.size()),
      std::span<const named_fake_quant_per_channel>(per_channel.begin(), per_channel.size()));
}
inline void read_fake_quants(const checkpoint::tensor_file& f,
                             std::initializer_list<named_fake_quant_per_channel> q) {
  read_fake_quants(f, {}, std::span<const named_fake_quant_per_channel>(q.begin(), q.size()));
}

/// Restores the quantizers saved by capture_fake_quants from checkpoint directory `dir`
/// (quantizers.safetensors); checkpoint_error when the file is missing or refused.
inline void restore_fake_quants(const std::filesystem::path& dir,
                                std::span<const named_fake_quant> per_tensor,
                                std::span<const named_fake_quant_per_channel> per_channel) {
  const std::filesystem::path path = dir / fake_quant_file;
  if (!std::filesystem::exists(path)) {
    throw checkpoint_error("hone::compress::restore_fake_quants: " + path.string() +
                           ": no such file; the checkpoint was saved without "
                           "capture_fake_quants().");
  }
  read_fake_quants(checkpoint::tensor_file::open(path), per_tensor, per_channel);
}
inline void restore_fake_quants(const std::filesystem::path& dir,
                                std::span<const named_fake_quant> q) {
  restore_fake_quants(dir, q, {});
}
inline void restore_fake_quants(const std::filesystem::path& dir,
                                std::initializer_list<named_fake_quant> q) {
  restore_fake_quants(dir, std::span<const named_fake_quant>(q.begin(), q.size()), {});
}
inline void restore_fake_quants(const std::filesystem::path& dir,
                                std::initializer_list<named_fake_quant> per_tensor,
                                std::initializer_list<named_fake_quant_per_channel> per_channel) {
  restore_fake_quants(
      dir, std::span<const named_fake_quant>(per_tensor.begin(), per_tensor.size()),
      std::span<const named_fake_quant_per_channel>(per_channel.begin(), per_channel.size()));
}
inline void restore_fake_quants(const std::filesystem::path& dir,
                                std::initializer_list<named_fake_quant_per_channel> q) {
  restore_fake_quants(dir, {}, std::span<const named_fake_quant_per_channel>(q.begin(), q.size()));
}

}  // namespace compress
HONE_NAMESPACE_END

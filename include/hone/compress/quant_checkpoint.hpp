// hone/compress/quant_checkpoint.hpp: quantized weights in hone's tensor files (safetensors or the
// compressed format). A quantized_weights `q` under name N is two tensors:
//   N.qweight  I8  [rows, cols]   the codes
//   N.scale    F32 [rows]         per_channel scales, or [] (a scalar) for per_tensor
// (the shapes follow PyTorch's quantized tensors: 1-D per-channel scales, a scalar per-tensor
// scale). docs/quant.md.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hone/checkpoint/tensor_file.hpp"
#include "hone/checkpoint/tensor_writer.hpp"
#include "hone/compress/quant.hpp"
#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

/// Adds q's two tensors to the writer under `name`. The writer borrows q's storage: q must stay
/// alive and unchanged until the file is written.
inline void add_quantized(checkpoint::tensor_writer& w, const std::string& name,
                          const quantized_weights& q) {
  w.add(name + ".qweight", checkpoint::shape_type{q.rows, q.cols}, q.values);
  if (q.granularity == quant_granularity::per_tensor) {
    w.add(name + ".scale", checkpoint::shape_type{}, q.scales);
  } else {
    w.add(name + ".scale", checkpoint::shape_type{q.rows}, q.scales);
  }
}

/// Reads the quantized weights stored under `name` by add_quantized; checkpoint_error naming the
/// file and tensor when a tensor is missing or has the wrong dtype or shape.
[[nodiscard]] inline quantized_weights read_quantized(const checkpoint::tensor_file& f,
                                                      const std::string& name) {
  const auto bad = [&](const std::string& what) {
    // The same form as the checkpoint readers' messages: "hone: '<file>': ...".
    throw checkpoint_error("hone: '" + f.context() + "': quantized weights '" + name +
                           "': " + what);
  };
  const checkpoint::tensor_info& qt = f.at(name + ".qweight");
  const checkpoint::tensor_info& st = f.at(name + ".scale");
  if (qt.type != io::dtype::i8 || qt.shape.size() != 2) {
    bad("the codes must be a 2-D I8 tensor, but are " + std::string(io::dtype_name(qt.type)) +
        " of shape " + checkpoint::shape_string(qt.shape) + ".");
  }
  if (st.type != io::dtype::f32) {
    bad("the scales must be F32, but are " + std::string(io::dtype_name(st.type)) + ".");
  }
  quantized_weights q;
  q.rows = static_cast<std::size_t>(qt.shape[0]);
  q.cols = static_cast<std::size_t>(qt.shape[1]);
  if (st.shape.empty()) {
    q.granularity = quant_granularity::per_tensor;
  } else if (st.shape.size() == 1 && st.shape[0] == qt.shape[0]) {
    q.granularity = quant_granularity::per_channel;
  } else {
    bad("the scales have shape " + checkpoint::shape_string(st.shape) +
        "; they must be [] (per tensor) or [" + std::to_string(q.rows) + "] (one per row).");
  }
  q.values = f.read_as<std::int8_t>(name + ".qweight");
  q.scales = f.read_as<float>(name + ".scale");
  for (std::size_t i = 0; i < q.scales.size(); ++i) {
    if (!(q.scales[i] >= 0.0f) || !std::isfinite(q.scales[i])) {
      bad("scale " + std::to_string(i) + " is " + std::to_string(q.scales[i]) +
          "; scales must be finite and non-negative.");
    }
  }
  for (std::size_t i = 0; i < q.values.size(); ++i) {
    if (q.values[i] == -128) {
      bad("the code at index " + detail::quant_index(i, q.cols) +
          " is -128; symmetric int8 codes lie in [-127, 127].");
    }
  }
  return q;
}

}  // namespace compress
HONE_NAMESPACE_END

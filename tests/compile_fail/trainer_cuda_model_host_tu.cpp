// Must not compile: a model with device memory (hone::device_span views) trained from a plain
// C++ translation unit; the CUDA trainer lives in hone/train/cuda/trainer.cuh.
#include <hone/core/device_span.hpp>
#include <hone/train/trainer.hpp>
#include <string>
#include <vector>
struct device_param {
  std::string name;
  std::vector<std::size_t> shape;
  hone::device_span<float> value, grad;
};
struct net {
  float* w = nullptr;
  float* g = nullptr;
  std::vector<device_param> parameters() { return {{"w", {1}, {w, 1}, {g, 1}}}; }
};
int main() {
  net n;
  hone::trainer t(n);
}

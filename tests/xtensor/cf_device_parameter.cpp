// Must not compile: an xtensor view of a parameter whose views are device_span (device memory).
#include <hone/core/device_span.hpp>
#include <hone/core/model.hpp>
#include <hone/xtensor/adapt.hpp>
#include <string>
#include <vector>

struct device_param {
  std::string name;
  std::vector<std::size_t> shape;
  hone::device_span<float> value;
  hone::device_span<float> grad;
};
static_assert(hone::parameter_like<device_param>);

int main() {
  const device_param p{"w", {2}, {nullptr, 2}, {nullptr, 2}};
  auto v = hone::xtensor::value(p);
  return static_cast<int>(v.size());
}

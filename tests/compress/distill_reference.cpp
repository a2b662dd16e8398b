// tests/compress/distill_reference.cpp: the long double reference of distill_reference.hpp for the
// GPU test, compiled by the host compiler and handed over in double.
#include "distill_reference.hpp"

namespace distill_test {
reference_double compute_double(std::size_t batch, std::size_t classes, const std::vector<float>& s,
                                const std::vector<float>& t,
                                const std::vector<std::int32_t>& labels, double temperature,
                                double alpha, double grad_scale) {
  const reference r = compute(batch, classes, s, t, labels, temperature, alpha, grad_scale);
  reference_double d{
      static_cast<double>(r.loss), static_cast<double>(r.kl), static_cast<double>(r.ce), {}};
  d.grad.assign(r.grad.begin(), r.grad.end());
  return d;
}
}  // namespace distill_test

// A trainer whose weights live on a CUDA device cannot be captured by the host capture(): the
// message names the header with the device overload.
#include <hone/checkpoint/trainer_checkpoint.hpp>
struct device_trainer_like {
  using space_type = hone::cuda_space;
  using working_type = float;
};
int main() {
  device_trainer_like t;
  hone::checkpoint::snapshot s;
  hone::checkpoint::capture(t, s);
  return 0;
}

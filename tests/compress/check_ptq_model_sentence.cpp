// Must not compile: check_ptq_model says which member of the post-training quantization hook the
// model lacks.
#include <hone/compress/ptq.hpp>

struct net {
  std::vector<hone::compress::quantizable_layer> quantizable_layers() const { return {}; }
};
static_assert(hone::compress::check_ptq_model<net>());
int main() {}

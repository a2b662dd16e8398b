// Must not compile: check_neuron_prunable says which member of the structured-pruning hook the
// model lacks.
#include <hone/compress/structured.hpp>

struct net {
  std::size_t neuron_layer_count() const { return 1; }
  hone::compress::neuron_layer_view neuron_layer(std::size_t) const { return {}; }
};
static_assert(hone::compress::check_neuron_prunable<net>());
int main() {}

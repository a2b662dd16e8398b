// hone::compiled: the out-of-line definitions of the functions that hone's headers only declare
// with separate compilation (core/detail/separate_compilation.hpp): parameter-group resolution
// and the optimizers' argument checks, clip_grad_norm's coefficient and checks,
// one_cycle::validate, the chunk table of the tensor-list passes and the oneTBB body of
// parallel_ranges. Including the headers with HONE_COMPILED_LIBRARY set is what defines them
// here, from the very text the header-only mode compiles inline.
#define HONE_COMPILED_LIBRARY 1

#include "hone/core/multi_tensor.hpp"
#include "hone/core/parallel.hpp"
#include "hone/optim/adamw.hpp"
#include "hone/optim/clipping.hpp"
#include "hone/optim/optimizer.hpp"
#include "hone/schedule/one_cycle.hpp"

#if !defined(HONE_SEPARATE_COMPILATION)
#error "hone::compiled's sources are compiled with HONE_SEPARATE_COMPILATION (CMakeLists.txt)"
#endif

// Compile-time benchmark, translation unit 3: a file that includes what the README's element-wise
// route needs (hone::for_each over tensor lists, arenas, the model concept) and nothing else: the
// core module's umbrella when the installed hone has one, else the all-in-one <hone/hone.hpp>
// (older releases).
#if __has_include(<hone/core.hpp>)
#include <hone/core.hpp>
#else
#include <hone/hone.hpp>
#endif

// Compile-time benchmark, translation unit 1: a file that includes hone's umbrella header and
// nothing else. Its compile time is what every user file pays before writing a line of its own.
#include <hone/hone.hpp>

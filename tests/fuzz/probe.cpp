// Configure-time probe: the compiler builds a libFuzzer target that uses std::source_location, as
// custody's errors do (clang++ before 15 lacks it with libstdc++).
#include <cstddef>
#include <cstdint>
#include <source_location>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) {
    return std::source_location::current().line() == 0 ? 1 : 0;
}

// The one Catch2 include of the test suites: Catch2 v2 (the single header Debian ships) or v3 (the
// compiled library other distributions and the CUDA containers ship). A test file includes this
// instead of a Catch2 header; the file that defines main() defines CATCH_CONFIG_RUNNER first, which
// makes v2's header compile its implementation there and is ignored by v3, whose implementation is
// in its library.
#pragma once

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
using Catch::Approx;
#define CUSTODY_CATCH_CONTAINS ::Catch::Matchers::ContainsSubstring
#else
#include <catch2/catch.hpp>
#define CUSTODY_CATCH_CONTAINS ::Catch::Matchers::Contains
#endif

#include <string>

namespace custody_test {

// A matcher for a string that holds `text`, under either major version.
inline auto contains(const std::string& text) { return CUSTODY_CATCH_CONTAINS(text); }

}  // namespace custody_test

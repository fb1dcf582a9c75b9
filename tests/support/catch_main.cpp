// The Catch2 main for the host suites.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

// EXPECT(cond) for the test programs compiled with nvcc, which do not use Catch: prints the failed
// condition with its place and returns 1 from the enclosing function.
#pragma once

#include <cstdio>

#define EXPECT(cond)                                                                                  \
    do {                                                                                              \
        if (!(cond)) {                                                                                \
            std::fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond);                   \
            return 1;                                                                                 \
        }                                                                                             \
    } while (false)

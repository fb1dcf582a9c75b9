// The contract suite over every cuda-platform resource (runs only where a device is present).
#include "../support/cuda_stream_gate.hpp"
#include "cuda_cases.hpp"

using contract_cases = custody::test::cuda_contract_cases;

#include "contract_suite.hpp"

// The contract suite over every host-platform resource.
#include "host_cases.hpp"

using contract_cases = custody::test::host_contract_cases;

#include "contract_suite.hpp"

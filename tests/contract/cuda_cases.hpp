// The resources the contract suite runs over on the cuda platform.
#pragma once

#include <custody/resource/cuda_async.hpp>
#include <custody/resource/cuda_malloc.hpp>
#include <custody/resource/fault_injecting.hpp>
#include <custody/resource/managed.hpp>
#include <custody/resource/pinned_host.hpp>

#include <cstddef>
#include <memory>
#include <tuple>

namespace custody::test {

template <class R, std::size_t MaxAlignment, bool BlockingFree>
struct cuda_case {
    using resource = R;
    static std::unique_ptr<R> make() { return std::make_unique<R>(0); }
    static constexpr std::size_t max_alignment = MaxAlignment;
    static constexpr bool exhaustible = true;
    static constexpr bool blocking_free = BlockingFree; // cudaFree and cudaFreeHost synchronize
};

struct cuda_fault_injecting_case {
    using resource = custody::resource::fault_injecting<custody::resource::cuda_malloc>;
    static std::unique_ptr<resource> make() { return std::make_unique<resource>(0); }
    static constexpr std::size_t max_alignment = 256;
    static constexpr bool exhaustible = true;
    static constexpr bool blocking_free = true;
};

using cuda_contract_cases =
    std::tuple<cuda_case<custody::resource::cuda_malloc, 256, true>, cuda_case<custody::resource::cuda_async, 256, false>,
               cuda_case<custody::resource::pinned_host, 4096, true>, cuda_case<custody::resource::managed, 256, true>,
               cuda_fault_injecting_case>;

} // namespace custody::test

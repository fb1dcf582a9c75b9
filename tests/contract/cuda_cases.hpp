// The resources the contract suite runs over on the cuda platform.
#pragma once

#include <custody/platform/cuda_vmm.hpp>
#include <custody/resource/cuda_async.hpp>
#include <custody/resource/cuda_malloc.hpp>
#include <custody/resource/fault_injecting.hpp>
#include <custody/resource/managed.hpp>
#include <custody/resource/pinned_host.hpp>
#include <custody/resource/virtual_memory.hpp>

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

/// Device address space reserved up front, granules mapped per block and unmapped when it comes back.
struct cuda_virtual_memory_case {
    using resource = custody::resource::virtual_memory<custody::cuda::vmm>;
    static std::unique_ptr<resource> make() { return std::make_unique<resource>(0, std::size_t{1} << 30); }
    static constexpr std::size_t max_alignment = std::size_t{2} << 20; // the granule of current GPUs
    static constexpr bool exhaustible = true;
    static constexpr bool blocking_free = true; // deallocate on a stream waits for it
};

using cuda_contract_cases =
    std::tuple<cuda_case<custody::resource::cuda_malloc, 256, true>, cuda_case<custody::resource::cuda_async, 256, false>,
               cuda_case<custody::resource::pinned_host, 4096, true>, cuda_case<custody::resource::managed, 256, true>,
               cuda_fault_injecting_case, cuda_virtual_memory_case>;

} // namespace custody::test

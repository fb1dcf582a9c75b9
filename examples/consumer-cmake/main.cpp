// A program built against an installed custody: a std::pmr vector over custody's host memory.
#include <custody/interop/pmr.hpp>
#include <custody/resource/host_memory.hpp>

#include <cstdio>
#include <memory_resource>
#include <numeric>
#include <vector>

int main() {
    custody::resource::host_memory memory;
    custody::interop::pmr_adaptor adaptor(memory);
    long sum = 0;
    {
        std::pmr::vector<int> values(1000, 1, &adaptor);
        sum = std::accumulate(values.begin(), values.end(), 0L);
    }
    const auto stats = memory.statistics();
    std::printf("custody consumer: sum %ld, %llu allocation(s), %zu bytes live\n", sum,
                static_cast<unsigned long long>(stats.allocations), stats.live_bytes);
    const bool proved = sum == 1000 && stats.allocations == 1 && stats.live_bytes == 0;
    std::printf("%s a program built against the installed headers, outside custody's tree, allocates through "
                "custody and leaks nothing\n",
                proved ? "custody consumer proved:" : "custody consumer did NOT prove:");
    return proved ? 0 : 1;
}

// resource/detail/over_aligned.hpp: the alignment pinned_host promises (up to a page) from an
// allocator that guarantees only 256 bytes, as cudaHostAlloc does.
#include <custody/core/align.hpp>
#include <custody/resource/detail/over_aligned.hpp>

#include "../support/catch.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

using over = custody::resource::detail::over_aligned<256>;

TEST_CASE("alignments above the guarantee are served from an over-allocated block", "[resource][align]") {
    // A 256-aligned allocator that is never page-aligned: its blocks start 256 bytes past a page.
    constexpr std::size_t page = 4096;
    for (const std::size_t alignment : {std::size_t{512}, std::size_t{1024}, page}) {
        for (const std::size_t bytes : {std::size_t{1}, std::size_t{100}, std::size_t{5000}}) {
            const std::size_t total = bytes + over::extra(alignment);
            auto* arena = static_cast<std::byte*>(::operator new(total + 2 * page, std::align_val_t{page}));
            std::byte* base = arena + 256; // 256-aligned, not 512-aligned
            void* block = over::place(base, alignment);
            CHECK(custody::is_aligned(block, alignment));
            // The block and the stored word lie inside what was allocated.
            CHECK(static_cast<std::byte*>(block) - sizeof(void*) >= base);
            CHECK(static_cast<std::byte*>(block) + bytes <= base + total);
            std::memset(block, 0xAB, bytes); // the caller's bytes do not touch the stored word
            CHECK(over::base_of(block, alignment) == base);
            ::operator delete(arena, std::align_val_t{page});
        }
    }
}

TEST_CASE("alignments within the guarantee cost nothing", "[resource][align]") {
    alignas(256) static std::byte storage[512];
    CHECK(over::extra(256) == 0);
    CHECK(over::extra(64) == 0);
    CHECK(over::place(storage, 256) == storage);
    CHECK(over::base_of(storage, 256) == storage);
    CHECK(over::extra(4096) == 4096);
}

// merge_reports on reports that claim a huge world: the missing ranks are named without memory
// per rank of the world. This executable's operator new refuses any single request above 64 MiB,
// so an allocation that grows with the claimed world size shows as std::bad_alloc.
#include <custody/debug/json_report.hpp>
#include <custody/debug/merge.hpp>

#include "../support/catch.hpp"

#include <climits>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

namespace {

constexpr std::size_t largest_request = std::size_t{64} << 20;

} // namespace

// g++ sees free() on what this operator new returns once both are inlined, and warns; the pair is
// malloc/free, which match.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {

void* checked_allocate(std::size_t bytes) noexcept {
    return bytes > largest_request ? nullptr : std::malloc(bytes == 0 ? 1 : bytes);
}

} // namespace

// Every replaceable form that pairs with free(), so that no block crosses from the sanitizers'
// operator new to this free.
void* operator new(std::size_t bytes) {
    if (void* p = checked_allocate(bytes)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t bytes) {
    if (void* p = checked_allocate(bytes)) return p;
    throw std::bad_alloc();
}
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept { return checked_allocate(bytes); }
void* operator new[](std::size_t bytes, const std::nothrow_t&) noexcept { return checked_allocate(bytes); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

using namespace custody::debug;

rank_report claiming(int rank, int world) {
    rank_report r;
    r.rank.rank = rank;
    r.rank.world_size = world;
    r.platform = "host";
    r.owners.push_back(owner_usage{"weights", 1000, 1, 1000});
    return r;
}

std::string missing_message(const std::vector<rank_report>& reports) {
    try {
        static_cast<void>(merge_reports(reports));
    } catch (const report_error& e) {
        CHECK(e.why() == report_error::reason::missing);
        return e.what();
    }
    FAIL("merged");
    return {};
}

} // namespace

TEST_CASE("this executable refuses a request larger than 64 MiB", "[debug][merge]") {
    CHECK_THROWS_AS(std::vector<int>(std::size_t{1} << 30), std::bad_alloc);
}

TEST_CASE("a report claiming a world of 2e9 ranks names the missing ones without memory per rank",
          "[debug][merge][errors]") {
    const std::string one = missing_message({claiming(5, 2000000000)});
    CHECK_THAT(one, custody_test::contains("no report for ranks 0-4 and 6-1999999999 of 2000000000"));
    CHECK_THAT(one, custody_test::contains("1999999999 missing"));

    const std::string three = missing_message({claiming(4, 2000000000), claiming(0, 2000000000), claiming(2, 2000000000)});
    CHECK_THAT(three, custody_test::contains("no report for ranks 1, 3 and 5-1999999999 of 2000000000"));

    // Many gaps: the first eight are named, then how many there are in all.
    std::vector<rank_report> sparse;
    for (int r = 0; r < 40; r += 2) sparse.push_back(claiming(r, INT_MAX));
    const std::string many = missing_message(sparse);
    CHECK_THAT(many, custody_test::contains("no report for ranks 1, 3, 5, 7, 9, 11, 13, 15, ... of 2147483647"));
    CHECK_THAT(many, custody_test::contains(std::to_string(INT_MAX - 20) + " missing"));

    // One missing rank reads as before.
    CHECK_THAT(missing_message({claiming(1, 2)}), custody_test::contains("no report for rank 0 of 2"));
}

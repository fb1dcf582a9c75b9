// A tracker over sleepable memory through an adaptor that forwards the memory's properties (so
// the tracker knows a sleep may discard contents) but not the calls that keep its guards through
// a discard: a composition that cannot work, refused at compile time with a message that says why
// (core/discarding.hpp). The control forwards the calls too and compiles.
#include <custody/core/concepts.hpp>
#include <custody/core/discarding.hpp>
#include <custody/core/properties.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/platform/host_vmm.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/sleep/sleepable_memory.hpp>

#include <cstddef>

/// An adaptor of the user's: counts allocations, forwards everything else.
template <class Upstream>
class counting final {
public:
    using stream_type = typename Upstream::stream_type;
    explicit counting(int device) : upstream_(device) {}
    void* allocate(stream_type s, std::size_t n, std::size_t a) {
        ++count_;
        return upstream_.allocate(s, n, a);
    }
    void deallocate(stream_type s, void* p, std::size_t n, std::size_t a) noexcept { upstream_.deallocate(s, p, n, a); }
    void* allocate_sync(std::size_t n, std::size_t a) {
        ++count_;
        return upstream_.allocate_sync(n, a);
    }
    void deallocate_sync(void* p, std::size_t n, std::size_t a) noexcept { upstream_.deallocate_sync(p, n, a); }
    friend bool operator==(const counting& a, const counting& b) noexcept { return &a == &b; }
    CUSTODY_FORWARD_PROPERTIES(counting, Upstream)
#ifndef CUSTODY_COMPILE_FAIL
    CUSTODY_FORWARD_DISCARDING(Upstream, upstream_)
#endif

private:
    Upstream upstream_;
    std::size_t count_ = 0;
};

using sleepable = custody::sleep::sleepable_memory<custody::host::vmm, custody::resource::host_memory>;

int main() {
    custody::debug::tracking_resource<counting<sleepable>> tracker(custody::debug::tracking_options{}, 0);
    return tracker.violation_count() == 0 ? 0 : 1;
}

// Misuse under policy::abort, in a process of its own: the debug suite runs it and checks that it
// ends with SIGABRT after writing the report.
//
//   abort_worker violation   a double free with on_violation = abort
//   abort_worker leak        a block still live at destruction with on_leak = abort
// Exits 0 only when the misuse did not abort (a failure for the caller).
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/resource/host_memory.hpp>

#include <cstdio>
#include <string_view>

int main(int argc, char** argv) {
    using namespace custody::debug;
    if (argc != 2) return 2;
    const std::string_view what = argv[1];
    tracking_options o;
    o.name = "abort-worker";
    o.rank = custody::rank_info{};
    if (what == "violation") {
        o.on_violation = policy::abort;
        tracking_resource<custody::resource::host_memory> t(o);
        owner_scope s("planted");
        void* p = t.allocate({}, 512, 256);
        t.deallocate({}, p, 512, 256);
        t.deallocate({}, p, 512, 256); // aborts here
    } else if (what == "leak") {
        o.on_leak = policy::abort;
        tracking_resource<custody::resource::host_memory> t(o);
        owner_scope s("planted");
        static_cast<void>(t.allocate({}, 512, 256)); // aborts at t's destruction
    } else {
        return 2;
    }
    std::puts("abort_worker: no abort");
    return 0;
}

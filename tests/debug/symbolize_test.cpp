// Call-stack frames: the text a report holds (written and read back, hostile text refused), and,
// when built with libdw, symbolization to function, file and line in the process and offline from
// module and offset.
#include <custody/debug/detail/call_stack.hpp>
#include <custody/debug/merge.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/interop/pmr.hpp>
#include <custody/resource/host_memory.hpp>

#include "../support/catch.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory_resource>
#include <string>
#include <vector>

using namespace custody;
using namespace custody::debug;
using namespace custody::debug::detail;

namespace custody_test_symbolize {

// Lines the tests below expect in their stacks (kept next to the calls they name).
constexpr unsigned capture_line = __LINE__ + 3;
[[gnu::noinline]] call_stack capture_here() {
    call_stack s;
    s = call_stack::capture(1);
    asm volatile("" ::: "memory"); // no tail call: this frame stays on the stack
    return s;
}

using tracker = tracking_resource<resource::host_memory>;
constexpr unsigned allocate_line = __LINE__ + 2;
[[gnu::noinline]] void* allocate_here(tracker& t) {
    void* p = t.allocate({}, 64, 16);
    asm volatile("" ::: "memory");
    return p;
}

using pmr_tracker = tracking_resource<resource::host_memory>;
constexpr unsigned grow_line = __LINE__ + 3;
[[gnu::noinline]] void grow_here(std::pmr::vector<double>& v) {
    asm volatile("" ::: "memory");
    v.push_back(1.0); // through polymorphic_allocator, allocator_traits and vector's growth
    asm volatile("" ::: "memory");
}

} // namespace custody_test_symbolize

namespace {

using custody_test_symbolize::allocate_here;
using custody_test_symbolize::capture_here;

std::string this_file() { return std::filesystem::path(__FILE__).filename().string(); }

/// A quiet tracker's options that capture call stacks.
tracking_options with_stacks(std::string name) {
    tracking_options o;
    o.name = std::move(name);
    o.rank = make_rank(0, 0, 1);
    o.on_leak = policy::ignore;
    o.capture_stacks = true;
    return o;
}

/// The first frame of the only live group of `t`.
template <class Tracker>
std::string first_frame(const Tracker& t) {
    const leak_report r = t.leaks();
    REQUIRE(r.groups.size() == 1);
    REQUIRE_FALSE(r.groups[0].stack.empty());
    return r.groups[0].stack.front();
}

} // namespace

TEST_CASE("a frame's module and offset are read back from its text", "[debug][stack]") {
    code_location at;
    at.module = "/opt/my app+v2/bin/serve";
    at.offset = 0x1f2e3d;
    at.symbol = "serve::step";
    at.symbol_offset = 0x2a;
    source_frame f{"serve::step", "/src/serve.cpp", 42, false};

    const std::string full = frame_text(f, at);
    CHECK(full == "/src/serve.cpp:42 in serve::step [/opt/my app+v2/bin/serve+0x1f2e3d]");
    CHECK_FALSE(is_unsymbolized(full));
    const std::string plain = unsymbolized_text(at);
    CHECK(plain == "unsymbolized serve::step+0x2a [/opt/my app+v2/bin/serve+0x1f2e3d]");
    CHECK(is_unsymbolized(plain));
    for (const std::string& text : {full, plain}) {
        const auto back = frame_location(text);
        REQUIRE(back.has_value());
        CHECK(back->module == at.module);
        CHECK(back->offset == at.offset);
    }
    const auto unknown = frame_location(unsymbolized_text(code_location{"", 0x7f00, "", 0}));
    REQUIRE(unknown.has_value());
    CHECK(unknown->module.empty());
    CHECK(unknown->offset == 0x7f00);
}

TEST_CASE("frame text from an untrusted report gives a location or nothing", "[debug][stack]") {
    for (const char* text : {"", "]", "[]", "[+0x1]", "unsymbolized [a+0x]", "unsymbolized [a+0xzz]",
                             "unsymbolized [a+0x12345678901234567]", "unsymbolized a+0x10]", "x [a+0x10] tail",
                             "unsymbolized [a-0x10]", "unsymbolized x[a+0x10]"}) {
        INFO(text);
        CHECK_FALSE(frame_location(text).has_value());
    }
    CHECK_FALSE(is_unsymbolized("unsymbolizedX [a+0x1]"));
}

TEST_CASE("function names lose their parameters, return types and template arguments, always",
          "[debug][stack]") {
    CHECK(short_function_name("inference::remember_kv_page(int, std::vector<int>&)") == "inference::remember_kv_page");
    CHECK(short_function_name("ns::type::operator()(int) const") == "ns::type::operator()");
    CHECK(short_function_name("ns::type::operator()") == "ns::type::operator()"); // DWARF's name: no parameters
    CHECK(short_function_name("main") == "main");
    const std::string long_name = "custody::debug::tracking_resource<custody::host::simulated_device_memory, "
                                  "custody::host::platform>::allocate(custody::host::stream_view, unsigned long)";
    CHECK(short_function_name(long_name) == "custody::debug::tracking_resource<...>::allocate");
    // Short ones too: one function reads the same in every frame, whatever its arguments.
    CHECK(short_function_name("decode_step<float>(int)") == "decode_step<...>");
    CHECK(short_function_name("std::vector<int, std::allocator<int> >::push_back(int const&)") ==
          "std::vector<...>::push_back");
    // A template function's demangled name starts with its return type.
    CHECK(short_function_name("void std::vector<int, std::allocator<int> >::_M_realloc_insert<int>("
                              "__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, int&&)") ==
          "std::vector<...>::_M_realloc_insert<...>");
    CHECK(short_function_name("std::pair<int, int> app::make<int>(int) &&") == "app::make<...>");
    CHECK(short_function_name("unsigned long app::count(char const*)") == "app::count");
    // Operators keep their symbols; scopes in parentheses and lambdas keep their spaces.
    CHECK(short_function_name("std::ostream& app::operator<<(std::ostream&, app::x const&)") == "app::operator<<");
    CHECK(short_function_name("bool app::operator< <int>(app::v<int> const&, app::v<int> const&)") ==
          "app::operator< <...>");
    CHECK(short_function_name("operator new(unsigned long)") == "operator new");
    CHECK(short_function_name("app::x::operator bool() const") == "app::x::operator bool");
    CHECK(short_function_name("(anonymous namespace)::run_rank(int, std::string const&)") ==
          "(anonymous namespace)::run_rank");
    CHECK(short_function_name("app::f()::{lambda(int, int)#1}::operator()(int, int) const") ==
          "app::f()::{lambda(int, int)#1}::operator()");
}

TEST_CASE("a frame's function is read back from its text", "[debug][stack]") {
    CHECK(frame_function("/src/a b.cpp:42 in ns::f<...> [/bin/app+0x10]") == "ns::f<...>");
    CHECK(frame_function("ns::g [/bin/app+0x10]") == "ns::g");
    CHECK(frame_function("unsymbolized ns::h+0x2a [/bin/app+0x10]") == "ns::h");
    CHECK(frame_function("unsymbolized [/bin/app+0x10]").empty());
    CHECK(frame_function("? [/bin/app+0x10]").empty());
    CHECK(frame_function("no location at all").empty());
    CHECK(with_short_function("/usr/include/c++/12/bits/vector.tcc:123 in void std::vector<int, std::allocator<int> "
                              ">::_M_realloc_insert<int>(int&&) [/bin/app+0x10]") ==
          "/usr/include/c++/12/bits/vector.tcc:123 in std::vector<...>::_M_realloc_insert<...> [/bin/app+0x10]");
}

TEST_CASE("a stack starts at the application: custody's and the standard library's frames above it go",
          "[debug][stack]") {
    const std::vector<named_frame> own{{"custody::a", "a"}, {"custody::b", "b"}};
    CHECK(application_first(own) == std::vector<std::string>{"a", "b"});
    const std::vector<named_frame> mixed{{"custody::a", "a"}, {"app::f", "f"}, {"custody::b", "b"}};
    CHECK(application_first(mixed) == std::vector<std::string>{"f", "b"});
    // A leak through std::vector: the allocator's and vector's frames sit between custody's and
    // the application's; the runtime's frames below the application stay.
    const std::vector<named_frame> vector_growth{
        {"custody::debug::tracking_resource<...>::allocate", "t [/bin/app+0x1]"},
        {"std::construct_at<...>", "/usr/include/c++/12/bits/stl_construct.h:97 in std::construct_at<...> [/bin/app+0x2]"},
        {"std::allocator_traits<...>::allocate", "/usr/include/c++/12/bits/alloc_traits.h:482 in x [/bin/app+0x3]"},
        {"std::vector<...>::_M_realloc_insert<...>", "/usr/include/c++/12/bits/vector.tcc:440 in y [/bin/app+0x4]"},
        {"engine::cache_page", "engine.cpp:12 in engine::cache_page [/bin/app+0x5]"},
        {"std::thread::_State_impl<...>::_M_run", "z [/bin/app+0x6]"},
        {{}, "unsymbolized [/usr/lib/x86_64-linux-gnu/libstdc++.so.6+0xd44a3]"}};
    CHECK(application_first(vector_growth) ==
          std::vector<std::string>{"engine.cpp:12 in engine::cache_page [/bin/app+0x5]", "z [/bin/app+0x6]",
                                   "unsymbolized [/usr/lib/x86_64-linux-gnu/libstdc++.so.6+0xd44a3]"});
    // Lines read from a report (no function known apart from the text), and a runtime frame known
    // only by its module.
    const std::vector<named_frame> from_report{
        {{}, "unsymbolized [/usr/lib/x86_64-linux-gnu/libstdc++.so.6+0x9a1b2]"},
        {{}, "/usr/include/c++/12/bits/new_allocator.h:137 in std::__new_allocator<...>::allocate [/bin/app+0x7]"},
        {{}, "unsymbolized operator new+0x1c [/bin/app+0x8]"},
        {{}, "app.cpp:9 in app::load [/bin/app+0x9]"}};
    CHECK(application_first(from_report) == std::vector<std::string>{"app.cpp:9 in app::load [/bin/app+0x9]"});
}

TEST_CASE("the merged stacks account for every group they leave out", "[debug][stack][merge]") {
    rank_report r;
    r.rank = make_rank(1, 1, 2);
    r.live.groups = {leak_group{"kv", {"a.cpp:1 in f [/x+0x1]"}, 1000, 10, 1, {0}},
                     leak_group{"act", {"a.cpp:2 in g [/x+0x2]"}, 300, 3, 2, {0}},
                     leak_group{"w", {}, 200, 1, 3, {0}},
                     leak_group{"out", {"a.cpp:3 in h [/x+0x3]"}, 100, 1, 4, {0}}};
    rank_report quiet; // a rank without stacks: its groups are counted, none printed
    quiet.rank = make_rank(0, 0, 2);
    quiet.live.groups = {leak_group{"kv", {}, 50, 1, 1, {0}}};

    const std::string one = format_stacks({quiet, r}, 1);
    INFO(one);
    CHECK(one.find("rank 1: 1000 B in 10 allocations from 'kv'") != std::string::npos);
    CHECK(one.find("rank 1: and 3 more groups (600 B)\n") != std::string::npos);
    CHECK(one.find("rank 0: 1 group (50 B) without a call stack\n") != std::string::npos);
    const std::string all = format_stacks({r}, 5); // every group with a stack shown: the rest have none
    CHECK(all.find("rank 1: and 1 more group (200 B) without a call stack") != std::string::npos);
    CHECK(format_stacks({quiet}, 3).empty());
}

TEST_CASE("module paths from a report: only regular files are opened", "[debug][stack]") {
    symbolizer s;
    CHECK(s.frames_at("/dev/zero", 0x1000).empty());     // a device: never opened
    CHECK(s.frames_at("/", 0x1000).empty());             // a directory
    CHECK(s.frames_at("/nonexistent/x", 0x1000).empty()); // missing
    const std::string text = (std::filesystem::temp_directory_path() / "custody-not-elf.txt").string();
    std::ofstream(text) << "not an ELF file\n";
    CHECK(s.frames_at(text, 0x10).empty()); // readable, but not ELF
    std::remove(text.c_str());
}

TEST_CASE("a captured stack reads function, file and line, or says it is unsymbolized", "[debug][stack]") {
    const call_stack stack = capture_here();
    REQUIRE_FALSE(stack.empty());
    const std::vector<std::string> lines = stack.symbolize();
    REQUIRE_FALSE(lines.empty());
    INFO(lines.front());
    if constexpr (symbolizer::available) {
        CHECK_THAT(lines.front(), custody_test::contains(this_file() + ":" + std::to_string(custody_test_symbolize::capture_line) +
                                                         " in custody_test_symbolize::capture_here ["));
    } else {
        CHECK(is_unsymbolized(lines.front()));
    }
    // Every line names its module and offset, so it can be symbolized again elsewhere.
    for (const auto& line : lines) CHECK(frame_location(line).has_value());
}

TEST_CASE("a leak report starts at the application's call, with its file and line", "[debug][stack][leak]") {
    custody_test_symbolize::tracker t(with_stacks("stacks"));
    void* p = allocate_here(t);
    const std::string first = first_frame(t);
    INFO(first);
    if constexpr (symbolizer::available) {
        CHECK_THAT(first, custody_test::contains(this_file() + ":" + std::to_string(custody_test_symbolize::allocate_line) +
                                                 " in custody_test_symbolize::allocate_here ["));
        const leak_report r = t.leaks();
        for (const auto& line : r.groups[0].stack) CHECK(line.find(" in custody::") == std::string::npos);
    }
    t.deallocate({}, p, 64, 16);
}

TEST_CASE("a leak through std::vector starts at the application's line, not in the standard library",
          "[debug][stack][leak]") {
    custody_test_symbolize::pmr_tracker t(with_stacks("vector"));
    interop::pmr_adaptor adaptor(t);
    std::pmr::vector<double> v(&adaptor);
    custody_test_symbolize::grow_here(v);
    const std::string first = first_frame(t);
    INFO(first);
    if constexpr (symbolizer::available) {
        CHECK_THAT(first, custody_test::contains(this_file() + ":" + std::to_string(custody_test_symbolize::grow_line) +
                                                 " in custody_test_symbolize::grow_here ["));
    }
}

TEST_CASE("offline: unsymbolized lines are symbolized from module and offset", "[debug][stack]") {
    const call_stack stack = capture_here();
    std::vector<std::string> plain;
    for (code_location at : stack.locations()) { // as a build without libdw writes them
        name_symbol(at);
        plain.push_back(unsymbolized_text(at));
    }
    const std::vector<std::string> live = stack.symbolize();

    symbolizer s;
    std::vector<std::string> offline = plain;
    const std::size_t left = symbolize_lines(s, offline);
    if constexpr (symbolizer::available) {
        CHECK(offline == live);
        CHECK(left < plain.size());
    } else {
        CHECK(offline == plain);
        CHECK(left == plain.size());
    }

    // A module that moved (another machine's path): found by file name in a search directory.
    // (The stack's first frames may be custody's or a sanitizer's: the test program's frames all move.)
    const std::filesystem::path module(executable_path());
    const std::string moved = "/nonexistent/elsewhere/" + module.filename().string();
    std::vector<std::string> from_elsewhere;
    for (code_location at : stack.locations()) {
        if (at.module == module.string()) at.module = moved;
        from_elsewhere.push_back(unsymbolized_text(at));
    }
    symbolizer searching({module.parent_path().string()});
    CHECK(searching.find_file(moved) == module.string());
    symbolize_lines(searching, from_elsewhere);
    if constexpr (symbolizer::available) {
        CHECK_THAT(from_elsewhere.front(), custody_test::contains("in custody_test_symbolize::capture_here [" + moved));
    }
    // Lines that are not unsymbolized are kept as they are.
    std::vector<std::string> other{"something else", "app.cpp:3 in f [/x+0x1]"};
    CHECK(symbolize_lines(s, other) == 0);
    CHECK(other == std::vector<std::string>{"something else", "app.cpp:3 in f [/x+0x1]"});
}

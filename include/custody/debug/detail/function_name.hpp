/// @file
/// A function's name as a call-stack frame shows it: demangled, then shortened by one rule
/// wherever the name comes from (a linkage name, DWARF's name and scope, the dynamic symbol table,
/// a report written elsewhere), and whether a frame is the C++ runtime's or custody's own.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace custody::debug::detail {

namespace function_name_steps {

/// The length of the operator token at `name[i]` ("operator()", "operator<<=", "operator new[]",
/// "operator->"...), or 0 when no operator token starts there. Its symbols are part of the name,
/// not brackets.
[[nodiscard]] inline std::size_t operator_token(std::string_view name, std::size_t i) noexcept {
    constexpr std::string_view word = "operator";
    if (name.compare(i, word.size(), word) != 0) return 0;
    if (i > 0 && name[i - 1] != ':' && name[i - 1] != ' ' && name[i - 1] != '~') return 0;
    std::size_t j = i + word.size();
    if (name.compare(j, 2, "()") == 0 || name.compare(j, 2, "[]") == 0) return j + 2 - i;
    constexpr std::string_view symbols = "<>=!+-*/%^&|~,";
    std::size_t k = j;
    while (k < name.size() && symbols.find(name[k]) != std::string_view::npos) ++k;
    if (k > j) return k - i;
    for (const std::string_view alloc : {" new[]", " new", " delete[]", " delete"}) {
        if (name.compare(j, alloc.size(), alloc) == 0) return j + alloc.size() - i;
    }
    // A conversion operator ("operator bool"): its type follows as ordinary text.
    return j < name.size() && name[j] == ' ' ? word.size() : 0;
}

/// Every template argument list becomes "<...>".
[[nodiscard]] inline std::string fold_templates(std::string_view name) {
    std::string out;
    out.reserve(name.size());
    int depth = 0;
    for (std::size_t i = 0; i < name.size();) {
        if (const std::size_t op = operator_token(name, i); op != 0) {
            if (depth == 0) out.append(name.substr(i, op));
            i += op;
            continue;
        }
        const char c = name[i++];
        if (c == '<') {
            if (depth++ == 0) out += "<...>";
        } else if (c == '>' && depth > 0) {
            --depth;
        } else if (depth == 0) {
            out += c;
        }
    }
    return depth == 0 ? out : std::string(name);
}

/// `name` without its parameter list (the last top-level "(...)", with the qualifiers after it:
/// const, volatile, &, &&, noexcept). An operator's own "()" stays.
[[nodiscard]] inline std::string drop_parameters(std::string name) {
    std::size_t end = name.size();
    for (bool trimmed = true; trimmed;) {
        trimmed = false;
        for (const std::string_view q : {" const", " volatile", " noexcept", " &&", " &", "&&", "&"}) {
            if (end >= q.size() && std::string_view(name).substr(end - q.size(), q.size()) == q) {
                end -= q.size();
                trimmed = true;
            }
        }
    }
    if (end == 0 || name[end - 1] != ')') return name;
    int depth = 0;
    for (std::size_t i = end; i-- > 0;) {
        if (name[i] == ')') {
            ++depth;
        } else if (name[i] == '(' && --depth == 0) {
            const std::string_view before = std::string_view(name).substr(0, i);
            if (i == 0 || (before.size() >= 8 && before.substr(before.size() - 8) == "operator")) return name;
            name.erase(i);
            return name;
        }
    }
    return name;
}

/// `name` without a return type in front ("void ns::f" -> "ns::f"): what stands before the last
/// space outside brackets, and before any operator token.
[[nodiscard]] inline std::string drop_return_type(std::string name) {
    std::size_t cut = std::string::npos;
    int depth = 0;
    for (std::size_t i = 0; i < name.size(); ++i) {
        if (depth == 0 && operator_token(name, i) != 0) break;
        const char c = name[i];
        if (c == '(' || c == '{' || c == '[') ++depth;
        else if ((c == ')' || c == '}' || c == ']') && depth > 0) --depth;
        else if (c == ' ' && depth == 0) cut = i;
    }
    return cut == std::string::npos ? name : name.substr(cut + 1);
}

} // namespace function_name_steps

/// A demangled C++ name as a frame shows it: template argument lists folded to "<...>" (always, so
/// one function reads the same in every frame and report, whatever its arguments), without its
/// parameter list and the qualifiers after it, and without a return type in front:
/// "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int>(iterator, int&&)" reads
/// "std::vector<...>::_M_realloc_insert<...>". Operator names keep their symbols ("operator<<",
/// "operator()", "operator new"). Names that are not C++ signatures come back unchanged.
[[nodiscard]] inline std::string short_function_name(std::string_view name) {
    using namespace function_name_steps;
    return drop_return_type(drop_parameters(fold_templates(name)));
}

/// Whether a frame of `function` (a short name; may be empty) in `module` (a path; may be empty)
/// belongs to custody itself or to the C++ runtime (the standard library, its allocation
/// functions, a sanitizer's runtime): the frames a report leaves out above the application's
/// first frame.
[[nodiscard]] inline bool runtime_frame(std::string_view function, std::string_view module) noexcept {
    for (const std::string_view prefix : {"custody::", "std::", "__gnu_cxx::", "__cxxabiv1::", "__gnu_debug::",
                                          "operator new", "operator delete", "__sanitizer", "__asan", "__tsan",
                                          "__interceptor_"}) {
        if (function.substr(0, prefix.size()) == prefix) return true;
    }
    const std::size_t slash = module.rfind('/');
    const std::string_view file = slash == std::string_view::npos ? module : module.substr(slash + 1);
    for (const std::string_view library : {"libstdc++.so", "libc++.so", "libc++abi.so", "libasan.so", "libtsan.so",
                                           "libubsan.so", "liblsan.so", "libcustody_torch_allocator"}) {
        if (file.substr(0, library.size()) == library) return true;
    }
    return false;
}

} // namespace custody::debug::detail

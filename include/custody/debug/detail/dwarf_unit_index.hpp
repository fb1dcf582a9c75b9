/// @file
/// An index of one DWARF compilation unit, built by one walk over its entries: the address ranges
/// of its functions, so that finding the function at an address is a binary search instead of a
/// walk per address, and the namespaces and types around each function's declaration, for names
/// of functions without a linkage name. With libdw only (CUSTODY_WITH_LIBDW); empty otherwise.
#pragma once

#if defined(CUSTODY_WITH_LIBDW)

#include <dwarf.h>
#include <elfutils/libdw.h>

#include <algorithm>
#include <cstddef>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace custody::debug::detail {

/// The functions of one compilation unit by address, and their scopes by entry.
///
/// Thread safety: immutable once built. Ownership: holds copies of libdw's entry handles, valid
/// while the libdw session of the unit lives. Complexity: built in O(entries outside function
/// bodies); function_at is O(log functions); scope_of O(1).
class dwarf_unit_index {
public:
    explicit dwarf_unit_index(Dwarf_Die* unit) {
        walk(unit, &*scopes_.insert(std::string()).first);
        std::sort(ranges_.begin(), ranges_.end(), [](const range& a, const range& b) { return a.low < b.low; });
    }

    /// The function (its concrete DW_TAG_subprogram entry) whose code holds `pc`, or nullptr.
    [[nodiscard]] const Dwarf_Die* function_at(Dwarf_Addr pc) const {
        auto after = std::upper_bound(ranges_.begin(), ranges_.end(), pc,
                                      [](Dwarf_Addr a, const range& r) { return a < r.low; });
        if (after == ranges_.begin()) return nullptr;
        const range& r = *--after;
        return pc < r.high ? &r.function : nullptr;
    }

    /// "ns::type::" around the function entry at `offset` (dwarf_dieoffset); nullptr when the
    /// entry is not one this unit declares at namespace or type level.
    [[nodiscard]] const std::string* scope_of(Dwarf_Off offset) const {
        const auto it = scope_by_entry_.find(offset);
        return it == scope_by_entry_.end() ? nullptr : it->second;
    }

private:
    /// [low, high) of one function. Invariant: ranges of distinct functions do not overlap.
    struct range {
        Dwarf_Addr low;
        Dwarf_Addr high;
        Dwarf_Die function;
    };
    std::vector<range> ranges_;  ///< sorted by low
    std::set<std::string> scopes_; ///< the distinct scope prefixes ("" first); node addresses are stable
    std::unordered_map<Dwarf_Off, const std::string*> scope_by_entry_; ///< function entry -> its scope

    void walk(Dwarf_Die* parent, const std::string* scope) {
        Dwarf_Die child;
        if (dwarf_child(parent, &child) != 0) return;
        for (;;) {
            const int tag = dwarf_tag(&child);
            if (tag == DW_TAG_subprogram) {
                scope_by_entry_.emplace(dwarf_dieoffset(&child), scope);
                Dwarf_Addr base = 0;
                Dwarf_Addr low = 0;
                Dwarf_Addr high = 0;
                for (std::ptrdiff_t at = 0; (at = dwarf_ranges(&child, at, &base, &low, &high)) > 0;) {
                    if (low < high) ranges_.push_back(range{low, high, child});
                }
            } else if (tag == DW_TAG_namespace || tag == DW_TAG_class_type || tag == DW_TAG_structure_type ||
                       tag == DW_TAG_union_type) {
                const char* name = dwarf_diename(&child);
                const std::string inner =
                    *scope + (name != nullptr ? name : tag == DW_TAG_namespace ? "(anonymous namespace)" : "(anonymous)") +
                    "::";
                walk(&child, &*scopes_.insert(inner).first);
            }
            Dwarf_Die next;
            if (dwarf_siblingof(&child, &next) != 0) break;
            child = next;
        }
    }
};

} // namespace custody::debug::detail

#endif // CUSTODY_WITH_LIBDW

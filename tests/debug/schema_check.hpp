// A small JSON Schema checker for the tests: the keywords docs/debug-report-schema.json uses
// (type, const, enum, minimum, maximum, required, properties, additionalProperties, items, $ref to
// #/$defs/...). Returns the list of violations, each with its JSON path. "integer" means what the
// reader holds as one: written without fraction or exponent, within int64 or uint64. And the
// schema itself, report_schema(), from the path the build gives (CUSTODY_SCHEMA_PATH).
#pragma once

#include <custody/debug/detail/json.hpp>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#ifndef CUSTODY_SCHEMA_PATH
#error "the build defines CUSTODY_SCHEMA_PATH (docs/debug-report-schema.json)"
#endif

namespace custody::test {

/// docs/debug-report-schema.json, parsed.
inline custody::debug::detail::json::value report_schema() {
    std::ifstream in(CUSTODY_SCHEMA_PATH);
    std::ostringstream text;
    text << in.rdbuf();
    return custody::debug::detail::json::parse(text.str());
}

class schema_checker {
public:
    explicit schema_checker(const custody::debug::detail::json::value& root) : root_(root) {}

    std::vector<std::string> check(const custody::debug::detail::json::value& doc) {
        errors_.clear();
        visit(root_, doc, "$");
        return errors_;
    }

private:
    using value = custody::debug::detail::json::value;

    static bool has_type(const value& v, const std::string& type) {
        if (type == "integer") return v.is_integer();
        if (type == "number") return v.is_number();
        if (type == "string") return v.is_string();
        if (type == "boolean") return v.is_bool();
        if (type == "object") return v.is_object();
        if (type == "array") return v.is_array();
        if (type == "null") return v.is_null();
        return false;
    }

    static bool equal(const value& a, const value& b) {
        if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
        if (a.is_integer() && b.is_integer()) {
            return a.as_integer<std::int64_t>() == b.as_integer<std::int64_t>() &&
                   a.as_integer<std::uint64_t>() == b.as_integer<std::uint64_t>();
        }
        if (a.is_number() && b.is_number()) return a.as_number() == b.as_number();
        if (a.is_bool() && b.is_bool()) return a.as_bool() == b.as_bool();
        return a.is_null() && b.is_null();
    }

    /// v < m, exactly for integers.
    static bool below(const value& v, const value& m) {
        if (v.is_integer() && m.is_integer()) {
            const auto vi = v.as_integer<std::int64_t>();
            const auto mi = m.as_integer<std::int64_t>();
            if (vi && mi) return *vi < *mi;
            return mi.has_value(); // one is above INT64_MAX: v is below only when m is
        }
        return v.as_number() < m.as_number();
    }

    void visit(const value& schema, const value& v, const std::string& path) {
        if (!schema.is_object()) return;
        if (const value* ref = schema.find("$ref")) {
            const std::string& r = ref->as_string();
            const std::string prefix = "#/$defs/";
            const value* target = nullptr;
            if (r.rfind(prefix, 0) == 0) {
                if (const value* defs = root_.find("$defs")) target = defs->find(r.substr(prefix.size()));
            }
            if (target == nullptr) errors_.push_back(path + ": unresolved $ref " + r);
            else visit(*target, v, path);
        }
        if (const value* t = schema.find("type")) {
            bool ok = false;
            if (t->is_string()) ok = has_type(v, t->as_string());
            else
                for (const auto& e : t->as_array()) ok = ok || has_type(v, e.as_string());
            if (!ok) {
                errors_.push_back(path + ": is " + v.type_name() + ", not the schema's type");
                return;
            }
        }
        if (const value* c = schema.find("const"); c != nullptr && !equal(*c, v)) {
            errors_.push_back(path + ": differs from the schema's const");
        }
        if (const value* e = schema.find("enum")) {
            bool ok = false;
            for (const auto& x : e->as_array()) ok = ok || equal(x, v);
            if (!ok) errors_.push_back(path + ": not one of the schema's enum");
        }
        if (const value* m = schema.find("minimum"); m != nullptr && v.is_number() && below(v, *m)) {
            errors_.push_back(path + ": below the minimum");
        }
        if (const value* m = schema.find("maximum"); m != nullptr && v.is_number() && v.as_number() > m->as_number()) {
            errors_.push_back(path + ": above the maximum");
        }
        if (v.is_object()) {
            if (const value* req = schema.find("required")) {
                for (const auto& k : req->as_array())
                    if (v.find(k.as_string()) == nullptr) errors_.push_back(path + ": missing '" + k.as_string() + "'");
            }
            const value* props = schema.find("properties");
            const value* extra = schema.find("additionalProperties");
            for (const auto& [k, child] : v.as_object()) {
                const value* sub = props != nullptr ? props->find(k) : nullptr;
                if (sub != nullptr) {
                    visit(*sub, child, path + "." + k);
                } else if (extra != nullptr && extra->is_bool() && !extra->as_bool()) {
                    errors_.push_back(path + ": unexpected member '" + k + "'");
                } else if (extra != nullptr && extra->is_object()) {
                    visit(*extra, child, path + "." + k);
                }
            }
        }
        if (v.is_array()) {
            if (const value* items = schema.find("items")) {
                std::size_t i = 0;
                for (const auto& e : v.as_array()) visit(*items, e, path + "[" + std::to_string(i++) + "]");
            }
        }
    }

    const value& root_;
    std::vector<std::string> errors_;
};

} // namespace custody::test

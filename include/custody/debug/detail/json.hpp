/// @file
/// A small JSON writer and reader for the debug reports and the merge tool: enough JSON (RFC 8259)
/// for what custody writes, strict about what it reads. An internal of the debug layer; this
/// header gathers its parts (UTF-8 helpers, value, writer, parser).
#pragma once

#include <custody/debug/detail/json_utf8.hpp>
#include <custody/debug/detail/json_value.hpp>
#include <custody/debug/detail/json_writer.hpp>
#include <custody/debug/detail/json_parser.hpp>

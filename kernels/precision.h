// The precision a caller asks for: "exact" holds the contract's error bounds; "fast" may trade some of
// that accuracy for speed. Each kernel's traits say which precisions it takes (kernels/registry.h).
#pragma once
#include <optional>
#include <string_view>

namespace sparse_mla {

enum class Precision : int { exact = 0, fast = 1 };

// The precision named by Python's "exact" / "fast"; none for any other name.
inline std::optional<Precision> precision_named(std::string_view name) {
    if (name == "exact") return Precision::exact;
    if (name == "fast") return Precision::fast;
    return std::nullopt;
}

}  // namespace sparse_mla

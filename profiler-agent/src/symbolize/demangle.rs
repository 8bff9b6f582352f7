//! Demangling of Rust and C++ symbol names.

/// The readable form of `name`: Rust (legacy and v0) without the hash
/// suffix, C++ through the Itanium ABI, anything else unchanged.
pub fn demangle(name: &str) -> String {
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return format!("{rust:#}");
    }
    if name.starts_with("_Z")
        && let Ok(symbol) = cpp_demangle::Symbol::new(name)
        && let Ok(text) = symbol.demangle(&cpp_demangle::DemangleOptions::default())
    {
        return text;
    }
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::demangle;

    #[test]
    fn demangles_rust_cpp_and_leaves_c_alone() {
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
        assert_eq!(demangle("_ZN3foo3barEi"), "foo::bar(int)");
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"),
            "std::vector<int, std::allocator<int> >::push_back(int const&)"
        );
        assert_eq!(demangle("main"), "main");
        assert_eq!(demangle("_Znot valid"), "_Znot valid");
    }
}

//! Demangling of Rust and C++ symbol names.

use crate::printable;

/// The readable form of `name`: Rust (legacy and v0) without the hash
/// suffix, C++ through the Itanium ABI, anything else unchanged; control
/// characters (which a hostile binary's symbol may hold) as `?`.
pub fn demangle(name: &str) -> String {
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return printable(&format!("{rust:#}")).into_owned();
    }
    if name.starts_with("_Z")
        && let Ok(symbol) = cpp_demangle::Symbol::new(name)
        && let Ok(text) = symbol.demangle(&cpp_demangle::DemangleOptions::default())
    {
        return printable(&text).into_owned();
    }
    printable(name).into_owned()
}

/// The qualified name alone: C++ without its parameter list and return
/// type (`shop::sum_of<double>` for `double shop::sum_of<double>(double
/// const*, int)`), what people write when they name a function; other
/// names as `demangle` gives them.
pub fn demangle_base(name: &str) -> String {
    if name.starts_with("_Z")
        && rustc_demangle::try_demangle(name).is_err()
        && let Ok(symbol) = cpp_demangle::Symbol::new(name)
        && let Ok(text) = symbol.demangle(
            &cpp_demangle::DemangleOptions::default()
                .no_params()
                .no_return_type(),
        )
    {
        return printable(&text).into_owned();
    }
    demangle(name)
}

#[cfg(test)]
mod tests {
    use super::{demangle, demangle_base};

    #[test]
    fn the_base_name_has_no_parameters_or_return_type() {
        assert_eq!(
            demangle_base("_ZN4shop6sum_ofIdEET_PKS1_i"),
            "shop::sum_of<double>"
        );
        assert_eq!(
            demangle("_ZN4shop6sum_ofIdEET_PKS1_i"),
            "double shop::sum_of<double>(double const*, int)"
        );
        assert_eq!(
            demangle_base("_ZN4shop8Register4ringEd"),
            "shop::Register::ring"
        );
        assert_eq!(
            demangle_base("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle_base("main"), "main");
    }

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

    #[test]
    fn control_characters_in_a_symbol_are_replaced() {
        assert_eq!(demangle("evil\nmain;x\0"), "evil?main;x?");
        // Not a valid C++ name: kept mangled, its newline replaced.
        assert_eq!(demangle("_ZN3foo4b\nrEv"), "_ZN3foo4b?rEv");
        assert_eq!(demangle("caf\u{e9}\u{85}"), "caf\u{e9}?");
    }
}

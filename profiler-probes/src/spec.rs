//! Probe specs as users write them, close to bpftrace's syntax:
//! `usdt:PATH:PROVIDER:NAME`, `uprobe:PATH:SYMBOL`, `uretprobe:PATH:SYMBOL`
//! (bpftrace's short forms `U`, `u`, `ur` too). PATH is a path, or a bare
//! name (`libc.so.6`, `python3.11`) resolved later against a process's
//! mappings or the library search path. SYMBOL, PROVIDER and NAME may be
//! globs (`*`, `?`).

use std::fmt;
use std::path::PathBuf;

/// A parsed probe spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeSpec {
    Usdt {
        target: Target,
        /// `*` when the spec leaves the provider out (`usdt:PATH:NAME`).
        provider: String,
        name: String,
    },
    Uprobe {
        target: Target,
        symbol: String,
        /// `uretprobe`: fire on return.
        ret: bool,
    },
}

/// The object a probe is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Contains a `/`: a path, used as is.
    Path(PathBuf),
    /// A bare name: resolve it later (a mapped library of the process,
    /// the library search path, or `$PATH`).
    Name(String),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Path(path) => write!(f, "{}", path.display()),
            Target::Name(name) => f.write_str(name),
        }
    }
}

impl fmt::Display for ProbeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeSpec::Usdt {
                target,
                provider,
                name,
            } => write!(f, "usdt:{target}:{provider}:{name}"),
            ProbeSpec::Uprobe {
                target,
                symbol,
                ret,
            } => {
                let kind = if *ret { "uretprobe" } else { "uprobe" };
                write!(f, "{kind}:{target}:{symbol}")
            }
        }
    }
}

/// A spec that does not parse: the spec and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("probe spec {spec:?}: {problem}")]
pub struct SpecError {
    pub spec: String,
    pub problem: String,
}

const FORMS: &str = "expected usdt:PATH:PROVIDER:NAME, uprobe:PATH:SYMBOL or uretprobe:PATH:SYMBOL";

impl ProbeSpec {
    pub fn parse(spec: &str) -> Result<ProbeSpec, SpecError> {
        let fail = |problem: String| SpecError {
            spec: spec.to_string(),
            problem,
        };
        let text = spec.trim();
        if text.is_empty() {
            return Err(fail(format!("empty; {FORMS}")));
        }
        let Some((kind, rest)) = text.split_once(':') else {
            return Err(fail(format!("no ':'; {FORMS}")));
        };
        let ret = match kind {
            "usdt" | "U" => None,
            "uprobe" | "u" => Some(false),
            "uretprobe" | "ur" => Some(true),
            other => {
                let known = ["usdt", "uprobe", "uretprobe"];
                let hint = match suggest(other, known).first() {
                    Some(near) => format!(" (did you mean {near}?)"),
                    None => String::new(),
                };
                return Err(fail(format!("unknown probe type {other:?}{hint}; {FORMS}")));
            }
        };
        let Some((path, rest)) = rest.split_once(':') else {
            return Err(fail(format!("missing the part after the path; {FORMS}")));
        };
        let target = parse_target(path).map_err(fail)?;
        match ret {
            None => {
                let (provider, name) = match rest.split_once(':') {
                    Some((provider, name)) => (provider, name),
                    // bpftrace allows leaving the provider out.
                    None => ("*", rest),
                };
                if provider.is_empty() {
                    return Err(fail("empty provider".to_string()));
                }
                if name.is_empty() {
                    return Err(fail("empty probe name".to_string()));
                }
                for (what, part) in [("provider", provider), ("probe name", name)] {
                    if let Some(c) = part
                        .chars()
                        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '*' | '?')))
                    {
                        return Err(fail(format!(
                            "{what} {part:?} contains {c:?}; USDT names are C identifiers \
                             (globs * and ? allowed)"
                        )));
                    }
                }
                Ok(ProbeSpec::Usdt {
                    target,
                    provider: provider.to_string(),
                    name: name.to_string(),
                })
            }
            Some(ret) => {
                // C++ symbols may contain ':' (`ns::f`): the symbol is
                // everything after the path.
                if rest.is_empty() {
                    return Err(fail("empty symbol".to_string()));
                }
                if rest.chars().any(char::is_whitespace) {
                    return Err(fail(format!("symbol {rest:?} contains whitespace")));
                }
                Ok(ProbeSpec::Uprobe {
                    target,
                    symbol: rest.to_string(),
                    ret,
                })
            }
        }
    }

    pub fn target(&self) -> &Target {
        match self {
            ProbeSpec::Usdt { target, .. } | ProbeSpec::Uprobe { target, .. } => target,
        }
    }
}

fn parse_target(path: &str) -> Result<Target, String> {
    if path.is_empty() {
        return Err(
            "empty path (name a binary or library, e.g. /usr/bin/python3.11 or libc.so.6)"
                .to_string(),
        );
    }
    if path.contains(['*', '?']) {
        return Err(format!("path {path:?} cannot be a glob"));
    }
    Ok(if path.contains('/') {
        Target::Path(PathBuf::from(path))
    } else {
        Target::Name(path.to_string())
    })
}

/// True when `pattern` contains glob characters.
pub fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?'])
}

/// Shell-style match: `*` any run (also empty), `?` one character,
/// everything else literal.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative matcher with one backtrack point (the last `*`): linear
    // in practice, no recursion on hostile patterns.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Levenshtein distance in characters.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        current[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitute.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

/// Up to three candidates close to `unknown`, nearest first: within an
/// edit distance of a third of the name's length (at least 2), so `gc_start`
/// finds `gc__start` and `qeury__start` finds `query__start`, but unrelated
/// names are not offered.
pub fn suggest<'a>(unknown: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let limit = (unknown.chars().count() / 3).max(2);
    let mut near: Vec<(usize, &str)> = candidates
        .into_iter()
        .map(|c| (edit_distance(unknown, c), c))
        .filter(|&(d, c)| d <= limit && c != unknown)
        .collect();
    near.sort();
    near.dedup();
    near.into_iter().take(3).map(|(_, c)| c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usdt_specs() {
        assert_eq!(
            ProbeSpec::parse("usdt:/usr/bin/python3.11:python:gc__start").unwrap(),
            ProbeSpec::Usdt {
                target: Target::Path("/usr/bin/python3.11".into()),
                provider: "python".into(),
                name: "gc__start".into()
            }
        );
        assert_eq!(
            ProbeSpec::parse("usdt:libstdc++.so.6:libstdcxx:throw").unwrap(),
            ProbeSpec::Usdt {
                target: Target::Name("libstdc++.so.6".into()),
                provider: "libstdcxx".into(),
                name: "throw".into()
            }
        );
        assert_eq!(
            ProbeSpec::parse("U:./app:query__*").unwrap(),
            ProbeSpec::Usdt {
                target: Target::Path("./app".into()),
                provider: "*".into(),
                name: "query__*".into()
            }
        );
    }

    #[test]
    fn uprobe_specs() {
        assert_eq!(
            ProbeSpec::parse("uprobe:/lib/x86_64-linux-gnu/libc.so.6:malloc").unwrap(),
            ProbeSpec::Uprobe {
                target: Target::Path("/lib/x86_64-linux-gnu/libc.so.6".into()),
                symbol: "malloc".into(),
                ret: false
            }
        );
        let spec = ProbeSpec::parse("uretprobe:libc.so.6:str*").unwrap();
        assert_eq!(
            spec,
            ProbeSpec::Uprobe {
                target: Target::Name("libc.so.6".into()),
                symbol: "str*".into(),
                ret: true
            }
        );
        assert_eq!(spec.to_string(), "uretprobe:libc.so.6:str*");
        let cpp = ProbeSpec::parse("u:/app:ns::Class::method").unwrap();
        assert!(
            matches!(cpp, ProbeSpec::Uprobe { ref symbol, .. } if symbol == "ns::Class::method")
        );
    }

    #[test]
    fn errors_name_the_spec_and_the_problem() {
        for (spec, problem) in [
            ("", "empty"),
            ("usdt", "no ':'"),
            ("usdtt:/bin/x:p:n", "did you mean usdt?"),
            ("kprobe:foo", "unknown probe type \"kprobe\""),
            ("usdt:/bin/x", "missing the part after the path"),
            ("usdt::p:n", "empty path"),
            ("usdt:/bin/x::n", "empty provider"),
            ("usdt:/bin/x:p:", "empty probe name"),
            ("usdt:/bin/x:p:a-b", "contains '-'"),
            ("usdt:/bin/*:p:n", "cannot be a glob"),
            ("uprobe:/bin/x:", "empty symbol"),
            ("uretprobe:/bin/x:a b", "whitespace"),
        ] {
            let error = ProbeSpec::parse(spec).unwrap_err();
            let message = error.to_string();
            assert!(message.contains(&format!("{spec:?}")), "{message}");
            assert!(message.contains(problem), "{spec}: {message}");
        }
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", ""));
        assert!(glob_match("*", "anything"));
        assert!(glob_match("gc__*", "gc__start"));
        assert!(glob_match("gc__*", "gc__"));
        assert!(!glob_match("gc__*", "gc_start"));
        assert!(glob_match("*__done", "import__find__load__done"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(glob_match("str?py", "strcpy"));
        assert!(!glob_match("str?py", "strpy"));
        assert!(glob_match("malloc", "malloc"));
        assert!(!glob_match("malloc", "malloc2"));
        assert!(is_glob("a*") && is_glob("a?") && !is_glob("abc"));
    }

    #[test]
    fn near_matches() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("gc__start", "gc__start"), 0);
        let names = [
            "gc__start",
            "gc__done",
            "audit",
            "line",
            "import__find__load__start",
        ];
        assert_eq!(suggest("gc_start", names), vec!["gc__start"]);
        assert_eq!(suggest("gc__stat", names), vec!["gc__start"]);
        assert_eq!(suggest("gc__don", names), vec!["gc__done"]);
        assert_eq!(suggest("lines", names), vec!["line"]);
        assert!(suggest("query__start", names).is_empty());
        assert!(
            suggest("gc__start", names).is_empty(),
            "an exact name is not a suggestion"
        );
    }
}

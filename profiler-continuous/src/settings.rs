//! One definition per setting: every key of the config file is also a flag
//! and an environment variable, and all three come from the field of the
//! config types that holds the key (its name, type, doc comment and
//! default), read through the types' JSON schema (schemars). Adding a key
//! is adding a field.
//!
//! Names: a key of a section is flattened with an underscore, so
//! `[pyroscope] url` is `--pyroscope-url` and
//! `PROFILER_AGENT_PYROSCOPE_URL`; a field may name its flag itself
//! (`#[schemars(extend("x-flag" = "..."))]`, kept for flags older than
//! this rule). Arrays of tables (`[[probes]]`) are file-only.
//!
//! Precedence, as documented: flag > environment > file > default. clap
//! gives a flag precedence over its variable; [`apply`] then lays the
//! values given either way over the file's table before the whole is
//! deserialized once, so a value from a flag is checked exactly as the
//! same value in the file is.

use std::sync::OnceLock;

use serde_json::{Map, Value};

use std::path::{Path, PathBuf};

use crate::config::{Config, ConfigError};

/// The prefix of every setting's environment variable.
pub const ENV_PREFIX: &str = "PROFILER_AGENT_";

/// What a setting's value is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A string, a path, or a duration ("15s").
    Text,
    Integer,
    Boolean,
    /// One of these words.
    Choice(Vec<String>),
    /// Comma-separated values of a kind.
    List(Box<Kind>),
}

/// One key of the config file, with its flag and variable.
#[derive(Debug, Clone)]
pub struct Setting {
    /// The key's path: `["pyroscope", "url"]`.
    pub key: Vec<String>,
    /// `pyroscope-url` (the flag is `--pyroscope-url`).
    pub flag: String,
    /// `PROFILER_AGENT_PYROSCOPE_URL`.
    pub env: String,
    pub kind: Kind,
    /// The field's doc comment, on one line, with its default.
    pub help: String,
    /// A secret (a password, a token): its variable's value is not shown.
    pub secret: bool,
    /// The placeholder of its value in `--help` (`FILE`, `URL`, `TIME`).
    pub value_name: &'static str,
}

impl Setting {
    /// `pyroscope.url`, as the file's sections and errors name it.
    pub fn dotted(&self) -> String {
        self.key.join(".")
    }
}

/// The placeholder of a value in `--help`, from its kind, name and
/// default.
fn value_name(kind: &Kind, name: &str, default: Option<&Value>) -> &'static str {
    let is_duration = default
        .and_then(Value::as_str)
        .is_some_and(|d| !d.is_empty() && humantime::parse_duration(d).is_ok());
    match kind {
        Kind::Integer => "N",
        Kind::Boolean => "BOOL",
        Kind::Choice(_) => "WORD",
        Kind::List(_) => "A,B,...",
        Kind::Text if name.ends_with("file") => "FILE",
        Kind::Text if name.ends_with("url") => "URL",
        Kind::Text if name == "listen" => "HOST:PORT",
        Kind::Text if name == "path" || name == "cache" => "DIR",
        Kind::Text if is_duration || name.contains("timeout") => "TIME",
        Kind::Text => "TEXT",
    }
}

/// Every setting, in the order of the config types' fields.
pub fn settings() -> &'static [Setting] {
    static SETTINGS: OnceLock<Vec<Setting>> = OnceLock::new();
    SETTINGS.get_or_init(|| {
        let schema = serde_json::to_value(schemars::schema_for!(Config)).unwrap_or_default();
        let defs = schema
            .get("$defs")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let mut out = Vec::new();
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            walk(properties, &defs, &[], &mut out);
        }
        out
    })
}

/// The setting of flag `flag` (without its dashes).
pub fn by_flag(flag: &str) -> Option<&'static Setting> {
    settings().iter().find(|s| s.flag == flag)
}

fn walk(
    properties: &Map<String, Value>,
    defs: &Map<String, Value>,
    prefix: &[String],
    out: &mut Vec<Setting>,
) {
    for (name, property) in properties {
        let resolved = resolve(property, defs);
        let mut key = prefix.to_vec();
        key.push(name.clone());
        if is_object(resolved) {
            if let Some(nested) = resolved.get("properties").and_then(Value::as_object) {
                walk(nested, defs, &key, out);
            }
            continue;
        }
        let Some(kind) = kind_of(resolved, defs) else {
            continue; // arrays of tables: the file only
        };
        let flag = property
            .get("x-flag")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| key.join("-").replace('_', "-"));
        let env = format!(
            "{ENV_PREFIX}{}",
            flag.replace('-', "_").to_ascii_uppercase()
        );
        let secret = ["password", "token"]
            .iter()
            .any(|s| name.contains(s) && !name.ends_with("_file"));
        out.push(Setting {
            value_name: value_name(&kind, name, property.get("default")),
            help: help_of(property, resolved),
            key,
            flag,
            env,
            kind,
            secret,
        });
    }
}

/// A `$ref` followed to its definition (one level: the types nest once).
fn resolve<'a>(schema: &'a Value, defs: &'a Map<String, Value>) -> &'a Value {
    match schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
    {
        Some(name) => defs.get(name).unwrap_or(schema),
        None => schema,
    }
}

fn is_object(schema: &Value) -> bool {
    types_of(schema).contains(&"object")
}

/// The JSON types a schema allows, `null` (an `Option`) left out.
fn types_of(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect(),
        _ => Vec::new(),
    }
}

fn kind_of(schema: &Value, defs: &Map<String, Value>) -> Option<Kind> {
    if let Some(words) = schema.get("enum").and_then(Value::as_array) {
        return Some(Kind::Choice(
            words
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
        ));
    }
    // An enum some of whose variants have doc comments: a `const` for
    // each of those, an `enum` of the others.
    if let Some(variants) = schema.get("oneOf").and_then(Value::as_array) {
        let mut words = Vec::new();
        for variant in variants {
            match (variant.get("const"), variant.get("enum")) {
                (Some(Value::String(word)), _) => words.push(word.clone()),
                (_, Some(Value::Array(more))) => {
                    words.extend(more.iter().filter_map(Value::as_str).map(str::to_string))
                }
                _ => return None,
            }
        }
        return Some(Kind::Choice(words));
    }
    match types_of(schema).first().copied() {
        Some("string") => Some(Kind::Text),
        Some("integer") => Some(Kind::Integer),
        Some("boolean") => Some(Kind::Boolean),
        Some("array") => {
            let items = resolve(schema.get("items")?, defs);
            if is_object(items) {
                return None;
            }
            Some(Kind::List(Box::new(kind_of(items, defs)?)))
        }
        _ => None,
    }
}

/// The doc comment's first paragraph on one line, and the default when it
/// says something ("[default: 15s]").
fn help_of(property: &Value, resolved: &Value) -> String {
    let description = property
        .get("description")
        .or_else(|| resolved.get("description"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let first = description.split("\n\n").next().unwrap_or_default();
    let mut help = first.split_whitespace().collect::<Vec<_>>().join(" ");
    let default = match property.get("default") {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(Value::Bool(b)) => Some(b.to_string()),
        Some(Value::Array(items)) if !items.is_empty() => Some(
            items
                .iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join(","),
        ),
        _ => None,
    };
    if let Some(default) = default
        && !help.contains("[default:")
    {
        if !help.is_empty() {
            help.push(' ');
        }
        help.push_str(&format!("[default: {default}]"));
    }
    help
}

/// The file at `path` (or the defaults without one), the values given
/// by flag or environment variable laid over it (`settings`), then
/// validation.
pub fn load(path: Option<&Path>, given: &[(&Setting, Vec<String>)]) -> Result<Config, ConfigError> {
    let (mut table, source) = match path {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            let table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
            (table, path.to_path_buf())
        }
        None => (toml::Table::new(), PathBuf::from("(no config file)")),
    };
    for (setting, values) in given {
        apply(&mut table, setting, values)?;
    }
    let config: Config = table.try_into().map_err(|e: toml::de::Error| {
        // Name the flag or variable when the bad value came from one.
        let flagged = given.iter().find_map(|(setting, values)| {
            let mut alone = toml::Table::new();
            apply(&mut alone, setting, values).ok()?;
            let error = toml::Value::Table(alone).try_into::<Config>().err()?;
            Some(ConfigError::Flag {
                flag: setting.flag.clone(),
                env: setting.env.clone(),
                message: error.to_string().replace('\n', " "),
            })
        });
        flagged.unwrap_or(ConfigError::Parse {
            path: source,
            message: e.to_string(),
        })
    })?;
    config.validate()?;
    Ok(config)
}

/// Lays `values`, given for `setting` by a flag or its variable, over the
/// file's `table`, typed as the setting's kind.
pub fn apply(
    table: &mut toml::Table,
    setting: &Setting,
    values: &[String],
) -> Result<(), ConfigError> {
    let invalid = |message: String| ConfigError::Flag {
        flag: setting.flag.clone(),
        env: setting.env.clone(),
        message,
    };
    let value = match &setting.kind {
        Kind::List(item) => toml::Value::Array(
            values
                .iter()
                .flat_map(|v| v.split(','))
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(|v| scalar(item, v).map_err(&invalid))
                .collect::<Result<_, _>>()?,
        ),
        kind => {
            let text = values.last().map(String::as_str).unwrap_or_default();
            scalar(kind, text).map_err(invalid)?
        }
    };
    let (last, sections) = setting.key.split_last().expect("a key has a name");
    let mut at = table;
    for section in sections {
        let entry = at
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        at = match entry {
            toml::Value::Table(t) => t,
            _ => {
                return Err(ConfigError::Flag {
                    flag: setting.flag.clone(),
                    env: setting.env.clone(),
                    message: format!("the file's {section} is not a [{section}] section"),
                });
            }
        };
    }
    at.insert(last.clone(), value);
    Ok(())
}

fn scalar(kind: &Kind, text: &str) -> Result<toml::Value, String> {
    match kind {
        Kind::Integer => text
            .trim()
            .parse::<i64>()
            .map(toml::Value::Integer)
            .map_err(|_| format!("{text:?} is not a whole number")),
        Kind::Boolean => match text.trim() {
            "true" | "1" | "yes" | "on" => Ok(toml::Value::Boolean(true)),
            "false" | "0" | "no" | "off" => Ok(toml::Value::Boolean(false)),
            _ => Err(format!("{text:?} is not true or false")),
        },
        Kind::Choice(words) if !words.iter().any(|w| w == text) => {
            Err(format!("{text:?} is not one of {}", words.join(", ")))
        }
        Kind::Choice(_) | Kind::Text | Kind::List(_) => Ok(toml::Value::String(text.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn flags_and_variables_replace_file_values() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "window = \"30s\"\n[directory]\npath = \"/a\"\n").unwrap();
        let given = [
            (by_flag("window").unwrap(), vec!["5s".to_string()]),
            (by_flag("directory-path").unwrap(), vec!["/b".to_string()]),
            (
                by_flag("pyroscope-url").unwrap(),
                vec!["http://127.0.0.1:4040".to_string()],
            ),
        ];
        let config = load(Some(&file), &given).unwrap();
        assert_eq!(config.window, Duration::from_secs(5));
        assert_eq!(config.directory.path, PathBuf::from("/b"));
        assert_eq!(config.pyroscope.url, "http://127.0.0.1:4040");
        // What the file set and nobody overrode stays; the rest is default.
        let config = load(Some(&file), &[]).unwrap();
        assert_eq!(config.window, Duration::from_secs(30));
        assert_eq!(config.frequency_hz, 100);
        // A value a flag gives is checked as the file's would be.
        let bad = [(by_flag("window").unwrap(), vec!["soon".to_string()])];
        let error = load(None, &bad).unwrap_err().to_string();
        assert!(error.contains("soon"), "{error}");
    }

    #[test]
    fn every_key_has_a_flag_a_variable_and_help() {
        let all = settings();
        assert!(all.len() > 50, "{} settings", all.len());
        let url = by_flag("pyroscope-url").unwrap();
        assert_eq!(url.key, ["pyroscope", "url"]);
        assert_eq!(url.env, "PROFILER_AGENT_PYROSCOPE_URL");
        // Flattened sections keep their section's name.
        assert_eq!(
            by_flag("otlp-tenant-id").unwrap().key,
            ["otlp", "tenant_id"]
        );
        // The names flags had before the rule.
        assert_eq!(
            by_flag("web-config-file").unwrap().key,
            ["auth", "web_config_file"]
        );
        assert_eq!(
            by_flag("bearer-token-file").unwrap().key,
            ["auth", "bearer_token_file"]
        );
        assert_eq!(
            by_flag("auth-kubernetes").unwrap().key,
            ["auth", "kubernetes"]
        );
        assert_eq!(
            by_flag("pids").unwrap().kind,
            Kind::List(Box::new(Kind::Integer))
        );
        assert_eq!(
            by_flag("otlp-protocol").unwrap().kind,
            Kind::Choice(vec!["grpc".into(), "http/protobuf".into()])
        );
        let Kind::Choice(mut modes) = by_flag("kubernetes-enabled").unwrap().kind.clone() else {
            panic!("kubernetes.enabled is not a choice");
        };
        modes.sort();
        assert_eq!(modes, ["auto", "off", "on"]);
        assert!(by_flag("window").unwrap().help.contains("[default: 15s]"));
        assert!(by_flag("otlp-basic-auth-password").unwrap().secret);
        assert!(!by_flag("otlp-ca-file").unwrap().secret);
        // [[probes]] is the file's only.
        assert!(all.iter().all(|s| s.key[0] != "probes"));
        let undocumented: Vec<String> = all
            .iter()
            .filter(|s| s.help.is_empty() || s.help.starts_with("[default:"))
            .map(Setting::dotted)
            .collect();
        assert!(
            undocumented.is_empty(),
            "keys without a doc comment: {undocumented:?}"
        );
        let mut flags: Vec<&str> = all.iter().map(|s| s.flag.as_str()).collect();
        flags.sort();
        flags.dedup();
        assert_eq!(flags.len(), all.len(), "two keys share a flag");
    }

    #[test]
    fn values_are_typed_as_their_keys() {
        let mut table = toml::Table::new();
        apply(&mut table, by_flag("pids").unwrap(), &["1,2".into()]).unwrap();
        apply(&mut table, by_flag("off-cpu").unwrap(), &["true".into()]).unwrap();
        apply(
            &mut table,
            by_flag("directory-path").unwrap(),
            &["/b".into()],
        )
        .unwrap();
        let config: Config = table.try_into().unwrap();
        assert_eq!(config.pids, [1, 2]);
        assert!(config.off_cpu);
        assert_eq!(config.directory.path, std::path::PathBuf::from("/b"));
        let error = apply(
            &mut toml::Table::new(),
            by_flag("frequency-hz").unwrap(),
            &["fast".into()],
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("--frequency-hz") && error.contains("PROFILER_AGENT_FREQUENCY_HZ"),
            "{error}"
        );
    }
}

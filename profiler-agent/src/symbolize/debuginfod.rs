//! A debuginfod client in elfutils' conventions: debug files fetched by
//! GNU build id from the servers in `DEBUGINFOD_URLS` (space-separated,
//! tried in order), cached under `DEBUGINFOD_CACHE_PATH` (default
//! `$XDG_CACHE_HOME/debuginfod_client`, as elfutils) as `ID/debuginfo`,
//! with `DEBUGINFOD_TIMEOUT` seconds per request and `DEBUGINFOD_MAXSIZE`
//! bytes per file. Off unless `DEBUGINFOD_URLS` is set.
//!
//! What a server sends is untrusted: a file larger than the cap is
//! refused while it downloads, and one whose build id is not the one
//! asked for is discarded, never cached. A build id no server has is
//! remembered for ten minutes (a `.miss` file, as elfutils does), so a
//! profile does not ask again per window. Fetching never holds up a
//! profile for long: on top of the per-request timeout, the time one
//! symbolizer spends fetching is bounded (30 s, plus a third of the time
//! it has existed, so a continuous agent keeps fetching for binaries that
//! appear later).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// How long a build id no server had is not asked for again.
const MISS_TTL: Duration = Duration::from_secs(600);
/// Fetch time allowed up front, before the third of the elapsed time.
const INITIAL_BUDGET: Duration = Duration::from_secs(30);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// Where and how to fetch.
#[derive(Debug, Clone)]
pub struct DebuginfodConfig {
    pub urls: Vec<String>,
    pub cache: PathBuf,
    pub timeout: Duration,
    pub max_bytes: u64,
}

impl DebuginfodConfig {
    /// From the environment, as elfutils reads it; None when
    /// `DEBUGINFOD_URLS` is unset or empty.
    pub fn from_env() -> Option<DebuginfodConfig> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let urls: Vec<String> = var("DEBUGINFOD_URLS")?
            .split_whitespace()
            .map(|u| u.trim_end_matches('/').to_string())
            .collect();
        if urls.is_empty() {
            return None;
        }
        let cache = var("DEBUGINFOD_CACHE_PATH")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let base = var("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| {
                    PathBuf::from(var("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
                });
                base.join("debuginfod_client")
            });
        let timeout = var("DEBUGINFOD_TIMEOUT")
            .and_then(|t| t.trim().parse::<u64>().ok())
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs);
        let max_bytes = var("DEBUGINFOD_MAXSIZE")
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|&m| m > 0)
            .unwrap_or(DEFAULT_MAX_BYTES);
        Some(DebuginfodConfig {
            urls,
            cache,
            timeout,
            max_bytes,
        })
    }
}

/// Counts for the run's report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DebuginfodStats {
    pub fetched: u64,
    pub cached: u64,
    pub missing: u64,
    pub rejected: u64,
    /// Not asked for: the fetch time budget was spent.
    pub over_budget: u64,
}

pub struct Debuginfod {
    config: DebuginfodConfig,
    agent: ureq::Agent,
    started: Instant,
    spent: Duration,
    pub stats: DebuginfodStats,
    /// One line per failure, for the run's report.
    pub problems: Vec<String>,
}

impl Debuginfod {
    pub fn new(config: DebuginfodConfig) -> Debuginfod {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(config.timeout.max(Duration::from_millis(1))))
            .http_status_as_error(false)
            .build()
            .into();
        Debuginfod {
            config,
            agent,
            started: Instant::now(),
            spent: Duration::ZERO,
            stats: DebuginfodStats::default(),
            problems: Vec::new(),
        }
    }

    /// The debug file for `build_id`: from the cache, or fetched. None
    /// when no server has it (or it could not be asked).
    pub fn debuginfo(&mut self, build_id: &[u8]) -> Option<PathBuf> {
        if build_id.is_empty() {
            return None;
        }
        let id: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
        let dir = self.config.cache.join(&id);
        let path = dir.join("debuginfo");
        if path.is_file() {
            self.stats.cached += 1;
            return Some(path);
        }
        let miss = dir.join(".miss");
        if std::fs::metadata(&miss)
            .and_then(|m| m.modified())
            .is_ok_and(|at| SystemTime::now().duration_since(at).unwrap_or_default() < MISS_TTL)
        {
            self.stats.missing += 1;
            return None;
        }
        let allowed = INITIAL_BUDGET + self.started.elapsed() / 3;
        if self.spent >= allowed {
            self.stats.over_budget += 1;
            return None;
        }
        let started = Instant::now();
        let found = self.fetch(&id, build_id, &dir, &path);
        self.spent += started.elapsed();
        if found.is_none() {
            if std::fs::create_dir_all(&dir).is_ok() {
                let _ = std::fs::write(&miss, b"");
            }
            self.stats.missing += 1;
        }
        found
    }

    fn fetch(&mut self, id: &str, build_id: &[u8], dir: &Path, path: &Path) -> Option<PathBuf> {
        for base in self.config.urls.clone() {
            let url = format!("{base}/buildid/{id}/debuginfo");
            match self.download(&url) {
                Ok(None) => continue,
                Ok(Some(bytes)) => {
                    if !has_build_id(&bytes, build_id) {
                        self.stats.rejected += 1;
                        self.problems.push(format!(
                            "debuginfod {url}: the file's build id is not {id}; discarded"
                        ));
                        continue;
                    }
                    match store(dir, path, &bytes) {
                        Ok(()) => {
                            self.stats.fetched += 1;
                            return Some(path.to_path_buf());
                        }
                        Err(e) => {
                            self.problems
                                .push(format!("debuginfod cache {}: {e}", path.display()));
                            return None;
                        }
                    }
                }
                Err(e) => self.problems.push(format!("debuginfod {url}: {e}")),
            }
        }
        None
    }

    /// The body of a 200 answer; None for 404 (the server does not have
    /// it); an error for anything else.
    fn download(&self, url: &str) -> Result<Option<Vec<u8>>, String> {
        let mut response = self.agent.get(url).call().map_err(|e| e.to_string())?;
        match response.status().as_u16() {
            200 => {}
            404 => return Ok(None),
            status => return Err(format!("HTTP {status}")),
        }
        if let Some(length) = response
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            && length > self.config.max_bytes
        {
            return Err(format!(
                "{length} bytes, more than DEBUGINFOD_MAXSIZE ({}); refused",
                self.config.max_bytes
            ));
        }
        response
            .body_mut()
            .with_config()
            .limit(self.config.max_bytes)
            .read_to_vec()
            .map(Some)
            .map_err(|e| e.to_string())
    }
}

/// Whether `bytes` is an ELF file with GNU build id `expected`.
fn has_build_id(bytes: &[u8], expected: &[u8]) -> bool {
    super::elf::guard(|| {
        use object::Object;
        let file = object::File::parse(bytes)?;
        Ok(file.build_id()?.is_some_and(|id| id == expected))
    })
    .unwrap_or(false)
}

/// Writes `bytes` to `path` atomically (a temporary file renamed).
fn store(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let temporary = dir.join(format!(".debuginfo.{}", std::process::id()));
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_elf_file_is_accepted_only_for_its_own_build_id() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let id = {
            use object::Object;
            object::File::parse(&*exe)
                .unwrap()
                .build_id()
                .unwrap()
                .map(<[u8]>::to_vec)
        };
        if let Some(id) = id {
            assert!(has_build_id(&exe, &id));
            let mut other = id.clone();
            other[0] ^= 0xff;
            assert!(!has_build_id(&exe, &other));
        }
        assert!(!has_build_id(b"<html>not found</html>", &[1, 2, 3]));
    }

    #[test]
    fn misses_are_remembered_and_the_budget_is_kept() {
        let cache = tempfile::tempdir().unwrap();
        // A port nothing listens on: connection refused at once.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let mut client = Debuginfod::new(DebuginfodConfig {
            urls: vec![format!("http://127.0.0.1:{port}")],
            cache: cache.path().to_path_buf(),
            timeout: Duration::from_secs(2),
            max_bytes: 1 << 20,
        });
        assert_eq!(client.debuginfo(&[0xab, 0xcd]), None);
        assert!(cache.path().join("abcd/.miss").exists());
        assert_eq!(client.debuginfo(&[0xab, 0xcd]), None);
        assert_eq!(client.stats.missing, 2);
        assert_eq!(client.problems.len(), 1, "{:?}", client.problems);
        client.spent = INITIAL_BUDGET * 2;
        assert_eq!(client.debuginfo(&[0x12]), None);
        assert_eq!(client.stats.over_budget, 1);
    }
}

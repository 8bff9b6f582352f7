//! A debuginfod client in elfutils' conventions: debug files fetched by
//! GNU build id from the servers in `DEBUGINFOD_URLS` (space-separated,
//! tried in order), cached under `DEBUGINFOD_CACHE_PATH` (default
//! `$XDG_CACHE_HOME/debuginfod_client`, as elfutils) as `ID/debuginfo`,
//! with `DEBUGINFOD_TIMEOUT` seconds per request and `DEBUGINFOD_MAXSIZE`
//! bytes per file. Off unless `DEBUGINFOD_URLS` is set (or the
//! `--debuginfod-urls` flag, the `[debuginfod]` config section).
//!
//! What a server sends is untrusted: a file larger than the cap is
//! refused while it downloads, and one whose build id is not the one
//! asked for is discarded, never cached. A build id no server has is
//! remembered for ten minutes (a `.miss` file, as elfutils does), so a
//! profile does not ask again per window.
//!
//! Fetching never blocks sampling: downloads run on the client's own
//! threads. A lookup asks for a file and either waits for it until a
//! deadline (the end of `record`, the `symbolize` command) or returns at
//! once (the continuous agent, whose symbolizer re-reads the object in a
//! later window once its file has arrived). One client serves the whole
//! process, so its cache of misses and its counters outlive a sampler
//! restart.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// How long a build id no server had is not asked for again.
const MISS_TTL: Duration = Duration::from_secs(600);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_MAX_BYTES: u64 = 1 << 30;
/// Downloads at a time.
const WORKERS: usize = 2;
/// Build ids waiting for a download at most; more are dropped (counted)
/// and asked for again when their objects are next read. A node full of
/// distinct stripped binaries (or a pod making them) cannot grow the queue.
const MAX_PENDING: usize = 256;
/// Failure lines kept for reports.
const MAX_PROBLEMS: usize = 64;

/// Where and how to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebuginfodConfig {
    pub urls: Vec<String>,
    pub cache: PathBuf,
    pub timeout: Duration,
    pub max_bytes: u64,
}

/// Settings given on the command line or in the agent's config file; each
/// one that is set wins over its environment variable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DebuginfodSettings {
    /// Servers, tried in order (`DEBUGINFOD_URLS`).
    pub urls: Vec<String>,
    /// Cache directory (`DEBUGINFOD_CACHE_PATH`).
    pub cache: Option<PathBuf>,
    /// Per-request timeout (`DEBUGINFOD_TIMEOUT`).
    pub timeout: Option<Duration>,
    /// Largest debug file accepted, in bytes (`DEBUGINFOD_MAXSIZE`).
    pub max_bytes: Option<u64>,
}

impl DebuginfodConfig {
    /// From the environment, as elfutils reads it; None when
    /// `DEBUGINFOD_URLS` is unset or empty.
    pub fn from_env() -> Option<DebuginfodConfig> {
        Self::from_settings(&DebuginfodSettings::default())
    }

    /// `settings` over the environment; None when neither names a server.
    pub fn from_settings(settings: &DebuginfodSettings) -> Option<DebuginfodConfig> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let urls: Vec<String> = if settings.urls.is_empty() {
            var("DEBUGINFOD_URLS")?
                .split_whitespace()
                .map(str::to_string)
                .collect()
        } else {
            settings
                .urls
                .iter()
                .flat_map(|u| u.split_whitespace())
                .map(str::to_string)
                .collect()
        };
        let urls: Vec<String> = urls
            .into_iter()
            .map(|u| u.trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            return None;
        }
        let cache = settings.cache.clone().unwrap_or_else(|| {
            var("DEBUGINFOD_CACHE_PATH")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    let base = var("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| {
                        PathBuf::from(var("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
                    });
                    base.join("debuginfod_client")
                })
        });
        let timeout = settings.timeout.unwrap_or_else(|| {
            var("DEBUGINFOD_TIMEOUT")
                .and_then(|t| t.trim().parse::<u64>().ok())
                .map_or(DEFAULT_TIMEOUT, Duration::from_secs)
        });
        let max_bytes = settings
            .max_bytes
            .or_else(|| var("DEBUGINFOD_MAXSIZE").and_then(|t| t.trim().parse::<u64>().ok()))
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

static GLOBAL: OnceLock<Option<Arc<Debuginfod>>> = OnceLock::new();

/// Sets the process's client from `settings` (over the environment).
/// Call before the first profile; later calls change nothing and return
/// false.
pub fn configure(settings: &DebuginfodSettings) -> bool {
    GLOBAL
        .set(DebuginfodConfig::from_settings(settings).map(|c| Arc::new(Debuginfod::new(c))))
        .is_ok()
}

/// The process's client: as configured, or from the environment.
pub fn global() -> Option<Arc<Debuginfod>> {
    GLOBAL
        .get_or_init(|| DebuginfodConfig::from_env().map(|c| Arc::new(Debuginfod::new(c))))
        .clone()
}

/// What a lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Found(PathBuf),
    /// No server has it (or it could not be asked).
    Missing,
    /// Still downloading: ask again later.
    Pending,
}

/// Counts for the run's report and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DebuginfodStats {
    /// Debug files downloaded (and checked).
    pub fetched: u64,
    /// Found in the cache.
    pub cached: u64,
    /// No server had it (including remembered misses).
    pub missing: u64,
    /// Downloaded with another build id: discarded.
    pub rejected: u64,
    /// Errors: a server down or timing out, an HTTP error, a file over the
    /// size cap, the cache not writable.
    pub failed: u64,
    /// Not asked for: too many downloads already waiting.
    pub dropped: u64,
}

/// One client per process (see `global`), shared by every symbolizer.
pub struct Debuginfod {
    config: DebuginfodConfig,
    shared: Arc<Shared>,
    /// Requests to the download threads, started on first use.
    requests: Mutex<Option<mpsc::Sender<Request>>>,
}

struct Shared {
    config: DebuginfodConfig,
    #[cfg(feature = "debuginfod")]
    agent: ureq::Agent,
    state: Mutex<State>,
    /// Signalled whenever a download ends.
    finished: Condvar,
}

#[derive(Default)]
struct State {
    pending: HashSet<String>,
    /// Downloaded by this process: a later lookup is not a cache hit.
    fetched_here: HashSet<String>,
    stats: DebuginfodStats,
    problems: VecDeque<String>,
}

impl State {
    fn problem(&mut self, line: String) {
        if self.problems.len() == MAX_PROBLEMS {
            self.problems.pop_front();
        }
        self.problems.push_back(line);
    }
}

struct Request {
    id: String,
    build_id: Vec<u8>,
}

impl Debuginfod {
    pub fn new(config: DebuginfodConfig) -> Debuginfod {
        #[cfg(feature = "debuginfod")]
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(config.timeout.max(Duration::from_millis(1))))
            .http_status_as_error(false)
            .build()
            .into();
        Debuginfod {
            config: config.clone(),
            shared: Arc::new(Shared {
                config,
                #[cfg(feature = "debuginfod")]
                agent,
                state: Mutex::new(State::default()),
                finished: Condvar::new(),
            }),
            requests: Mutex::new(None),
        }
    }

    pub fn config(&self) -> &DebuginfodConfig {
        &self.config
    }

    pub fn stats(&self) -> DebuginfodStats {
        self.shared.lock().stats
    }

    /// The latest failures, one line each.
    pub fn problems(&self) -> Vec<String> {
        self.shared.lock().problems.iter().cloned().collect()
    }

    /// The debug file for `build_id`: from the cache, or asked for. Waits
    /// for the download until `wait_until`, or not at all.
    pub fn lookup(&self, build_id: &[u8], wait_until: Option<Instant>) -> Lookup {
        if build_id.is_empty() {
            return Lookup::Missing;
        }
        let id = hex(build_id);
        let path = self.config.cache.join(&id).join("debuginfo");
        let mut state = self.shared.lock();
        if !state.pending.contains(&id) {
            if path.is_file() {
                if !state.fetched_here.contains(&id) {
                    state.stats.cached += 1;
                }
                return Lookup::Found(path);
            }
            if recent_miss(&self.config.cache.join(&id)) {
                state.stats.missing += 1;
                return Lookup::Missing;
            }
            if state.pending.len() >= MAX_PENDING {
                state.stats.dropped += 1;
                return Lookup::Missing;
            }
            state.pending.insert(id.clone());
            if !self.send(Request {
                id: id.clone(),
                build_id: build_id.to_vec(),
            }) {
                state.pending.remove(&id);
                state.stats.failed += 1;
                return Lookup::Missing;
            }
        }
        let Some(deadline) = wait_until else {
            return Lookup::Pending;
        };
        while state.pending.contains(&id) {
            let now = Instant::now();
            if now >= deadline {
                return Lookup::Pending;
            }
            state = self
                .shared
                .finished
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if path.is_file() {
            Lookup::Found(path)
        } else {
            Lookup::Missing
        }
    }

    /// Downloads asked for and not finished.
    pub fn pending(&self) -> usize {
        self.shared.lock().pending.len()
    }

    /// Whether the download of `build_id` is still under way.
    pub fn is_pending(&self, build_id: &[u8]) -> bool {
        self.shared.lock().pending.contains(&hex(build_id))
    }

    /// Hands a request to the download threads, starting them on first
    /// use. False when they cannot be started.
    fn send(&self, request: Request) -> bool {
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        if requests.is_none() {
            let (sender, receiver) = mpsc::channel::<Request>();
            let receiver = Arc::new(Mutex::new(receiver));
            for n in 0..WORKERS {
                let receiver = receiver.clone();
                let shared = self.shared.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("debuginfod-{n}"))
                    .spawn(move || {
                        loop {
                            let next = receiver.lock().unwrap_or_else(|e| e.into_inner()).recv();
                            let Ok(request) = next else { return };
                            shared.fetch(&request);
                        }
                    });
                if spawned.is_err() {
                    return false;
                }
            }
            *requests = Some(sender);
        }
        requests
            .as_ref()
            .is_some_and(|sender| sender.send(request).is_ok())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `dir` holds a `.miss` marker younger than `MISS_TTL`.
fn recent_miss(dir: &Path) -> bool {
    std::fs::metadata(dir.join(".miss"))
        .and_then(|m| m.modified())
        .is_ok_and(|at| SystemTime::now().duration_since(at).unwrap_or_default() < MISS_TTL)
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one download (on a download thread) and tells the waiters.
    fn fetch(&self, request: &Request) {
        let dir = self.config.cache.join(&request.id);
        let path = dir.join("debuginfo");
        let found = self.try_servers(&request.id, &request.build_id, &dir, &path);
        let mut state = self.lock();
        if found {
            state.stats.fetched += 1;
            state.fetched_here.insert(request.id.clone());
        } else {
            if std::fs::create_dir_all(&dir).is_ok() {
                let _ = std::fs::write(dir.join(".miss"), b"");
            }
            state.stats.missing += 1;
        }
        state.pending.remove(&request.id);
        drop(state);
        self.finished.notify_all();
    }

    /// Asks each server in turn; true once one gave the file. A body is
    /// streamed to a temporary file in the cache (a 1 GiB debug file never
    /// sits in memory), checked there, and renamed into place.
    fn try_servers(&self, id: &str, build_id: &[u8], dir: &Path, path: &Path) -> bool {
        if let Err(e) = std::fs::create_dir_all(dir) {
            let mut state = self.lock();
            state.stats.failed += 1;
            state.problem(format!("debuginfod cache {}: {e}", dir.display()));
            return false;
        }
        // Two downloads of one build id never run at once (`pending`), and
        // two agents on one cache have their own pids.
        let temporary = dir.join(format!(".debuginfo.{}", std::process::id()));
        for base in &self.config.urls {
            let url = format!("{base}/buildid/{id}/debuginfo");
            let failure = match self.download(&url, &temporary) {
                Ok(false) => continue,
                Ok(true) if !file_has_build_id(&temporary, build_id) => {
                    self.lock().stats.rejected += 1;
                    format!("debuginfod {url}: the file's build id is not {id}; discarded")
                }
                Ok(true) => match std::fs::rename(&temporary, path) {
                    Ok(()) => return true,
                    Err(e) => format!("debuginfod cache {}: {e}", path.display()),
                },
                Err(e) => format!("debuginfod {url}: {e}"),
            };
            let _ = std::fs::remove_file(&temporary);
            let mut state = self.lock();
            state.stats.failed += 1;
            state.problem(failure);
        }
        false
    }

    #[cfg(not(feature = "debuginfod"))]
    fn download(&self, _url: &str, _to: &Path) -> Result<bool, String> {
        Err("built without the debuginfod feature (no HTTP client)".into())
    }

    /// Writes the body of a 200 answer to `to`: true; false for 404 (the
    /// server does not have it); an error for anything else, a body over
    /// the size cap included.
    #[cfg(feature = "debuginfod")]
    fn download(&self, url: &str, to: &Path) -> Result<bool, String> {
        let mut response = self.agent.get(url).call().map_err(|e| e.to_string())?;
        match response.status().as_u16() {
            200 => {}
            404 => return Ok(false),
            status => return Err(format!("HTTP {status}")),
        }
        let refused = |length: u64| {
            format!(
                "{length} bytes or more, more than DEBUGINFOD_MAXSIZE ({}); refused",
                self.config.max_bytes
            )
        };
        if let Some(length) = response
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            && length > self.config.max_bytes
        {
            return Err(refused(length));
        }
        let mut file = std::fs::File::create(to).map_err(|e| format!("{}: {e}", to.display()))?;
        let limit = self.config.max_bytes.saturating_add(1);
        let mut body = std::io::Read::take(response.body_mut().as_reader(), limit);
        let copied = std::io::copy(&mut body, &mut file).map_err(|e| e.to_string())?;
        if copied > self.config.max_bytes {
            return Err(refused(copied));
        }
        Ok(true)
    }
}

impl Debuginfod {
    #[cfg(test)]
    fn wait_idle(&self) {
        let mut state = self.shared.lock();
        while !state.pending.is_empty() {
            state = self
                .shared
                .finished
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
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

/// Whether the file at `path` is an ELF file with GNU build id `expected`.
fn file_has_build_id(path: &Path, expected: &[u8]) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    super::map_file(&file).is_ok_and(|map| has_build_id(&map, expected))
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
    fn misses_are_remembered_and_waits_end_at_their_deadline() {
        let cache = tempfile::tempdir().unwrap();
        // A port nothing listens on: connection refused at once.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let client = Debuginfod::new(DebuginfodConfig {
            urls: vec![format!("http://127.0.0.1:{port}")],
            cache: cache.path().to_path_buf(),
            timeout: Duration::from_secs(2),
            max_bytes: 1 << 20,
        });
        let soon = Instant::now() + Duration::from_secs(20);
        assert_eq!(client.lookup(&[0xab, 0xcd], Some(soon)), Lookup::Missing);
        assert!(cache.path().join("abcd/.miss").exists());
        assert_eq!(client.lookup(&[0xab, 0xcd], Some(soon)), Lookup::Missing);
        let stats = client.stats();
        assert_eq!((stats.missing, stats.failed), (2, 1), "{stats:?}");
        assert_eq!(client.problems().len(), 1, "{:?}", client.problems());

        // A server that accepts and never answers: a lookup without a
        // deadline returns at once, one with a deadline returns at it.
        let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = Debuginfod::new(DebuginfodConfig {
            urls: vec![format!("http://{}", hole.local_addr().unwrap())],
            cache: cache.path().to_path_buf(),
            timeout: Duration::from_secs(3),
            max_bytes: 1 << 20,
        });
        assert_eq!(client.lookup(&[0x12], None), Lookup::Pending);
        assert!(client.is_pending(&[0x12]));
        let deadline = Instant::now() + Duration::from_millis(200);
        assert_eq!(client.lookup(&[0x12], Some(deadline)), Lookup::Pending);
        assert!(Instant::now() >= deadline);
        client.wait_idle();
        assert!(!client.is_pending(&[0x12]));
        assert_eq!(client.stats().failed, 1);
    }
}

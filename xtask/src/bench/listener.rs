//! The listener under load from a hostile or busy neighbour: the agent's
//! RSS and threads with 1000 idle connections held open, and `/metrics`
//! throughput and latency with 10 clients hammering it. (Before the
//! listener moved to hyper, 4000 idle connections gave the agent 3894
//! threads and took its RSS from 24 to 111 MiB.)

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use super::process::{Managed, log_tail, read_rss_bytes};
use super::{Env, Plan};

#[derive(Debug, Clone, Default)]
pub struct Listener {
    pub idle_connections: usize,
    pub rss_before: u64,
    pub rss_idle: u64,
    pub threads_before: u64,
    pub threads_idle: u64,
    pub clients: usize,
    pub requests: u64,
    pub seconds: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub failures: u64,
}

fn threads(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// One keep-alive GET of `path`; false on any failure.
fn get(stream: &mut TcpStream, path: &str, buffer: &mut Vec<u8>) -> bool {
    if write!(stream, "GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n").is_err() {
        return false;
    }
    buffer.clear();
    let mut chunk = [0u8; 16 << 10];
    loop {
        let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return false,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < end + 4 + length {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return false,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        return head.starts_with("http/1.1 200");
    }
}

pub fn run(env: &Env, plan: &Plan) -> anyhow::Result<Listener> {
    let idle = 1000;
    let clients = 10;
    let seconds = if plan.quick { 2.0 } else { 15.0 };
    eprintln!(
        "bench: the listener with {idle} idle connections, then {clients} clients on /metrics"
    );
    let port = {
        let socket = std::net::TcpListener::bind("127.0.0.1:0")?;
        socket.local_addr()?.port()
    };
    let log = env.out.join("listener.log");
    let mut command = Command::new(&env.agent);
    command
        .arg("run")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--directory-path", ""])
        .args(["--kubernetes-enabled", "off"]);
    for (key, _) in std::env::vars() {
        if key.starts_with("PROFILER_AGENT_") {
            command.env_remove(key);
        }
    }
    let mut agent = Managed::spawn_logged(&mut command, "profiler-agent run", &log)?;
    agent.watch();
    let pid = agent.pid();
    let ready = Instant::now();
    loop {
        let mut buffer = Vec::new();
        if TcpStream::connect(("127.0.0.1", port))
            .is_ok_and(|mut s| get(&mut s, "/readyz", &mut buffer))
        {
            break;
        }
        if ready.elapsed() > Duration::from_secs(60) {
            anyhow::bail!("the agent was not ready:\n{}", log_tail(&log));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let mut result = Listener {
        idle_connections: idle,
        clients,
        seconds,
        rss_before: read_rss_bytes(pid).map_or(0, |r| r.0),
        threads_before: threads(pid),
        ..Listener::default()
    };
    let held: Vec<TcpStream> = (0..idle)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    result.rss_idle = read_rss_bytes(pid).map_or(0, |r| r.0);
    result.threads_idle = threads(pid);
    drop(held);
    std::thread::sleep(Duration::from_millis(500));

    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                let mut failures = 0u64;
                let mut buffer = Vec::new();
                let mut stream = TcpStream::connect(("127.0.0.1", port)).ok();
                while Instant::now() < deadline {
                    let Some(s) = stream.as_mut() else {
                        stream = TcpStream::connect(("127.0.0.1", port)).ok();
                        failures += 1;
                        continue;
                    };
                    let started = Instant::now();
                    if get(s, "/metrics", &mut buffer) {
                        latencies.push(started.elapsed());
                    } else {
                        failures += 1;
                        stream = None;
                    }
                }
                (latencies, failures)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for worker in workers {
        let (mut l, f) = worker
            .join()
            .map_err(|_| anyhow::anyhow!("a client panicked"))?;
        latencies.append(&mut l);
        result.failures += f;
    }
    drop(agent);
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q) as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    result.requests = latencies.len() as u64;
    result.p50_ms = at(0.5);
    result.p99_ms = at(0.99);
    if result.requests == 0 {
        anyhow::bail!("no /metrics request succeeded:\n{}", log_tail(&log));
    }
    Ok(result)
}

//! Latency histograms (and hit counts) of the probes listed in the config
//! (`[[probes]]`), kept in the kernel for the whole run and exported on
//! `/metrics`: the same plans, BPF programs and rendering as
//! `profiler-agent latency`, one metric family per probe
//! (`profiler_probe_<name>_latency_seconds`, `profiler_probe_<name>_hits_total`).
//!
//! With `stacks = true`, each window also gets the probe's operations by
//! the user stack they began at (`latency --stacks`' profile), which the
//! agent sends to the exporters as `probe_<name>`.
//!
//! A probe that cannot be attached (binary missing on this node, a typo)
//! is logged with the reason and left out; the rest of the agent runs.

use std::fmt::Write;
use std::time::{Duration, Instant};

use serde::Deserialize;

use profiler_latency::breaker::{Breaker, DEFAULT_BUDGET};
use profiler_latency::histogram::Layout;
use profiler_latency::plan::{parse_linear, parse_unit};
use profiler_latency::render::prometheus_report;
use profiler_latency::{KeyBy, LatencyOptions, Measure, Plan, Session, plan};
use profiler_probes::spec::ProbeSpec;
use profiler_profile::Profile;
use profiler_sampling::record::{ProfileWindow, Stacks};

/// One `[[probes]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeConfig {
    /// Names the metric family: `profiler_probe_<name>_...`.
    pub name: String,
    /// usdt:PATH:PROVIDER:NAME, uprobe:PATH:SYMBOL or uretprobe:PATH:SYMBOL.
    /// Alone, a uprobe is timed from entry to return.
    pub start: String,
    /// The probe that ends the operation; empty for a function or a count.
    #[serde(default)]
    pub end: String,
    /// Count hits of `start` instead of timing.
    #[serde(default)]
    pub count: bool,
    /// Only this process (0: every process running the binary).
    #[serde(default)]
    pub pid: u32,
    /// ns, us or ms: the histogram's bucket unit (exported in seconds).
    #[serde(default = "default_unit")]
    pub unit: String,
    /// Key by argN, str:argN, pid or comm (a label on each series).
    #[serde(default)]
    pub by: String,
    /// Linear buckets MIN,MAX,STEP (in `unit`) instead of log2.
    #[serde(default)]
    pub linear: String,
    /// Circuit breaker: hits per second on one CPU above which the probe
    /// is detached (see `probes::breaker`); absent: the default, 0: no
    /// limit.
    #[serde(default)]
    pub budget: Option<u64>,
    /// After the breaker detached the probe, attach it again this long
    /// later (a duration like "5m"); empty: stay detached.
    #[serde(default)]
    pub reattach_after: String,
    /// Walk the user stack at each start: every window, a profile of the
    /// operations by the stack they began at (`count` and
    /// `latency/nanoseconds`) goes to the exporters as `probe_<name>`.
    #[serde(default)]
    pub stacks: bool,
    /// With `stacks`: only operations at least this long (like "10ms");
    /// empty: all.
    #[serde(default)]
    pub min_latency: String,
}

fn default_unit() -> String {
    "us".into()
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeConfigError {
    #[error("probes: name {0:?} must be letters, digits and _ (it names a metric)")]
    Name(String),
    #[error("probes: two probes are named {0:?}")]
    Duplicate(String),
    #[error("probe {name}: {message}")]
    Invalid { name: String, message: String },
}

impl ProbeConfig {
    /// The back-off before re-attaching, if any.
    pub fn reattach_after(&self) -> Result<Option<Duration>, ProbeConfigError> {
        if self.reattach_after.trim().is_empty() {
            return Ok(None);
        }
        humantime::parse_duration(self.reattach_after.trim())
            .map(Some)
            .map_err(|e| ProbeConfigError::Invalid {
                name: self.name.clone(),
                message: format!(
                    "reattach_after {:?} is not a duration like 5m: {e}",
                    self.reattach_after
                ),
            })
    }

    /// The latency options, every field checked (no attaching yet).
    pub fn options(&self) -> Result<LatencyOptions, ProbeConfigError> {
        let invalid = |message: String| ProbeConfigError::Invalid {
            name: self.name.clone(),
            message,
        };
        let spec = |text: &str| ProbeSpec::parse(text).map_err(|e| invalid(e.to_string()));
        let start = spec(&self.start)?;
        let measure = match (self.count, self.end.is_empty()) {
            (true, true) => Measure::Count(start),
            (true, false) => return Err(invalid("count takes only `start`".into())),
            (false, true) => Measure::function(start).map_err(|e| invalid(e.to_string()))?,
            (false, false) => Measure::Between {
                start,
                end: spec(&self.end)?,
            },
        };
        Ok(LatencyOptions {
            measure,
            pid: (self.pid != 0).then_some(self.pid),
            unit: parse_unit(&self.unit).map_err(invalid)?,
            layout: if self.linear.is_empty() {
                Layout::Log2
            } else {
                parse_linear(&self.linear).map_err(invalid)?
            },
            key: if self.by.is_empty() {
                KeyBy::None
            } else {
                KeyBy::parse(&self.by).map_err(invalid)?
            },
            stacks: self.stacks_min_latency()?,
            trace: Default::default(),
        })
    }

    /// `stacks` and `min_latency` as the latency options take them.
    fn stacks_min_latency(&self) -> Result<Option<u64>, ProbeConfigError> {
        let invalid = |message: String| ProbeConfigError::Invalid {
            name: self.name.clone(),
            message,
        };
        let min = self.min_latency.trim();
        if !self.stacks {
            return if min.is_empty() {
                Ok(None)
            } else {
                Err(invalid("min_latency needs stacks = true".into()))
            };
        }
        if min.is_empty() {
            return Ok(Some(0));
        }
        humantime::parse_duration(min)
            .map(|d| Some(d.as_nanos().min(u64::MAX as u128) as u64))
            .map_err(|e| {
                invalid(format!(
                    "min_latency {min:?} is not a duration like 10ms: {e}"
                ))
            })
    }
}

/// Checks names and every probe's options (the config's validation).
pub fn validate(probes: &[ProbeConfig]) -> Result<(), ProbeConfigError> {
    let mut seen = std::collections::HashSet::new();
    for probe in probes {
        let valid = !probe.name.is_empty()
            && probe
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(ProbeConfigError::Name(probe.name.clone()));
        }
        if !seen.insert(probe.name.as_str()) {
            return Err(ProbeConfigError::Duplicate(probe.name.clone()));
        }
        probe.options()?;
        probe.reattach_after()?;
    }
    Ok(())
}

/// How often a probe with `stacks` looks in `/proc` for new processes
/// running its binary (to load their unwind tables): each look reads
/// every process's maps, too much to do every second on a busy node. A
/// process started in between has its first hits walked by frame pointers
/// only.
const STACKS_SCAN_INTERVAL: Duration = Duration::from_secs(10);

/// One configured probe that was attached, and its circuit breaker.
struct Attached {
    name: String,
    plan: Plan,
    session: Session,
    breaker: Breaker,
    reattach_after: Option<Duration>,
    /// When the breaker detached it (None while attached).
    detached_at: Option<Instant>,
    trips: u64,
}

/// The attached probes of a run.
#[derive(Default)]
pub struct ProbeHistograms {
    attached: Vec<Attached>,
    /// Probes that could not be attached.
    pub failed: usize,
}

impl ProbeHistograms {
    /// Plans and attaches every probe; one that fails is logged and left
    /// out.
    pub fn start(probes: &[ProbeConfig]) -> ProbeHistograms {
        let mut histograms = ProbeHistograms::default();
        for probe in probes {
            let started = probe
                .options()
                .map_err(|e| e.to_string())
                .and_then(|options| plan(&options).map_err(|e| e.to_string()))
                .and_then(|plan| {
                    Session::start(&plan)
                        .map(|session| (plan, session))
                        .map_err(|e| e.to_string())
                });
            match started {
                Ok((plan, mut session)) => {
                    if let Some(stacks) = session.stacks_mut() {
                        stacks.set_scan_interval(STACKS_SCAN_INTERVAL);
                    }
                    tracing::info!(probe = %probe.name, uprobes = session.attached(), "probe attached");
                    histograms.attached.push(Attached {
                        name: probe.name.clone(),
                        plan,
                        session,
                        breaker: Breaker::new(probe.budget.unwrap_or(DEFAULT_BUDGET)),
                        reattach_after: probe.reattach_after().ok().flatten(),
                        detached_at: None,
                        trips: 0,
                    });
                }
                Err(error) => {
                    tracing::warn!(probe = %probe.name, "probe not attached: {error}");
                    histograms.failed += 1;
                }
            }
        }
        histograms
    }

    pub fn attached(&self) -> usize {
        self.attached.len()
    }

    /// The circuit breaker: detaches a probe whose hit rate on a CPU is
    /// over its budget, and re-attaches it after its back-off (if it has
    /// one).
    pub fn check(&mut self, now: Instant) {
        for probe in &mut self.attached {
            // New processes running the probed binaries get their tables.
            if let Some(stacks) = probe.session.stacks_mut() {
                stacks.refresh();
            }
            match probe.detached_at {
                None => {
                    if let Some(trip) = probe.breaker.check(
                        now,
                        &probe.session.hits_per_cpu(),
                        probe.session.cost_per_hit_ns(),
                    ) {
                        probe.session.detach();
                        probe.detached_at = Some(now);
                        probe.trips += 1;
                        let again = probe.reattach_after.map_or_else(
                            || "it stays detached (set reattach_after to try again)".to_string(),
                            |after| {
                                format!(
                                    "attaching it again in {}",
                                    humantime::format_duration(after)
                                )
                            },
                        );
                        tracing::warn!(probe = %probe.name, "probe detached by the circuit breaker: {trip}; {again}");
                    }
                }
                Some(at) => {
                    let Some(after) = probe.reattach_after else {
                        continue;
                    };
                    if now.saturating_duration_since(at) < after {
                        continue;
                    }
                    match probe.session.reattach() {
                        Ok(()) => {
                            probe.detached_at = None;
                            probe.breaker.reset();
                            tracing::info!(probe = %probe.name, "probe attached again after the circuit breaker's back-off");
                        }
                        Err(error) => {
                            // Try again after another back-off.
                            probe.detached_at = Some(now);
                            tracing::warn!(probe = %probe.name, "re-attaching failed: {error}");
                        }
                    }
                }
            }
        }
    }

    /// Every probe's family in Prometheus text, totals since attaching,
    /// and its circuit breaker's state.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for probe in &self.attached {
            let prefix = format!("profiler_probe_{}", probe.name);
            match prometheus_report(&probe.plan, &probe.session.snapshot(), &prefix) {
                Ok(text) => out.push_str(&text),
                Err(error) => tracing::debug!(probe = %probe.name, "rendering: {error}"),
            }
            let _ = writeln!(
                out,
                "# HELP {prefix}_attached 1 while the probe is attached, 0 after the circuit \
                 breaker detached it.\n\
                 # TYPE {prefix}_attached gauge\n\
                 {prefix}_attached {}\n\
                 # HELP {prefix}_circuit_breaker_trips_total Times the probe was detached for \
                 firing more than {} times a second on one CPU.\n\
                 # TYPE {prefix}_circuit_breaker_trips_total counter\n\
                 {prefix}_circuit_breaker_trips_total {}",
                u8::from(probe.detached_at.is_none()),
                probe.breaker.budget(),
                probe.trips
            );
            if let Some(stacks) = probe.session.stacks() {
                let _ = writeln!(
                    out,
                    "# HELP {prefix}_stacks Distinct start stacks kept in the kernel's map \
                     (those without an operation for 3 windows are deleted).\n\
                     # TYPE {prefix}_stacks gauge\n\
                     {prefix}_stacks {}",
                    stacks.stored()
                );
            }
        }
        out
    }

    /// The window's operations by start stack, per probe with `stacks`:
    /// (probe index, probe name, stacks).
    pub fn take_stack_windows(&mut self) -> Vec<(usize, String, Stacks)> {
        self.attached
            .iter_mut()
            .enumerate()
            .filter_map(|(index, probe)| {
                let stacks = probe.session.stacks_mut()?.take_window();
                Some((index, probe.name.clone(), stacks))
            })
            .collect()
    }

    /// A profile of some of a probe's window stacks (`take_stack_windows`).
    pub fn build_stack_profile(
        &mut self,
        index: usize,
        stacks: &Stacks,
        window: &ProfileWindow,
    ) -> Option<Profile> {
        let probe = self.attached.get_mut(index)?;
        Some(probe.session.stacks_mut()?.build(stacks, window))
    }

    /// After a window's profiles are built: forgets exited processes.
    pub fn end_stack_window(&mut self) {
        for probe in &mut self.attached {
            if let Some(stacks) = probe.session.stacks_mut() {
                stacks.forget_exited();
            }
        }
    }

    /// Detaches every probe (lowering USDT semaphores).
    pub fn detach(&mut self) {
        for probe in &mut self.attached {
            probe.session.detach();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(name: &str, start: &str) -> ProbeConfig {
        ProbeConfig {
            name: name.into(),
            start: start.into(),
            end: String::new(),
            count: false,
            pid: 0,
            unit: default_unit(),
            by: String::new(),
            linear: String::new(),
            budget: None,
            reattach_after: String::new(),
            stacks: false,
            min_latency: String::new(),
        }
    }

    #[test]
    fn validation_names_the_probe_and_the_problem() {
        let ok = probe("gc", "uprobe:/usr/bin/python3.11:PyObject_GC_Collect");
        validate(std::slice::from_ref(&ok)).unwrap();
        let error = validate(&[probe("bad-name", &ok.start)]).unwrap_err();
        assert!(error.to_string().contains("bad-name"), "{error}");
        let error = validate(&[ok.clone(), ok.clone()]).unwrap_err();
        assert!(error.to_string().contains("two probes"), "{error}");
        let usdt_alone = probe("x", "usdt:/bin/app:demo:op__start");
        let error = validate(&[usdt_alone]).unwrap_err();
        assert!(error.to_string().starts_with("probe x:"), "{error}");
        let mut bad_unit = ok.clone();
        bad_unit.unit = "hours".into();
        assert!(
            validate(&[bad_unit])
                .unwrap_err()
                .to_string()
                .contains("hours")
        );
        let mut count = probe("hits", "usdt:/bin/app:demo:op__start");
        count.count = true;
        count.by = "arg0".into();
        validate(&[count]).unwrap();
        let mut stacks = ok.clone();
        stacks.min_latency = "10ms".into();
        let error = validate(std::slice::from_ref(&stacks)).unwrap_err();
        assert!(error.to_string().contains("needs stacks = true"), "{error}");
        stacks.stacks = true;
        assert_eq!(stacks.options().unwrap().stacks, Some(10_000_000));
        stacks.min_latency = "soon".into();
        let error = validate(&[stacks]).unwrap_err();
        assert!(error.to_string().contains("\"soon\""), "{error}");
    }

    #[test]
    fn a_probe_on_a_missing_binary_is_left_out() {
        let histograms = ProbeHistograms::start(&[probe("missing", "uprobe:/no/such/binary:main")]);
        assert_eq!((histograms.attached(), histograms.failed), (0, 1));
        assert_eq!(histograms.render(), "");
    }
}

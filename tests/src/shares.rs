//! How far a share counted from samples may stray by chance alone.
//!
//! A sampled share is a binomial estimate: out of `n` samples of work that
//! is a fraction `p` of the time, the share seen has a standard error of
//! `sqrt(p (1 - p) / n)`. A fixed band ("67% ± 10 points") is 4 standard
//! errors at 300 samples but under 3 at 200, and a test run a few hundred
//! times in CI fails now and then on chance alone (hot_a 112 of 198, 56.6%,
//! did). The checks here allow `CHANCE_SIGMAS` standard errors, computed from
//! the counts of the run, plus whatever slack the caller names for
//! systematic differences (a script's 7:3 is not exactly 7:3 of the time).
//! The band must still tell the claim from its alternative: the caller gives
//! the widest band it accepts, and too few samples for it fail the test
//! with that reason.

/// Standard errors allowed: chance exceeds it about once in 150,000 checks.
pub const CHANCE_SIGMAS: f64 = 4.5;

/// `hits` out of `total` samples.
#[derive(Clone, Copy, Debug)]
pub struct Share {
    pub hits: i64,
    pub total: i64,
}

impl Share {
    pub fn of(hits: i64, total: i64) -> Share {
        Share { hits, total }
    }

    pub fn value(self) -> f64 {
        self.hits as f64 / self.total.max(1) as f64
    }

    /// The variance of this share's estimate if the true share is `p`.
    fn variance(self, p: f64) -> f64 {
        p * (1.0 - p) / self.total.max(1) as f64
    }
}

/// Checks that `share` is `expected` within chance and `slack`; the band
/// (chance plus slack) may be at most `widest`.
pub fn share_near(
    what: &str,
    share: Share,
    expected: f64,
    slack: f64,
    widest: f64,
) -> Result<(), String> {
    let chance = CHANCE_SIGMAS * share.variance(expected).sqrt();
    judge(
        what,
        share.value() - expected,
        chance + slack,
        widest,
        || {
            format!(
                "{} of {} samples, {:.1}%, expected {:.1}%",
                share.hits,
                share.total,
                share.value() * 100.0,
                expected * 100.0
            )
        },
    )
}

/// Checks that two shares of the same thing, each counted by its own
/// sampler, agree within chance and `slack`; the band may be at most
/// `widest`. Their common share is estimated from both.
pub fn shares_agree(
    what: &str,
    ours: Share,
    theirs: Share,
    slack: f64,
    widest: f64,
) -> Result<(), String> {
    let pooled = (ours.hits + theirs.hits) as f64 / (ours.total + theirs.total).max(1) as f64;
    let chance = CHANCE_SIGMAS * (ours.variance(pooled) + theirs.variance(pooled)).sqrt();
    judge(
        what,
        ours.value() - theirs.value(),
        chance + slack,
        widest,
        || {
            format!(
                "{} of {} samples ({:.1}%) against {} of {} ({:.1}%)",
                ours.hits,
                ours.total,
                ours.value() * 100.0,
                theirs.hits,
                theirs.total,
                theirs.value() * 100.0
            )
        },
    )
}

fn judge(
    what: &str,
    off: f64,
    band: f64,
    widest: f64,
    counts: impl Fn() -> String,
) -> Result<(), String> {
    if band > widest {
        return Err(format!(
            "{what}: too few samples to tell: {} gives a band of ±{:.1} points, wider than \
             the ±{:.1} this check accepts",
            counts(),
            band * 100.0,
            widest * 100.0
        ));
    }
    if off.abs() > band {
        return Err(format!(
            "{what}: {} is {:.1} points off, outside ±{:.1} ({CHANCE_SIGMAS} standard errors \
             and the check's slack)",
            counts(),
            off * 100.0,
            band * 100.0
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_band_follows_the_counts() {
        // The CI failure: 112 of 198 against 2/3 is 2.9 standard errors.
        assert!(share_near("hot_a", Share::of(112, 198), 2.0 / 3.0, 0.0, 0.16).is_ok());
        // Half and half is not 2:1 at 400 samples.
        assert!(share_near("hot_a", Share::of(200, 400), 2.0 / 3.0, 0.0, 0.11).is_err());
        // Too few samples for the band asked.
        let few = share_near("hot_a", Share::of(20, 30), 2.0 / 3.0, 0.0, 0.1).unwrap_err();
        assert!(few.contains("too few samples"), "{few}");
    }

    #[test]
    fn two_samplers_agree_within_chance() {
        // 2.35 standard errors apart at ~900 samples each: chance.
        assert!(shares_agree("leaf_a", Share::of(675, 970), Share::of(589, 889), 0.0, 0.1).is_ok());
        // 15 points apart is not.
        assert!(
            shares_agree("leaf_a", Share::of(679, 970), Share::of(489, 889), 0.0, 0.1).is_err()
        );
    }
}

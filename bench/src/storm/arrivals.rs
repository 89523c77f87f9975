//! The intent stream: a Poisson process of rate λ, each intent assigned to a
//! worker and, for a fraction of them, a cancellation time. Generated once
//! from the seed so every strategy is offered exactly the same work.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::StormConfig;

/// One intent as it will arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Arrival {
    /// Its stable identity, in arrival order.
    pub(super) id: u64,
    /// Which worker receives it.
    pub(super) worker: usize,
    /// When, since the start of the run.
    pub(super) at: Duration,
    /// When its caller withdraws it, after arrival; `None` for most.
    pub(super) cancel_after: Option<Duration>,
}

/// Every arrival in `[0, duration)`, in time order.
pub(super) fn generate(config: &StormConfig) -> Vec<Arrival> {
    let mut rng = StdRng::seed_from_u64(config.seed);
    let mut arrivals = Vec::new();
    let mut t = 0.0_f64;
    let end = config.duration.as_secs_f64();
    let deadline = config.deadline.as_secs_f64();
    for id in 0.. {
        // Exponential gaps; `1 - u` is in (0, 1], so the log is finite.
        let u: f64 = rng.random();
        t += -(1.0 - u).ln() / config.arrival_rate;
        // The draws below are made for every arrival, used or not, so one
        // parameter (the cancel fraction) does not reshuffle the others.
        let worker = rng.random_range(0..config.workers);
        let coin: f64 = rng.random();
        let when: f64 = rng.random();
        if t >= end {
            break;
        }
        arrivals.push(Arrival {
            id,
            worker,
            at: Duration::from_secs_f64(t),
            cancel_after: (coin < config.cancel_fraction)
                .then(|| Duration::from_secs_f64(when * deadline)),
        });
    }
    arrivals
}

/// The arrivals split by worker, each list still in time order.
pub(super) fn per_worker(arrivals: &[Arrival], workers: usize) -> Vec<Vec<Arrival>> {
    let mut split = vec![Vec::new(); workers];
    for arrival in arrivals {
        split[arrival.worker].push(*arrival);
    }
    split
}

//! The order in which a bench runs its modes within a round (`BENCH_ORDER`).
//!
//! A rotation (round `r` starts at mode `r mod n`) keeps the cyclic order, so each mode follows
//! the same mode in all but one round in `n`. What a mode leaves for the server to finish (a
//! purge, dirty pages of a shared table, a broker's queue still draining) then always lands on
//! the same next mode: on MariaDB, the hand-written batch always followed idem's versioned
//! batch, and idem's batch of 100 measured 1.07-1.12x the hand-written one with that mode in the
//! run against 1.00-1.05x without it (measured with this bench; in BENCHMARKS.md's history). A
//! new shuffle each round lets every mode follow every other alike.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// How the modes of a round are ordered.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Order {
    /// A permutation per round, from a fixed seed (the same sequence in every run).
    Shuffle,
    /// The rotation the runs before 2026-12-04 used.
    Rotate,
}

impl Order {
    /// The order `BENCH_ORDER` asks for: `shuffle` (the default) or `rotate`.
    pub fn from_env() -> Self {
        match std::env::var("BENCH_ORDER").as_deref() {
            Ok("rotate") => Order::Rotate,
            Ok("shuffle") | Err(_) => Order::Shuffle,
            Ok(other) => panic!("BENCH_ORDER={other}: shuffle or rotate"),
        }
    }

    /// How a bench's header names it: "a shuffled" or "a rotating" (order).
    pub fn describe(self) -> &'static str {
        match self {
            Order::Shuffle => "a shuffled",
            Order::Rotate => "a rotating",
        }
    }
}

/// The order of each round's modes, round after round.
pub struct Rounds {
    order: Order,
    rng: StdRng,
}

impl Rounds {
    /// The order `BENCH_ORDER` asks for, shuffled from the seed every bench uses.
    pub fn from_env() -> Self {
        Rounds::new(Order::from_env())
    }

    /// `order`, from a fixed seed.
    pub fn new(order: Order) -> Self {
        Rounds {
            order,
            rng: StdRng::seed_from_u64(15),
        }
    }

    /// The order these rounds follow.
    pub fn order(&self) -> Order {
        self.order
    }

    /// The indices `0..n` in the order round `round` runs them.
    pub fn next(&mut self, round: usize, n: usize) -> Vec<usize> {
        let mut modes: Vec<usize> = (0..n).collect();
        match self.order {
            Order::Shuffle => modes.shuffle(&mut self.rng),
            Order::Rotate => modes.rotate_left(round % n.max(1)),
        }
        modes
    }
}

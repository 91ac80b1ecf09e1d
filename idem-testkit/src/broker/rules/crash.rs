//! SIGKILL and restart lose nothing: consumer processes killed at random points, and some
//! between a commit and its settle, then restarted, until the stream is done.

use std::time::{Duration, Instant};

use rand::Rng;

use crate::broker::child::{self, Life, Spawn, BATCH, CONSUMER, KILL_AT_ACK, RELEASE, STOP};
use crate::broker::harness::{self, assert_unsettled, Reopen};
use crate::broker::model;
use crate::broker::{Broker, Spec};

/// How many kills, over how long a stream.
struct Size {
    unique: usize,
    /// Random SIGKILLs, the two processes in turn.
    random: usize,
    /// Lives that kill themselves between a commit and its ack.
    at_commit: usize,
    limit: Duration,
}

fn size() -> Size {
    if harness::soak() {
        Size {
            unique: 14_000,
            random: 30,
            at_commit: 6,
            limit: Duration::from_secs(900),
        }
    } else {
        Size {
            unique: 600,
            random: 4,
            at_commit: 2,
            limit: Duration::from_secs(180),
        }
    }
}

/// The release and stop files of the lives, deleted when dropped (also when the rule fails).
struct Files {
    release: std::path::PathBuf,
    stop: std::path::PathBuf,
}

impl Files {
    fn new() -> Files {
        let base = std::env::temp_dir().join(harness::unique_name("idem_kit_crash"));
        Files {
            release: base.with_extension("release"),
            stop: base.with_extension("stop"),
        }
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.release);
        let _ = std::fs::remove_file(&self.stop);
    }
}

/// The kills made.
#[derive(Debug, Default)]
struct Kills {
    random: [usize; 2],
    at_commit: usize,
    lives: usize,
}

/// Two consumer processes (batches of 20, 2 at a time) share the input and the database; they
/// pace themselves until the kills are made. The rule SIGKILLs them at random moments, the two
/// in turn (4 times; 30 with `IDEM_SOAK=1`), and some lives SIGKILL themselves at an ack, after
/// the commit; each is restarted under a new consumer name (what a dead one held comes back
/// to the others). Then the lives stop gracefully, and fresh ones (after
/// [`Broker::REJOIN`]) drain the rest at full speed. The database equals the exactly-once
/// oracle, nothing was applied twice, nothing is left unsettled and nothing was dead-lettered.
/// 600 distinct events (14,000 with `IDEM_SOAK=1`).
pub async fn sigkills_and_restarts_lose_nothing<B: Broker, D: Reopen>() {
    harness::with::<B, D>(Spec::new("crash"), async |b, k| {
        let size = size();
        let started = Instant::now();
        let deadline = started + size.limit;
        model::schema(k).await;
        let seed = harness::seed();
        let mut rng = harness::rng(seed);
        let events = model::generate(seed, size.unique);
        let oracle = model::oracle(&events);
        b.publish(&model::raws(&events)).await;

        let files = Files::new();
        let (release, stop) = (files.release.clone(), files.stop.clone());
        let base = Spawn::new::<B, D>("consumer", b, &k.pool)
            .await
            .env(BATCH, 20)
            .env(RELEASE, release.display())
            .env(STOP, stop.display());
        let mut kills = Kills::default();
        let mut commit_kills_left = size.at_commit;
        // A new life, and whether it is to kill itself at an ack (random kills spare it, or on
        // a slow machine they could take it before its commit comes).
        let mut life = |kills: &mut Kills, rng: &mut rand::rngs::StdRng, may_kill: bool| {
            kills.lives += 1;
            let at_commit =
                may_kill && commit_kills_left > 0 && (kills.lives == 1 || rng.random_bool(0.3));
            let mut spawn = base.clone().env(CONSUMER, format!("life-{}", kills.lives));
            if at_commit {
                commit_kills_left -= 1;
                spawn = spawn.env(KILL_AT_ACK, rng.random_range(1..=30));
            }
            (spawn.spawn(), at_commit)
        };
        let mut lives: [Option<(Life, bool)>; 2] = [
            Some(life(&mut kills, &mut rng, true)),
            Some(life(&mut kills, &mut rng, true)),
        ];

        // The kills, while the lives pace themselves.
        let mut turn = 0;
        while kills.random.iter().sum::<usize>() < size.random {
            assert!(
                Instant::now() < deadline,
                "kills not made in time: {kills:?}"
            );
            tokio::time::sleep(harness::jitter(&mut rng, 300..900)).await;
            for slot in &mut lives {
                let Some((child, _)) = slot.as_mut() else {
                    continue;
                };
                if let Some(status) = child.try_wait() {
                    // Only a planned kill at an ack ends a life now.
                    assert!(
                        !status.success(),
                        "the stream was drained before the planned kills ({kills:?})"
                    );
                    child.assert_killed(status);
                    kills.at_commit += 1;
                    *slot = Some(life(&mut kills, &mut rng, true));
                }
            }
            let victim = turn % 2;
            if let Some((child, false)) = lives[victim].as_mut() {
                child.kill();
                kills.random[victim] += 1;
                turn += 1;
                lives[victim] = Some(life(&mut kills, &mut rng, true));
            }
        }

        let applied_at_kills = model::applied(k).await;
        assert!(
            b.unsettled().await > 0,
            "the stream was drained before the kills were done ({kills:?})"
        );

        // The lives stop gracefully (one may still kill itself at an ack).
        std::fs::write(&stop, b"").expect("the stop file");
        for slot in &mut lives {
            if let Some((mut child, _)) = slot.take() {
                let status = child.wait(Duration::from_secs(60)).await;
                if child::signal(status) == Some(libc::SIGKILL) {
                    kills.at_commit += 1;
                } else {
                    child.assert_success(status);
                }
            }
        }
        let killed_at = started.elapsed();
        tokio::time::sleep(B::REJOIN).await;
        let _ = std::fs::remove_file(&stop);
        std::fs::write(&release, b"").expect("the release file");

        // Fresh lives drain the rest at full speed; they stop once nothing is unsettled. A
        // broker may hand back what a life held as it stopped: then again.
        let mut rounds = 0;
        loop {
            rounds += 1;
            let mut drain = [
                life(&mut kills, &mut rng, false).0,
                life(&mut kills, &mut rng, false).0,
            ];
            for child in &mut drain {
                let limit = deadline.saturating_duration_since(Instant::now());
                let status = child.wait(limit).await;
                child.assert_success(status);
            }
            b.gone().await;
            if b.unsettled().await == 0 || rounds == 5 {
                break;
            }
        }
        eprintln!(
            "{}: {} messages, {kills:?}, kills done at {killed_at:?} ({applied_at_kills} \
             applied), all in {:?}",
            B::NAME,
            events.len(),
            started.elapsed()
        );
        assert!(
            kills.random.iter().all(|k| *k >= size.random / 2),
            "{kills:?}"
        );
        assert!(
            kills.at_commit >= 1,
            "no life was killed between its commit and its ack: {kills:?}"
        );
        model::verify(k, &oracle).await;
        assert_unsettled(b, 0).await;
        assert_eq!(b.dead_letters().await, vec![], "nothing is poison here");
    })
    .await;
}

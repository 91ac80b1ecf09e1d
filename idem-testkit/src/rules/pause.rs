//! A lease holder paused past its lease (as SIGSTOP would pause it, then SIGCONT): when it
//! resumes, the new holder has the message, and the paused one's commit is refused.
//!
//! The holder is paused in process: its handler's future waits at a barrier the rule opens.
//! That is what SIGSTOP does to it as far as idem can tell: idem renews no lease in the
//! background, so while the body waits nothing is sent in the holder's name, and its lease
//! expires in the database as a stopped process's would. What decides is the database: the
//! completion names the holder's lease token, which the takeover replaced.

use std::sync::Arc;
use std::time::Duration;

use idem::store::Leases;
use idem::{idempotent, Error, Outcome, Tx};
use tokio::sync::Notify;

use crate::backend::{exec, Kit, KitDb};
use crate::{Backend, Dialect};

const SCOPE: &str = "pause::ship";

/// A shipment to make once, by `holder`; `pause` holds the body at a barrier after the lease
/// is taken, before its write.
#[derive(Clone)]
pub struct ShipRequested {
    id: String,
    holder: String,
    pause: Option<(Arc<Notify>, Arc<Notify>)>,
}

/// Writes the shipment, naming its holder; with `pause`, says it is inside the body and waits
/// to be resumed first.
#[idempotent(key = "msg.id", scope = "pause::ship", mode = "lease", lease = "1s")]
pub async fn ship<DB: KitDb + Leases>(
    tx: &mut Tx<'_, DB>,
    msg: &ShipRequested,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    if let Some((inside, resume)) = &msg.pause {
        inside.notify_one();
        resume.notified().await;
    }
    exec::<DB>(
        &mut **tx,
        d,
        "INSERT INTO shipments (message, holder) VALUES ($1, $2)",
        &[(&msg.id).into(), (&msg.holder).into()],
    )
    .await?;
    Ok(())
}

async fn setup<B: Backend>(k: &Kit<B>) {
    k.exec(
        "CREATE TABLE shipments (message TEXT NOT NULL, holder TEXT NOT NULL)",
        &[],
    )
    .await;
}

/// The record's lease token, and whether its lease is still held.
async fn lease<B: Backend>(k: &Kit<B>, key: &str) -> (i64, bool) {
    let at = "FROM idem_records WHERE scope = $1 AND msg_key = $2";
    let binds = [SCOPE.into(), key.as_bytes().into()];
    let token = k.int(&format!("SELECT lease_token {at}"), &binds).await;
    let held = k
        .int(
            &format!("SELECT COUNT(*) {at} AND lease_until IS NOT NULL"),
            &binds,
        )
        .await;
    (token, held == 1)
}

/// A lease holder paused inside its body past its lease (1 s) is taken over: a second holder
/// runs the message and commits. When the first resumes and commits, its commit is refused
/// with `LeaseLost` and rolled back: one shipment, the second holder's, and the record done
/// under the second holder's token.
pub async fn lease_holder_paused_past_its_lease_cannot_commit_over_the_new_holder<
    B: Backend<Db: Leases>,
>() {
    let (k, d) = crate::__open!(B, setup);
    let (inside, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let paused = ShipRequested {
        id: "ship-1".into(),
        holder: "paused".into(),
        pause: Some((inside.clone(), resume.clone())),
    };
    let first = {
        let pool = k.pool.clone();
        tokio::spawn(async move { ship(&pool, &paused, &d).await })
    };
    inside.notified().await;
    let (first_token, held) = lease(&k, "ship-1").await;
    assert!(held, "the paused holder holds the lease");
    tokio::time::sleep(Duration::from_millis(1_200)).await; // past the 1 s lease
    let second = ShipRequested {
        id: "ship-1".into(),
        holder: "second".into(),
        pause: None,
    };
    assert_eq!(
        ship(&k.pool, &second, &d).await.unwrap(),
        Outcome::Applied(()),
        "the expired lease is taken over"
    );
    let (second_token, held) = lease(&k, "ship-1").await;
    assert!(!held, "the second holder completed the record");
    assert_ne!(second_token, first_token, "the takeover replaced the token");
    resume.notify_one();
    let resumed = first.await.unwrap();
    assert!(
        matches!(resumed, Err(Error::LeaseLost)),
        "the resumed holder's commit is refused: {resumed:?}"
    );
    assert_eq!(
        k.text_pairs(
            "SELECT message, holder FROM shipments ORDER BY message",
            &[]
        )
        .await,
        [("ship-1".to_string(), "second".to_string())],
        "one shipment, the new holder's"
    );
    assert_eq!(
        lease(&k, "ship-1").await,
        (second_token, false),
        "the record is the new holder's, done"
    );
    assert_eq!(
        ship(&k.pool, &second, &d).await.unwrap(),
        Outcome::Duplicate
    );
    k.close().await;
}

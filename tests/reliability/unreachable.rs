//! A handler whose database is unreachable when it publishes: its connection is cut by the
//! server (PostgreSQL's `pg_terminate_backend`, MariaDB's `KILL CONNECTION`, from another
//! connection) after the body's write and before its `ctx.publish`. The publish fails, and
//! the delivery with it, with a transient error (the database's, which the handler returns),
//! never a silent success; nothing of it is recorded (no record, no effect, no outbox row); the
//! redelivery applies once, with its outbox row.

use idem::{idempotent, Context, Error, Outcome, Transient as _};

/// A message; with `cut`, the body's connection is cut before it publishes.
#[derive(Clone, Debug)]
struct Placed {
    id: String,
    cut: bool,
}

const SCOPE: &str = "unreachable::placed";

/// What a database says of one message after the failed delivery or the redelivery: records,
/// effect rows, outbox rows.
#[derive(Debug, PartialEq, Eq)]
struct Left {
    records: i64,
    effects: i64,
    outbox: i64,
}

macro_rules! case {
    ($db:ty, $pool:ty, $own_id:literal, $id_ty:ty, $cut:expr) => {
        use super::*;
        use crate::common::Stored;

        #[idempotent(key = "msg.id", scope = "unreachable::placed")]
        async fn placed(
            tx: &mut idem::Tx<'_, $db>,
            msg: &Placed,
            ctx: &Context,
            admin: &$pool,
        ) -> Result<String, sqlx::Error> {
            sqlx::query(Stored::<$db>::sql(
                "INSERT INTO effects (msg_id) VALUES ($1)",
            ))
            .bind(&msg.id)
            .execute(&mut **tx)
            .await?;
            if msg.cut {
                let own: $id_ty = sqlx::query_scalar($own_id).fetch_one(&mut **tx).await?;
                ($cut)(admin, own).await;
            }
            ctx.publish(tx, "payments", &msg.id).await
        }

        async fn left(pool: &$pool, id: &str) -> Left {
            let effects = "SELECT COUNT(*) FROM effects WHERE msg_id = $1";
            let outbox = "SELECT COUNT(*) FROM idem_outbox WHERE destination = 'payments'";
            Left {
                records: Stored(pool).records(SCOPE, id).await,
                effects: sqlx::query_scalar(Stored::<$db>::sql(effects))
                    .bind(id)
                    .fetch_one(pool)
                    .await
                    .unwrap(),
                outbox: sqlx::query_scalar(outbox).fetch_one(pool).await.unwrap(),
            }
        }

        pub async fn run(pool: &$pool) {
            sqlx::query("CREATE TABLE effects (msg_id VARCHAR(100) NOT NULL)")
                .execute(pool)
                .await
                .unwrap();
            let msg = Placed {
                id: "order-1".into(),
                cut: true,
            };
            let failed = placed(pool, &msg, pool).await;
            let err = match failed {
                Err(err) => err,
                Ok(outcome) => panic!("a silent success on a cut connection: {outcome:?}"),
            };
            // `ctx.publish` failed with the database's error, which the handler returned.
            assert!(
                matches!(&err, Error::Handler(_)),
                "the publish's error reaches the caller: {err:?}"
            );
            assert!(err.is_transient(), "a cut connection is transient: {err:?}");
            let nothing = Left {
                records: 0,
                effects: 0,
                outbox: 0,
            };
            assert_eq!(left(pool, &msg.id).await, nothing, "nothing recorded");
            let back = Placed { cut: false, ..msg };
            assert!(
                matches!(placed(pool, &back, pool).await, Ok(Outcome::Applied(_))),
                "the redelivery applies"
            );
            assert_eq!(placed(pool, &back, pool).await.unwrap(), Outcome::Duplicate);
            let once = Left {
                records: 1,
                effects: 1,
                outbox: 1,
            };
            assert_eq!(
                left(pool, &back.id).await,
                once,
                "applied once, with its row"
            );
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    use sqlx::PgPool;

    case!(
        sqlx::Postgres,
        PgPool,
        "SELECT pg_backend_pid()",
        i32,
        crate::support::cut::terminate_backend
    );

    #[tokio::test]
    #[cfg_attr(
        idem_no_postgres,
        ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
    )]
    async fn a_handler_whose_postgres_connection_is_cut_when_it_publishes_gets_an_error() {
        crate::common::with_postgres(async |pool| run(pool).await).await;
    }
}

#[cfg(feature = "mysql")]
mod mariadb {
    use sqlx::MySqlPool;

    case!(
        sqlx::MySql,
        MySqlPool,
        "SELECT CONNECTION_ID()",
        u64,
        crate::support::cut::kill_connection
    );

    #[tokio::test]
    #[cfg_attr(
        idem_no_mysql,
        ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
    )]
    async fn a_handler_whose_mariadb_connection_is_cut_when_it_publishes_gets_an_error() {
        crate::common::with_mysql(async |pool| run(pool).await).await;
    }
}

//! [`Source::probe`]: a `PING` on the source's connection, for the consumer's readiness.

use std::time::Duration;

use idem_runtime::consume::Probe;

use crate::source::Source;

/// How long the probe's `PING` waits for its `PONG`.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

impl Source {
    /// The broker's side of the consumer's readiness
    /// (`Consumer::new(pool).health_of(&source)`): a `PING` on the connection the source
    /// settles through (not the one blocked in `XREADGROUP`), answered within 2 s (and within
    /// the consumer's check interval).
    pub fn probe(&self) -> Probe {
        let conn = self.group.conn.clone();
        Probe::new(move || {
            let mut conn = conn.clone();
            async move {
                let cmd = redis::cmd("PING");
                let ping = cmd.query_async::<String>(&mut conn);
                match tokio::time::timeout(PING_TIMEOUT, ping).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(err)) => Err(format!("PING failed: {err}")),
                    Err(_) => Err(format!("no answer to PING within {PING_TIMEOUT:?}")),
                }
            }
        })
    }
}

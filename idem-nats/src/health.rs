//! [`Source::probe`]: the state of the source's connection, for the consumer's readiness.

use async_nats::connection::State;
use idem_runtime::consume::Probe;

use crate::source::Source;

impl Source {
    /// The broker's side of the consumer's readiness
    /// (`Consumer::new(pool).health_of(&source)`): connected while async-nats' client is
    /// connected to a server, and not while it is reconnecting (so after an outage, ready
    /// again as soon as the client's reconnect policy brings it back; see
    /// [`SourceBuilder::options`](crate::SourceBuilder::options)). Reads the client's state: no
    /// request to the server.
    pub fn probe(&self) -> Probe {
        let client = self.client().clone();
        Probe::new(move || {
            let state = client.connection_state();
            async move {
                match state {
                    State::Connected => Ok(()),
                    other => Err(format!("the NATS connection is {other}")),
                }
            }
        })
    }
}

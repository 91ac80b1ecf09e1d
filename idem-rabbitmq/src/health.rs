//! [`Source::probe`]: the status of the source's connection, for the consumer's readiness.

use idem_runtime::consume::Probe;

use crate::source::Source;

impl Source {
    /// The broker's side of the consumer's readiness
    /// (`Consumer::new(pool).health_of(&source)`): connected while lapin's connection is in
    /// the `Connected` state. Reads the connection's status: no request to the broker. A
    /// connection or channel the broker closed also ends the deliveries (and so the run);
    /// the caller connects a new source.
    pub fn probe(&self) -> Probe {
        let status = self.connection().status().clone();
        Probe::new(move || {
            let state = if status.connected() {
                None
            } else if status.connecting() {
                Some("connecting")
            } else if status.reconnecting() {
                Some("reconnecting")
            } else if status.closing() {
                Some("closing")
            } else if status.closed() {
                Some("closed")
            } else if status.errored() {
                Some("failed")
            } else {
                Some("not connected")
            };
            async move {
                match state {
                    None => Ok(()),
                    Some(state) => Err(format!("the AMQP connection is {state}")),
                }
            }
        })
    }
}

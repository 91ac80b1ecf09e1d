//! [`Source::probe`]: a metadata request for the source's topic, for the consumer's readiness.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::consume::Probe;
use rdkafka::consumer::Consumer as _;

use crate::source::Source;

/// How long the probe's metadata request waits for a broker.
const METADATA_TIMEOUT: Duration = Duration::from_secs(2);

impl Source {
    /// The broker's side of the consumer's readiness
    /// (`Consumer::new(pool).health_of(&source)`): a metadata request for the topic, answered
    /// by a broker within 2 s (and within the consumer's check interval), naming the topic
    /// with its partitions. librdkafka blocks for it, so it runs on tokio's blocking threads.
    /// The probe does not keep the source's consumer alive: once the source is closed, it says
    /// so.
    pub fn probe(&self) -> Probe {
        let consumer = Arc::downgrade(&self.consumer);
        let topic = self.link.topic.clone();
        Probe::new(move || {
            let consumer = consumer.clone();
            let topic = topic.clone();
            async move {
                let asked = tokio::task::spawn_blocking(move || {
                    let Some(consumer) = consumer.upgrade() else {
                        return Err("the source is closed".to_string());
                    };
                    let metadata = consumer
                        .fetch_metadata(Some(&topic), METADATA_TIMEOUT)
                        .map_err(|err| format!("fetching the metadata of {topic}: {err}"))?;
                    let Some(found) = metadata.topics().iter().find(|t| t.name() == &*topic) else {
                        return Err(format!("the brokers do not know the topic {topic}"));
                    };
                    if let Some(err) = found.error() {
                        return Err(format!("the topic {topic}: {err:?}"));
                    }
                    if found.partitions().is_empty() {
                        return Err(format!("the brokers know no partitions of {topic}"));
                    }
                    Ok(())
                })
                .await;
                asked.unwrap_or_else(|err| Err(format!("the metadata request failed: {err}")))
            }
        })
    }
}

//! A publisher for the mqtt source's tests and benchmark: MQTT 5 (rumqttc, the client colibri
//! itself uses), a window of QoS 1 publishes awaited to their PUBACK, and a count of what the
//! broker accepted (acknowledged, in order). Runs on its own runtime in the calling thread.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, MqttOptions, PublishOptions, QoS};

/// What to publish.
pub struct Publish {
    pub port: u16,
    pub client_id: String,
    pub topic: String,
    pub qos: QoS,
    /// Messages `first..first + count`, each made by `payload`.
    pub first: u64,
    pub count: u64,
    /// Publishes awaited at once (QoS 1).
    pub window: usize,
    /// At most this many messages a second (`None`: as fast as the broker acknowledges).
    pub rate: Option<u64>,
    /// User name and password.
    pub credentials: Option<(&'static str, &'static str)>,
}

impl Publish {
    /// `count` messages from 0 to `topic` at QoS 1, 100 awaited at once, as fast as acknowledged.
    pub fn new(port: u16, topic: &str, count: u64) -> Publish {
        Publish {
            port,
            client_id: format!("test-pub-{}", topic.replace('/', "-")),
            topic: topic.into(),
            qos: QoS::AtLeastOnce,
            first: 0,
            count,
            window: 100,
            rate: None,
            credentials: None,
        }
    }
}

/// Publishes every message; `accepted` counts those the broker acknowledged (QoS 0: those
/// written). Returns when all are accepted, or an error after `limit`.
pub fn publish(
    p: &Publish,
    payload: impl Fn(u64) -> Vec<u8>,
    accepted: &Arc<AtomicU64>,
    limit: Duration,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut opts = MqttOptions::new(
            p.client_id.clone(),
            rumqttc::Broker::tcp("127.0.0.1", p.port),
        );
        opts.set_keep_alive(30)
            .set_clean_start(true)
            .set_outgoing_inflight_upper_limit(p.window.min(65_535) as u16);
        if let Some((user, password)) = p.credentials {
            opts.set_credentials(user, password.as_bytes().to_vec());
        }
        let (client, mut events): (AsyncClient, _) = AsyncClient::builder(opts)
            .capacity(p.window * 2 + 16)
            .build();
        let driver = tokio::spawn(async move {
            loop {
                if let Err(e) = events.poll().await {
                    if matches!(e, rumqttc::ConnectionError::RequestsDone) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
        let t0 = Instant::now();
        let deadline = tokio::time::Instant::now() + limit;
        let mut waiting = VecDeque::new();
        for i in p.first..p.first + p.count {
            if let Some(rate) = p.rate {
                let due = t0 + Duration::from_secs_f64((i - p.first) as f64 / rate as f64);
                tokio::time::sleep_until(due.into()).await;
            }
            if waiting.len() >= p.window {
                let n: rumqttc::PublishNotice = waiting.pop_front().expect("a notice");
                tokio::time::timeout_at(deadline, n.wait_completion_async())
                    .await
                    .map_err(|_| format!("no PUBACK within {limit:?}"))?
                    .map_err(|e| format!("message refused: {e}"))?;
                accepted.fetch_add(1, Ordering::SeqCst);
            }
            let n = client
                .publish_tracked(p.topic.clone(), payload(i), PublishOptions::new(p.qos))
                .await
                .map_err(|e| e.to_string())?;
            waiting.push_back(n);
        }
        for n in waiting {
            tokio::time::timeout_at(deadline, n.wait_completion_async())
                .await
                .map_err(|_| format!("no PUBACK within {limit:?}"))?
                .map_err(|e| format!("message refused: {e}"))?;
            accepted.fetch_add(1, Ordering::SeqCst);
        }
        let _ = client.disconnect().await;
        let _ = tokio::time::timeout(Duration::from_secs(2), driver).await;
        Ok(())
    })
}

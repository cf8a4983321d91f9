//! A scripted hub: the real server TLS configuration over real QUIC, with the session
//! driven by the test (what to send, what to expect from the agent).

use std::path::Path;
use std::time::Duration;

use kedge_net::tls::{self, TlsMaterial, TransportTuning};
use kedge_protocol::{
    AgentMessage, FramedStream, HeartbeatAck, Hello, HubMessage, JobRef, JobStatus,
    PROTOCOL_VERSION, StatusReport, Welcome,
};

use super::{HubPorts, Pki};

/// The hub's side of an agent's stream.
pub type HubSide = FramedStream<quinn::RecvStream, quinn::SendStream, AgentMessage, HubMessage>;

/// A listening scripted hub.
pub struct HubPeer {
    pub endpoint: quinn::Endpoint,
}

/// One accepted agent session.
pub struct Session {
    pub connection: quinn::Connection,
    pub control: HubSide,
    pub hello: Hello,
}

impl HubPeer {
    /// Listens on a free loopback port with the hub certificate of `pki`.
    pub fn start(pki: &Pki) -> HubPeer {
        let material = TlsMaterial::from_files(
            Path::new(&pki.path("hub.pem")),
            Path::new(&pki.path("hub-key.pem")),
            Path::new(&pki.path("ca.pem")),
        )
        .unwrap();
        let endpoint = quinn::Endpoint::server(
            tls::server_config(material, TransportTuning::default()).unwrap(),
            "127.0.0.1:0".parse().unwrap(),
        )
        .unwrap();
        HubPeer { endpoint }
    }

    /// Ports to give an agent (no ops endpoint).
    pub fn ports(&self) -> HubPorts {
        HubPorts {
            quic: self.endpoint.local_addr().unwrap().port(),
            ops: 0,
        }
    }

    /// Accepts the next agent, reads its `Hello`, welcomes it as `member` and answers its
    /// heartbeats (every 200 ms) until the connection ends.
    pub async fn accept(&self, member: &str) -> Session {
        self.accept_with_heartbeat(member, 200).await
    }

    /// [`HubPeer::accept`] with heartbeats every `heartbeat_ms`.
    pub async fn accept_with_heartbeat(&self, member: &str, heartbeat_ms: u64) -> Session {
        self.accept_speaking(member, heartbeat_ms, PROTOCOL_VERSION)
            .await
    }

    /// [`HubPeer::accept_with_heartbeat`], welcoming the agent to `protocol_version` (an
    /// older hub).
    pub async fn accept_speaking(
        &self,
        member: &str,
        heartbeat_ms: u64,
        protocol_version: u16,
    ) -> Session {
        let connection = tokio::time::timeout(Duration::from_secs(20), async {
            self.endpoint.accept().await.unwrap().await.unwrap()
        })
        .await
        .expect("the agent connects");
        let (send, recv) = connection.accept_bi().await.unwrap();
        let mut control = HubSide::new(recv, send);
        let Some(AgentMessage::Hello(hello)) = control.recv().await.unwrap() else {
            panic!("expected Hello")
        };
        control
            .send(&HubMessage::Welcome(Welcome {
                protocol_version,
                hub_version: "test".into(),
                session_id: format!("s-{}", connection.stable_id()),
                member: member.into(),
                heartbeat_interval_ms: heartbeat_ms,
            }))
            .await
            .unwrap();
        let heartbeat_conn = connection.clone();
        tokio::spawn(async move {
            let Ok((send, recv)) = heartbeat_conn.accept_bi().await else {
                return;
            };
            let mut beats = HubSide::new(recv, send);
            while let Ok(Some(AgentMessage::Heartbeat(b))) = beats.recv().await {
                if beats
                    .send(&HubMessage::HeartbeatAck(HeartbeatAck { seq: b.seq }))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        Session {
            connection,
            control,
            hello,
        }
    }
}

/// Reads control messages until `pick` returns something (within `limit`), answering
/// nothing.
pub async fn next_within<T>(
    control: &mut HubSide,
    limit: Duration,
    what: &str,
    mut pick: impl FnMut(AgentMessage) -> Option<T>,
) -> T {
    let mut last = None;
    let found = tokio::time::timeout(limit, async {
        loop {
            let message = control
                .recv()
                .await
                .unwrap()
                .expect("agent closed the control stream");
            last = Some(format!("{message:?}"));
            if let Some(found) = pick(message) {
                return found;
            }
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        let mut last = last.unwrap_or_default();
        last.truncate(2000);
        panic!("timed out waiting for {what}; the last message was {last}")
    })
}

/// [`next_within`] 20 seconds.
pub async fn next<T>(
    control: &mut HubSide,
    what: &str,
    pick: impl FnMut(AgentMessage) -> Option<T>,
) -> T {
    next_within(control, Duration::from_secs(20), what, pick).await
}

/// What a hub knows of a member's Jobs from its reports: the last status of each, and
/// whether the set is complete (the parts of the last full report have all arrived).
#[derive(Debug, Default)]
pub struct JobBook {
    pub jobs: std::collections::BTreeMap<JobRef, JobStatus>,
    /// Within a full report: the Jobs seen in its parts so far.
    open: Option<std::collections::BTreeMap<JobRef, JobStatus>>,
    /// Whether a full set has completed since the book was made.
    pub complete: bool,
    /// Reports read.
    pub reports: usize,
    /// Jobs named twice within one full set.
    pub duplicates: usize,
    /// Every (name, phase) in report order, one entry per change.
    pub history: Vec<(String, kedge_protocol::JobPhase)>,
}

fn job_ref(status: &JobStatus) -> JobRef {
    JobRef {
        namespace: status.namespace.clone(),
        name: status.name.clone(),
    }
}

impl JobBook {
    /// Applies one report as the hub should.
    pub fn record(&mut self, report: &StatusReport) {
        self.reports += 1;
        if report.full {
            self.open = Some(Default::default());
        }
        for status in &report.jobs {
            if self.jobs.get(&job_ref(status)).map(|s| s.phase) != Some(status.phase) {
                self.history.push((status.name.clone(), status.phase));
            }
            if let Some(open) = &mut self.open
                && open.insert(job_ref(status), status.clone()).is_some()
            {
                self.duplicates += 1;
            }
            self.jobs.insert(job_ref(status), status.clone());
        }
        for gone in &report.removed_jobs {
            self.jobs.remove(gone);
        }
        if !report.more
            && let Some(set) = self.open.take()
        {
            self.jobs = set;
            self.complete = true;
        }
    }

    /// The phases Job `name` went through, in order.
    pub fn phases(&self, name: &str) -> Vec<kedge_protocol::JobPhase> {
        self.history
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, p)| *p)
            .collect()
    }
}

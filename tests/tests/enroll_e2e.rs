//! Enrollment end to end: the real `kedge-hub` keeps its CA in a Secret and issues member
//! certificates; the real `kedge-agent` enrolls with a one-time bootstrap token, keeps its
//! identity in a Secret of its cluster, renews it over the live session and reuses it after
//! a restart. Bad tokens and foreign CSRs are refused with distinct reasons; a session whose
//! certificate expires without renewal is closed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kedge_protocol::{EnrollRefusalCode, EnrollResponse, HubMessage, close_code};
use kube::Api;
use support::enroll::{EnrollFleet, NS};
use support::*;
use time::OffsetDateTime;

const HOUR: Duration = Duration::from_secs(3600);

/// The certificate (PEM) of the identity Secret of `member`, if stored.
async fn stored_identity(fleet: &EnrollFleet, member: &str) -> Option<String> {
    let secrets = Api::<Secret>::namespaced(fleet.member_client(member).await, NS);
    let secret = secrets.get_opt("kedge-agent-identity").await.ok()??;
    let data = secret.data?;
    assert!(data.contains_key("tls.key"), "the key is stored with it");
    Some(String::from_utf8(data.get("tls.crt")?.0.clone()).unwrap())
}

/// Member name, SANs and expiry (Unix seconds) of a PEM certificate.
fn names(cert_pem: &str) -> (String, Vec<String>, i64) {
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
    let id = kedge_net::identity::peer_identity(std::slice::from_ref(&der)).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
    let sans = cert
        .subject_alternative_name()
        .unwrap()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .map(|n| n.to_string())
                .collect()
        })
        .unwrap_or_default();
    (id.member, sans, id.not_after_unix)
}

async fn session_of(ports: HubPorts, member: &str) -> Option<serde_json::Value> {
    let sessions = sessions(ports).await?;
    state_of(&sessions, member)
        .filter(|s| s["state"] == "Connected")
        .cloned()
}

/// Also: the hub's own server certificate (10 s) is renewed several times meanwhile; the
/// session survives each renewal and the restarted agent verifies a renewed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_enrolls_renews_in_session_and_reuses_its_identity_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = EnrollFleet::start_with(
        dir.path(),
        &["edge-1"],
        "20s",
        &["--server-cert-lifetime", "10s"],
    )
    .await;
    let uid = fleet.create_member("edge-1").await;
    let token = fleet
        .create_token("edge-1", OffsetDateTime::now_utc(), HOUR)
        .await;
    let token_file = fleet.token_file("edge-1.token", &token);
    let token_flag = token_file.display().to_string();
    let mut agent = fleet.start_agent(
        "edge-1",
        "agent-1.log",
        &["--bootstrap-token-file", &token_flag],
    );

    // Enrolled: the identity is stored in the member, the token is spent, the session is up.
    let session = wait_for(Duration::from_secs(30), "edge-1 connected", || {
        session_of(fleet.ports, "edge-1")
    })
    .await;
    let first = stored_identity(&fleet, "edge-1")
        .await
        .expect("identity stored");
    let (member, uris, not_after) = names(&first);
    assert_eq!(member, "edge-1");
    assert_eq!(uris, [format!("URI(urn:kedge:member:edge-1:{uid})")]);
    assert!(
        fleet.secret(NS, "kedge-bootstrap-edge-1").await.is_none(),
        "the token is consumed"
    );
    assert!(
        fleet
            .hub
            .log_text()
            .contains("enrollment: certificate issued")
    );
    let session_id = session["sessionId"].clone();

    // Two renewals (at 2/3 of 20 s each) over the same session: new certificates stored,
    // no reconnect.
    let mut last = not_after;
    for round in 1..=2 {
        last = wait_for(
            Duration::from_secs(40),
            &format!("renewal {round}"),
            || async {
                let cert = stored_identity(&fleet, "edge-1").await?;
                let (_, _, renewed) = names(&cert);
                (renewed > last).then_some(renewed)
            },
        )
        .await;
        let now = session_of(fleet.ports, "edge-1")
            .await
            .expect("still connected");
        assert_eq!(
            now["sessionId"], session_id,
            "renewal {round} kept the session"
        );
    }
    assert!(agent.is_running());
    let log = agent.log_text();
    assert_eq!(
        log.matches("client certificate renewed and stored").count(),
        2,
        "{log}"
    );
    assert!(!log.contains("session with the hub lost"), "{log}");
    let hub_log = fleet.hub.log_text();
    assert!(hub_log.matches("renewal: certificate issued").count() >= 2);
    // The hub lists the renewed expiry.
    let listed = session_of(fleet.ports, "edge-1").await.unwrap();
    assert!(
        listed["certNotAfterUnix"].as_i64().unwrap() >= last - 1,
        "{listed}"
    );

    // The server certificate was renewed meanwhile (every ~6 s), the session stayed.
    let server_renewals = fleet
        .hub
        .log_text()
        .matches("renewed the hub server certificate")
        .count();
    assert!(server_renewals >= 2, "{server_renewals} server renewals");

    // A restart reuses the stored identity: the spent token is not presented again. The
    // first server certificate has long expired, so the new session also shows that the
    // hub serves a renewed one.
    agent.signal("TERM");
    let _ = agent.child.wait().await;
    let agent = fleet.start_agent(
        "edge-1",
        "agent-2.log",
        &["--bootstrap-token-file", &token_flag],
    );
    wait_for(
        Duration::from_secs(30),
        "edge-1 connected again",
        || async {
            let s = session_of(fleet.ports, "edge-1").await?;
            (s["sessionId"] != session_id).then_some(())
        },
    )
    .await;
    let log = agent.log_text();
    assert!(
        log.contains("using the identity from the identity Secret"),
        "{log}"
    );
    assert_eq!(
        fleet
            .hub
            .log_text()
            .matches("enrollment: certificate issued")
            .count(),
        1,
        "no second enrollment"
    );
}

/// The next `Renewed` answer on a scripted agent's control stream.
async fn renewed(control: &mut support::enroll::AgentSide) -> EnrollResponse {
    loop {
        if let HubMessage::Renewed(answer) = control.recv().await.unwrap().expect("an answer") {
            return answer;
        }
    }
}

/// The code of the application close that ended a connection; anything else fails the test.
fn application_close(closed: quinn::ConnectionError) -> u64 {
    let quinn::ConnectionError::ApplicationClosed(close) = closed else {
        panic!("expected an application close, got {closed}");
    };
    close.error_code.into_inner()
}

fn refusal(answer: &EnrollResponse) -> (EnrollRefusalCode, String) {
    match answer {
        EnrollResponse::Refused(r) => (r.code, r.message.clone()),
        EnrollResponse::Issued(_) => panic!("expected a refusal, got a certificate"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_and_foreign_requests_are_refused_and_expired_sessions_closed() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = EnrollFleet::start(dir.path(), &["edge-1"], "10s").await;
    fleet.create_member("edge-1").await;
    fleet.create_member("edge-2").await;
    let now = OffsetDateTime::now_utc();
    let (key, csr) = kedge_net::pki::member_csr("edge-1").unwrap();
    let (_, csr_edge_2) = kedge_net::pki::member_csr("edge-2").unwrap();

    // A wrong token for an existing one.
    let token = fleet.create_token("edge-1", now, HOUR).await;
    let wrong = format!("edge-1.{}", "A".repeat(43));
    let (code, message) = refusal(&fleet.enroll(&wrong, csr.clone()).await);
    assert_eq!(code, EnrollRefusalCode::WrongToken, "{message}");
    // A CSR naming another member than the token: refused, and the token is not spent.
    let (code, message) = refusal(&fleet.enroll(&token, csr_edge_2.clone()).await);
    assert_eq!(code, EnrollRefusalCode::NameMismatch, "{message}");
    assert!(message.contains("edge-2"), "{message}");
    // Garbage for a CSR.
    let (code, _) = refusal(&fleet.enroll(&token, vec![0x30, 0x00]).await);
    assert_eq!(code, EnrollRefusalCode::BadCsr);
    // Two enrollments with the same token at once: exactly one certificate.
    let (a, b) = tokio::join!(
        fleet.enroll(&token, csr.clone()),
        fleet.enroll(&token, csr.clone())
    );
    let issued: Vec<_> = [&a, &b]
        .into_iter()
        .filter_map(|r| match r {
            EnrollResponse::Issued(i) => Some(i.clone()),
            EnrollResponse::Refused(_) => None,
        })
        .collect();
    assert_eq!(issued.len(), 1, "{a:?} {b:?}");
    // The token is spent: reusing it is refused.
    let (code, message) = refusal(&fleet.enroll(&token, csr.clone()).await);
    assert_eq!(code, EnrollRefusalCode::TokenNotFound, "{message}");
    assert!(message.contains("already used"), "{message}");
    // An expired token.
    let expired = fleet
        .create_token("edge-2", now - time::Duration::hours(2), HOUR)
        .await;
    let (code, message) = refusal(&fleet.enroll(&expired, csr_edge_2.clone()).await);
    assert_eq!(code, EnrollRefusalCode::TokenExpired, "{message}");
    // A token for a name without a MemberCluster.
    let ghost = fleet.create_token("ghost", now, HOUR).await;
    let (_, csr_ghost) = kedge_net::pki::member_csr("ghost").unwrap();
    let (code, _) = refusal(&fleet.enroll(&ghost, csr_ghost).await);
    assert_eq!(code, EnrollRefusalCode::UnknownMember);
    // A malformed token.
    let (code, _) = refusal(&fleet.enroll("no-dot", csr.clone()).await);
    assert_eq!(code, EnrollRefusalCode::MalformedToken);
    // Every refusal is an audit line with its own reason.
    let log = fleet.hub.log_text();
    for reason in [
        "wrong_token",
        "name_mismatch",
        "bad_csr",
        "token_not_found",
        "token_expired",
        "unknown_member",
        "malformed_token",
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains("enrollment refused") && l.contains(reason)),
            "no audit line for {reason}:\n{log}"
        );
    }

    // Without a client certificate, the session ALPN is refused with its own reason.
    let trusted = kedge_net::tls::load_certs(&fleet.ca_path()).unwrap();
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let anonymous = endpoint
        .connect_with(
            kedge_net::tls::anonymous_client_config(&trusted).unwrap(),
            fleet.ports.quic_addr(),
            "localhost",
        )
        .unwrap()
        .await;
    if let Ok(connection) = anonymous {
        let closed = tokio::time::timeout(Duration::from_secs(5), connection.closed())
            .await
            .expect("closed by the hub");
        assert_eq!(
            application_close(closed),
            u64::from(close_code::BAD_IDENTITY)
        );
    }
    wait_for(
        Duration::from_secs(5),
        "the no-certificate log line",
        || async {
            fleet
                .hub
                .log_text()
                .contains("no_client_certificate")
                .then_some(())
        },
    )
    .await;

    // A session that never renews is closed when its certificate (10 s) expires.
    let cert = &issued[0];
    let started = std::time::Instant::now();
    let (connection, mut control, _session_id) = fleet.scripted_session(&cert.cert_pem, &key).await;
    let not_after_ms = cert.not_after_unix_ms;
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        // Desired state may arrive; the session ends with the certificate.
        while let Ok(Some(message)) = control.recv().await {
            assert!(!matches!(message, HubMessage::Renewed(_)));
        }
        connection.closed().await
    })
    .await
    .expect("the hub closes the session");
    assert_eq!(
        application_close(closed),
        u64::from(close_code::CERT_EXPIRED)
    );
    let closed_at_ms = kedge_protocol::unix_ms(std::time::SystemTime::now());
    assert!(
        (closed_at_ms - not_after_ms).abs() < 2_000,
        "closed at {closed_at_ms}, certificate expired at {not_after_ms} ({:?} after start)",
        started.elapsed()
    );
    assert!(fleet.hub.log_text().contains("expired without renewal"));

    // Renewal over a session is refused once the MemberCluster was deleted and created again:
    // an old enrollment's session cannot obtain a certificate of the new one.
    let (key_2, cert_2) = fleet.enrolled("edge-2").await;
    let (_connection_2, mut control_2, _) = fleet.scripted_session(&cert_2.cert_pem, &key_2).await;
    let renew = |member: &str| {
        let (_, csr_der) = kedge_net::pki::member_csr(member).unwrap();
        kedge_protocol::AgentMessage::Renew(kedge_protocol::RenewRequest { csr_der })
    };
    control_2.send(&renew("edge-2")).await.unwrap();
    assert!(matches!(
        renewed(&mut control_2).await,
        EnrollResponse::Issued(_)
    ));
    // A renewal CSR naming another member is refused too.
    control_2.send(&renew("edge-1")).await.unwrap();
    let (code, _) = refusal(&renewed(&mut control_2).await);
    assert_eq!(code, EnrollRefusalCode::NameMismatch);
    let members = Api::<kedge_core::crd::MemberCluster>::all(fleet.hub_client.clone());
    members.delete("edge-2", &Default::default()).await.unwrap();
    fleet.create_member("edge-2").await;
    control_2.send(&renew("edge-2")).await.unwrap();
    let (code, message) = refusal(&renewed(&mut control_2).await);
    assert_eq!(code, EnrollRefusalCode::Superseded, "{message}");

    // The real agent with a spent token and no stored identity stops, saying to re-enroll.
    let token_file = fleet.token_file("spent.token", &token);
    let mut agent = fleet.start_agent(
        "edge-1",
        "agent-spent.log",
        &["--bootstrap-token-file", &token_file.display().to_string()],
    );
    let status = tokio::time::timeout(Duration::from_secs(20), agent.child.wait())
        .await
        .expect("the agent exits")
        .unwrap();
    assert!(!status.success());
    let log = agent.log_text();
    assert!(log.contains("must be re-enrolled"), "{log}");
    assert!(
        log.contains("kubectl kedge mc setup-member edge-1"),
        "{log}"
    );
    assert!(log.contains("token_not_found"), "{log}");

    // A certificate that lapsed while the agent was offline, and no token: the agent stops,
    // saying to re-enroll.
    let identity = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("kedge-agent-identity".into()),
            ..Default::default()
        },
        data: Some(
            [
                ("tls.crt", cert.cert_pem.as_str()),
                ("tls.key", key.as_str()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), k8s_openapi::ByteString(v.as_bytes().to_vec())))
            .collect(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(fleet.member_client("edge-1").await, NS)
        .create(&Default::default(), &identity)
        .await
        .unwrap();
    let mut agent = fleet.start_agent("edge-1", "agent-lapsed.log", &[]);
    let status = tokio::time::timeout(Duration::from_secs(20), agent.child.wait())
        .await
        .expect("the agent exits")
        .unwrap();
    assert!(!status.success());
    let log = agent.log_text();
    assert!(log.contains("holds no valid certificate"), "{log}");
    assert!(log.contains("must be re-enrolled"), "{log}");
    assert!(
        log.contains("kubectl kedge mc setup-member edge-1"),
        "{log}"
    );
}

/// The hub's watched list of `MemberCluster`s lags behind the API server (here by 5 s, as a
/// loaded kube-apiserver's watch cache can). An agent that enrolls and dials right after its
/// `MemberCluster` was created is admitted, not told it is revoked; its session is not
/// revoked when an earlier change reaches the hub before its own; and a deletion still
/// revokes the live session and refuses the next one. CI caught the first case as a flake
/// (the list a few milliseconds old); without the confirming reads each step fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_membercluster_watch_neither_refuses_nor_revokes_a_new_member() {
    // Long enough for an enrollment and two sessions on a loaded CI machine.
    const LAG: Duration = Duration::from_secs(5);
    let dir = tempfile::tempdir().unwrap();
    let fleet = EnrollFleet::start(dir.path(), &["edge-1"], "1h").await;
    // The lag applies to the hub's watch once it has listed (none yet).
    wait_for(Duration::from_secs(20), "the hub's first list", || async {
        fleet
            .hub
            .log_text()
            .contains("MemberClusters listed; admitting their members")
            .then_some(())
    })
    .await;
    let hub = fleet.sim.cluster("hub").unwrap();
    hub.set_faults(kedge_sim::Faults {
        watch_lag: LAG,
        ..Default::default()
    });
    // An earlier change, which reaches the hub while edge-1's does not yet.
    let earlier = std::time::Instant::now();
    fleet.create_member("edge-0").await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    fleet.create_member("edge-1").await;
    let (key, cert) = fleet.enrolled("edge-1").await;
    let answer = fleet.hello_answer(&cert.cert_pem, &key).await;
    assert!(
        matches!(answer, Some(HubMessage::Welcome(_))),
        "a new member is admitted before the hub's watch has it: {answer:?}"
    );
    let (connection, _control, _) = fleet.scripted_session(&cert.cert_pem, &key).await;
    assert!(
        earlier.elapsed() < LAG,
        "the session opened before edge-0's change reached the hub ({:?})",
        earlier.elapsed()
    );
    // edge-0's change arrives (and the hub checks its live sessions) while edge-1's is still
    // on its way: the session stays.
    let stays = tokio::time::timeout(
        LAG + Duration::from_secs(2) - earlier.elapsed(),
        connection.closed(),
    )
    .await;
    assert!(stays.is_err(), "the session was closed: {stays:?}");
    let log = fleet.hub.log_text();
    assert!(!log.contains("live session revoked"), "{log}");
    assert!(!log.contains("session refused"), "{log}");

    // Deleted: the live session is revoked once the hub hears of it, and a new one refused.
    Api::<kedge_core::crd::MemberCluster>::all(fleet.hub_client.clone())
        .delete("edge-1", &Default::default())
        .await
        .unwrap();
    let closed = tokio::time::timeout(LAG + Duration::from_secs(5), connection.closed())
        .await
        .expect("the hub revokes the session of a deleted member");
    assert_eq!(application_close(closed), u64::from(close_code::REVOKED));
    let refusal = fleet.hello_refused(&cert.cert_pem, &key).await;
    assert_eq!(
        refusal.code,
        kedge_protocol::RefusalCode::Revoked,
        "{refusal:?}"
    );
    assert!(refusal.message.contains("no MemberCluster"), "{refusal:?}");
}

/// A revocation the hub cannot confirm waits; it is not done on the watched list alone, and
/// an agent the hub cannot confirm is refused as `Unavailable`, not `Revoked`. The hub
/// cluster answers every request with an error for a few seconds (its open watches go on):
/// the deleted member's live session stays, a new session of it is told to retry, and the
/// hub revokes the session at its next try once the hub cluster answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_the_hub_cannot_confirm_waits_for_the_hub_cluster() {
    let dir = tempfile::tempdir().unwrap();
    // A Lease that outlives the outage.
    let fleet =
        EnrollFleet::start_with(dir.path(), &["edge-1"], "1h", &["--lease-duration", "30s"]).await;
    fleet.create_member("edge-1").await;
    let (key, cert) = fleet.enrolled("edge-1").await;
    let (connection, _control, _) = fleet.scripted_session(&cert.cert_pem, &key).await;

    // The deletion reaches the hub's watch while every read of the hub cluster fails (the
    // lag leaves room for this test to be descheduled between the two).
    const LAG: Duration = Duration::from_secs(3);
    let hub = fleet.sim.cluster("hub").unwrap();
    hub.set_faults(kedge_sim::Faults {
        watch_lag: LAG,
        ..Default::default()
    });
    Api::<kedge_core::crd::MemberCluster>::all(fleet.hub_client.clone())
        .delete("edge-1", &Default::default())
        .await
        .unwrap();
    hub.set_faults(kedge_sim::Faults {
        watch_lag: LAG,
        error_rate: 1.0,
        ..Default::default()
    });
    wait_for(
        LAG + Duration::from_secs(10),
        "a revocation it cannot confirm",
        || async {
            fleet
                .hub
                .log_text()
                .contains("cannot list MemberClusters to confirm revocations")
                .then_some(())
        },
    )
    .await;
    assert!(
        connection.close_reason().is_none(),
        "revoked without a confirmation: {:?}\n{}",
        connection.close_reason(),
        fleet.hub.log_text()
    );
    let refusal = fleet.hello_refused(&cert.cert_pem, &key).await;
    assert!(
        refusal.code == kedge_protocol::RefusalCode::Unavailable
            && refusal.message.contains("to confirm its refusal"),
        "{refusal:?}\n{}",
        fleet.hub.log_text()
    );

    // The hub cluster answers again: the next try revokes.
    hub.set_faults(kedge_sim::Faults::default());
    let closed = tokio::time::timeout(Duration::from_secs(10), connection.closed())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "not revoked once the hub cluster answers\n{}",
                fleet.hub.log_text()
            )
        });
    assert_eq!(application_close(closed), u64::from(close_code::REVOKED));
}

/// A token outlives neither its member nor a `MemberCluster` created again under the same
/// name, also when the member is deleted with plain `kubectl delete mc` (no `kubectl kedge`):
/// the garbage collector deletes the token with its owner, and a token Secret that survives
/// (restored from a backup, or not yet collected) is refused because it is bound to the uid of
/// the deleted `MemberCluster`; it is not spent by the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_a_deleted_membercluster_is_refused_after_it_is_created_again() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = EnrollFleet::start(dir.path(), &["edge-1"], "1h").await;
    let first = fleet.create_member("edge-1").await;
    let token = fleet
        .create_token("edge-1", OffsetDateTime::now_utc(), HOUR)
        .await;
    let saved = fleet.secret(NS, "kedge-bootstrap-edge-1").await.unwrap();
    let hub_kubeconfig = dir.path().join("hub.kubeconfig");
    support::enroll::kubectl_ok(&hub_kubeconfig, &["delete", "mc", "edge-1"]).await;
    let second = fleet.create_member("edge-1").await;
    assert_ne!(first, second);

    // The old token, right after: refused, whether or not its Secret was collected yet.
    let (_, csr) = kedge_net::pki::member_csr("edge-1").unwrap();
    let (code, message) = refusal(&fleet.enroll(&token, csr.clone()).await);
    assert!(
        matches!(
            code,
            EnrollRefusalCode::TokenNotFound | EnrollRefusalCode::Superseded
        ),
        "{code:?}: {message}"
    );
    for fix in [
        "kubectl kedge mc delete-member edge-1",
        "kubectl kedge mc setup-member edge-1",
    ] {
        assert!(message.contains(fix), "{fix}: {message}");
    }
    // The garbage collector deletes the token with its MemberCluster.
    wait_for(Duration::from_secs(10), "the token collected", || async {
        fleet
            .secret(NS, "kedge-bootstrap-edge-1")
            .await
            .is_none()
            .then_some(())
    })
    .await;

    // The token Secret restored (without its owner, so it stays): still refused, as a token
    // of the earlier MemberCluster, and not spent.
    let restored = Secret {
        metadata: kube::api::ObjectMeta {
            name: saved.metadata.name.clone(),
            labels: saved.metadata.labels.clone(),
            ..Default::default()
        },
        type_: saved.type_.clone(),
        data: saved.data.clone(),
        ..Default::default()
    };
    Api::<Secret>::namespaced(fleet.hub_client.clone(), NS)
        .create(&Default::default(), &restored)
        .await
        .unwrap();
    let (code, message) = refusal(&fleet.enroll(&token, csr).await);
    assert_eq!(code, EnrollRefusalCode::Superseded, "{message}");
    for part in [
        "earlier MemberCluster",
        first.as_str(),
        second.as_str(),
        "kubectl kedge mc delete-member edge-1",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert!(fleet.secret(NS, "kedge-bootstrap-edge-1").await.is_some());
    assert!(
        fleet
            .hub
            .log_text()
            .lines()
            .any(|l| l.contains("enrollment refused") && l.contains("superseded"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_hub_starts_share_one_ca_and_a_malformed_one_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let names = vec!["hub".to_owned()];
    let _sim = kedge_sim::Sim::start(&names, kedge_sim::SimConfig::default(), Some(dir.path()))
        .await
        .unwrap();
    let client = support::enroll::kube_client(&dir.path().join("hub.kubeconfig")).await;
    let now = OffsetDateTime::now_utc();
    let ns = "default";
    let (a, b) = tokio::join!(
        kedge_hub::ca::load_or_create_ca(client.clone(), ns, now),
        kedge_hub::ca::load_or_create_ca(client.clone(), ns, now)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.cert_pem(), b.cert_pem(), "two creators, one CA");
    let secrets = Api::<Secret>::namespaced(client.clone(), ns);
    let stored = secrets.get("kedge-hub-ca").await.unwrap();
    let stored_pem = String::from_utf8(stored.data.clone().unwrap()["tls.crt"].0.clone()).unwrap();
    assert_eq!(stored_pem, a.cert_pem());
    // A later start reuses it.
    let again = kedge_hub::ca::load_or_create_ca(client.clone(), ns, now)
        .await
        .unwrap();
    assert_eq!(again.cert_pem(), a.cert_pem());
    // A malformed Secret is an error, and it is left as it is.
    let mut broken = stored.clone();
    broken.data.as_mut().unwrap().remove("tls.key");
    secrets
        .replace("kedge-hub-ca", &Default::default(), &broken)
        .await
        .unwrap();
    let err = kedge_hub::ca::load_or_create_ca(client.clone(), ns, now)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("malformed") && err.contains("tls.key"),
        "{err}"
    );
    let after = secrets.get("kedge-hub-ca").await.unwrap();
    assert!(
        !after.data.unwrap().contains_key("tls.key"),
        "not regenerated"
    );
}

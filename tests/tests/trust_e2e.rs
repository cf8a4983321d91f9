//! Trust on the hub, end to end with the real binaries on kedge-sim: tenancy (a DSO places
//! workloads only in its own namespace unless the MemberCluster grants another), members
//! exist only through a MemberCluster, deleting one revokes the member at once, a certificate
//! of an earlier enrollment is refused, and two agents sharing one certificate are reported
//! instead of replacing each other forever.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::dso::*;
use support::*;

/// The tests share two cores; one at a time so that timings mean what they say.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A Deployment `name` with `replicas` in `namespace` of `member`.
fn put_deployment(fleet: &Fleet, member: &str, namespace: &str, name: &str, replicas: i64) {
    let cluster = fleet.sim.cluster(member).unwrap();
    cluster
        .put_object(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
        )
        .unwrap();
    cluster
        .put_object(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "c", "image": "dns"}]}}},
        }))
        .unwrap();
}

fn replicas_in(fleet: &Fleet, member: &str, namespace: &str, name: &str) -> Option<i64> {
    fleet
        .sim
        .cluster(member)?
        .object("apps/v1", "Deployment", namespace, name)?
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
}

/// Sets `spec.namespaceMappings` of `member`'s MemberCluster to the JSON `grants`.
async fn set_grants(fleet: &Fleet, member: &str, grants: &str) {
    let patch = format!(r#"{{"spec":{{"namespaceMappings":{grants}}}}}"#);
    fleet
        .kubectl(&["patch", "mc", member, "--type", "merge", "-p", &patch])
        .await;
}

fn ready(fleet: &Fleet, dso: &str) -> Value {
    condition(&fleet.dso(dso)["status"], "Ready")
        .cloned()
        .unwrap_or(Value::Null)
}

/// A DSO in `default` targeting `kube-system` in member-1 is refused with a condition and an
/// Event and changes nothing there, however KEDA scales it; once the MemberCluster grants
/// `default` → `kube-system`, it scales; when the grant is taken back, kedge lets go of the
/// workload without scaling it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dso_places_workloads_only_in_its_namespace_unless_granted() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = start(&["member-1"]).await;
    put_deployment(&fleet, "member-1", "kube-system", "coredns", 2);
    let _hub = fleet.start_hub("hub.log");
    let _agent = fleet.start_agent("member-1", None, "member-1.log");
    wait_for_states(fleet.ports, &["member-1"], "Connected", LIMIT).await;

    // KEDA wants 1 replica: ceil(5 / 5).
    let hub = fleet.sim.cluster("hub").unwrap();
    hub.set_metric("default", "coredns", "0", 5.0);
    let members = "  memberClusters:\n  - {name: member-1, targetNamespace: kube-system}";
    apply(
        &fleet,
        &dso_yaml("coredns", members, "dns-load"),
        "dso.yaml",
    )
    .await;
    let refused = wait_for(LIMIT, "Ready=False NamespaceNotAllowed", || async {
        let c = ready(&fleet, "coredns");
        (c["reason"] == "NamespaceNotAllowed").then_some(c)
    })
    .await;
    assert_eq!(refused["status"], "False");
    let message = refused["message"].as_str().unwrap();
    assert!(message.contains("\"kube-system\""), "{message}");
    assert!(message.contains("spec.namespaceMappings"), "{message}");
    fleet
        .wait_event("coredns", "NamespaceNotAllowed", "kube-system")
        .await;
    // `kubectl describe` shows it too.
    let described = fleet.kubectl(&["describe", "dso", "coredns"]).await;
    assert!(described.contains("NamespaceNotAllowed"), "{described}");
    // Nothing reaches kube-system while refused.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        replicas_in(&fleet, "member-1", "kube-system", "coredns"),
        Some(2)
    );

    // The member's admin grants it: now KEDA's 1 replica is applied.
    set_grants(
        &fleet,
        "member-1",
        r#"[{"hubNamespace":"default","memberNamespaces":["kube-system"]}]"#,
    )
    .await;
    wait_for(LIMIT, "coredns scaled to 1 once granted", || async {
        (replicas_in(&fleet, "member-1", "kube-system", "coredns") == Some(1)).then_some(())
    })
    .await;
    assert_eq!(ready(&fleet, "coredns")["status"], "True");

    // The grant is taken back: refused again, and a higher metric no longer reaches it.
    set_grants(&fleet, "member-1", "null").await;
    wait_for(LIMIT, "refused again", || async {
        (ready(&fleet, "coredns")["reason"] == "NamespaceNotAllowed").then_some(())
    })
    .await;
    hub.set_metric("default", "coredns", "0", 15.0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        replicas_in(&fleet, "member-1", "kube-system", "coredns"),
        Some(1)
    );
}

/// The hub's log, for reasons it gave.
fn hub_log(fleet: &Fleet, name: &str) -> String {
    std::fs::read_to_string(fleet.dir.join(name)).unwrap_or_default()
}

/// A member without a MemberCluster gets no session (and says how to enroll); creating one
/// admits it; deleting it drops the live session within a second and keeps the agent out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_exist_only_through_a_membercluster_and_deleting_one_revokes_it() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = start(&["member-1", "member-2"]).await;
    fleet.kubectl(&["delete", "mc", "member-2"]).await;
    let _hub = fleet.start_hub_with("hub.log", &["--forget-departed-after", "5s"]);
    let _a1 = fleet.start_agent("member-1", None, "member-1.log");
    let a2 = fleet.start_agent("member-2", None, "member-2.log");
    wait_for_states(fleet.ports, &["member-1"], "Connected", LIMIT).await;
    wait_for(LIMIT, "member-2 refused as not enrolled", || async {
        a2.log_text()
            .contains("kubectl kedge mc setup-member member-2")
            .then_some(())
    })
    .await;
    assert!(hub_log(&fleet, "hub.log").contains("not_enrolled"));
    let listed = sessions(fleet.ports).await.unwrap();
    assert!(state_of(&listed, "member-2").is_none(), "{listed:?}");

    fleet.register("member-2").await;
    wait_for_states(fleet.ports, &["member-2"], "Connected", LIMIT).await;

    // `mc list-members` shows both, with state, versions and address.
    let listed = wait_for(LIMIT, "list-members showing both Ready", || async {
        let out = kedge_mc(&fleet, &["list-members"]).await;
        (out.lines()
            .filter(|l| l.contains("Ready") && l.contains("127.0.0.1:"))
            .count()
            == 2)
            .then_some(out)
    })
    .await;
    assert!(listed.starts_with("NAME"), "{listed}");

    // Revocation: the live session ends within a second of the delete.
    let said = kedge_mc(&fleet, &["delete-member", "member-2"]).await;
    let deleted = Instant::now();
    assert!(
        said.contains("membercluster.kedge.dev/member-2 deleted"),
        "{said}"
    );
    let listed = wait_for(LIMIT, "member-2 revoked", || async {
        let listed = sessions(fleet.ports).await?;
        (state_of(&listed, "member-2")?["state"] == "Unreachable").then_some(listed)
    })
    .await;
    let took = deleted.elapsed();
    eprintln!("revocation took {took:?} (delete returned → session listed closed)");
    assert!(took < Duration::from_secs(1), "revocation took {took:?}");
    let reason = state_of(&listed, "member-2").unwrap()["reason"].clone();
    assert!(reason.as_str().unwrap().contains("revoked"), "{reason}");
    // The agent keeps trying and stays out; member-1 is untouched.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let listed = sessions(fleet.ports).await.unwrap();
    assert_eq!(
        state_of(&listed, "member-2").unwrap()["state"],
        "Unreachable"
    );
    assert_eq!(state_of(&listed, "member-1").unwrap()["state"], "Connected");
    let log = hub_log(&fleet, "hub.log");
    assert!(
        log.contains("live session revoked"),
        "no audit line for the revocation"
    );
    // After --forget-departed-after, the deleted member is no longer listed, counted or
    // measured; member-1 keeps its series.
    let metrics = ops_get(fleet.ports, "/metrics").await.unwrap();
    assert!(metrics.contains("member=\"member-2\""), "{metrics}");
    wait_for(LIMIT, "member-2 forgotten", || async {
        let listed = sessions(fleet.ports).await?;
        state_of(&listed, "member-2").is_none().then_some(())
    })
    .await;
    let forgotten = deleted.elapsed();
    eprintln!("forgotten {forgotten:?} after the delete (--forget-departed-after 5s)");
    assert!(
        forgotten >= Duration::from_secs(5),
        "forgotten after {forgotten:?}"
    );
    let metrics = ops_get(fleet.ports, "/metrics").await.unwrap();
    assert!(!metrics.contains("member=\"member-2\""), "{metrics}");
    assert!(metrics.contains("member=\"member-1\""), "{metrics}");
    assert!(
        metrics.contains("kedge_hub_sessions{state=\"Unreachable\"} 0"),
        "{metrics}"
    );
    assert!(hub_log(&fleet, "hub.log").contains("departed member forgotten"));
}

/// `kubectl kedge mc ARGS` against the fleet's hub cluster; its output (panics on failure).
async fn kedge_mc(fleet: &Fleet, args: &[&str]) -> String {
    let out = tokio::process::Command::new(bin("kubectl-kedge"))
        .arg("mc")
        .args(args)
        .arg("--kubeconfig")
        .arg(fleet.kubeconfig("hub"))
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kedge mc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A certificate bound to an earlier enrollment (the URI SAN names the uid of a deleted
/// MemberCluster) is refused even though a MemberCluster of that name exists again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_of_an_earlier_enrollment_is_refused() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = start(&["member-1"]).await;
    let uid = |fleet: &Fleet| enrollment_uid(fleet, "member-1");
    let first = uid(&fleet);
    let _hub = fleet.start_hub("hub.log");
    let bound = |log: &str| bound_agent(&fleet, "member-1", &first, log);
    let agent = bound("agent-1.log");
    wait_for_states(fleet.ports, &["member-1"], "Connected", LIMIT).await;
    drop(agent);

    // The member is deleted and enrolled again: same name, new uid.
    fleet.kubectl(&["delete", "mc", "member-1"]).await;
    fleet.register("member-1").await;
    assert_ne!(uid(&fleet), first);
    let agent = bound("agent-2.log");
    wait_for(LIMIT, "the old certificate refused", || async {
        agent
            .log_text()
            .contains("issued for an earlier enrollment")
            .then_some(())
    })
    .await;
    assert!(hub_log(&fleet, "hub.log").contains("earlier_enrollment"));
    // The refused certificate opened no session, and the record of the member before is
    // gone with its enrollment: member-1 is listed once its new agent connects.
    wait_for(LIMIT, "member-1 not listed", || async {
        let listed = sessions(fleet.ports).await?;
        state_of(&listed, "member-1").is_none().then_some(())
    })
    .await;
}

/// The uid of `member`'s MemberCluster: the enrollment its certificates are bound to.
fn enrollment_uid(fleet: &Fleet, member: &str) -> String {
    fleet
        .sim
        .cluster("hub")
        .unwrap()
        .object("kedge.dev/v1alpha1", "MemberCluster", "", member)
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// An agent for `member` with a certificate bound to its MemberCluster `uid`, issued from
/// the fleet's CA and laid out like the fleet's PKI (in a directory of its own).
fn bound_agent(fleet: &Fleet, member: &str, uid: &str, log: &str) -> Proc {
    let (cert, key) = enrolled_cert(fleet, member, uid);
    let pki = Pki {
        dir: fleet.dir.join(format!("bound-{uid}")),
    };
    std::fs::create_dir_all(&pki.dir).unwrap();
    for file in ["ca.pem".to_owned(), format!("{member}.kubeconfig")] {
        std::fs::copy(fleet.pki.dir.join(&file), pki.dir.join(&file)).unwrap();
    }
    std::fs::write(pki.dir.join(format!("member-{member}.pem")), cert).unwrap();
    std::fs::write(pki.dir.join(format!("member-{member}-key.pem")), key).unwrap();
    start_agent_with(&pki, member, fleet.ports, fleet.dir.join(log), &[])
}

/// A client certificate for `member` bound to MemberCluster `uid`, signed by the fleet's CA.
fn enrolled_cert(fleet: &Fleet, member: &str, uid: &str) -> (String, String) {
    use rcgen::{
        CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
        SanType,
    };
    let ca_cert = std::fs::read_to_string(fleet.pki.path("ca.pem")).unwrap();
    let ca_key = std::fs::read_to_string(fleet.pki.path("ca-key.pem")).unwrap();
    let issuer = Issuer::from_ca_cert_pem(&ca_cert, KeyPair::from_pem(&ca_key).unwrap()).unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, member);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.subject_alt_names = vec![SanType::URI(
        kedge_net::identity::enrollment_uri(member, uid)
            .try_into()
            .unwrap(),
    )];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Two agents presenting member-1's certificate: after a few replacements the hub stops
/// letting them replace each other, keeps one session and reports the other's address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_with_one_certificate_are_reported_not_flapping() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = start(&["member-1"]).await;
    let _hub = fleet.start_hub("hub.log");
    let _a = fleet.start_agent("member-1", None, "agent-a.log");
    wait_for_states(fleet.ports, &["member-1"], "Connected", LIMIT).await;
    let _b = fleet.start_agent("member-1", None, "agent-b.log");
    let flagged = wait_for(LIMIT, "member-1 flagged as duplicated", || async {
        let listed = sessions(fleet.ports).await?;
        let m = state_of(&listed, "member-1")?.clone();
        (m["duplicateFrom"].as_str().is_some_and(|a| !a.is_empty())).then_some(m)
    })
    .await;
    assert!(hub_log(&fleet, "hub.log").contains("duplicate_identity"));
    // Stable from now on: the same session holds, still Connected.
    let held = flagged["sessionId"].clone();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let listed = sessions(fleet.ports).await.unwrap();
    let m = state_of(&listed, "member-1").unwrap();
    assert_eq!(
        m["sessionId"], held,
        "the agents still replace each other: {m}"
    );
    assert_eq!(m["state"], "Connected");
}

/// Jobs of DSJ `default/work` in `member`.
async fn work_jobs(fleet: &Fleet, member: &str) -> usize {
    use k8s_openapi::api::batch::v1::Job;
    let client = fleet.sim.cluster(member).unwrap().client().unwrap();
    kube::Api::<Job>::namespaced(client, "default")
        .list(&kube::api::ListParams::default().labels("kedge.dev/distributedscaledjob=work"))
        .await
        .unwrap()
        .items
        .len()
}

/// A member deleted while the hub held Job creates for it, and enrolled again, is a new
/// member: it is not sent the creates held for the one before. A DSJ over every registered
/// member placed that work on the other member once the first was gone; sending the creates
/// too would run it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_enrolled_anew_is_sent_no_job_held_for_the_one_before() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = start_with(&["member-1", "member-2"], |c| {
        c.job_duration = Duration::from_secs(600)
    })
    .await;
    let kubeconfig = fleet.kubeconfig("hub").display().to_string();
    // Heartbeats every 2 s: a stopped agent keeps its session for 6 s, time for the DSJ to
    // hand it creates that it never carries out.
    let _hub = start_hub_with(
        &fleet.pki,
        fleet.ports,
        "2s",
        fleet.dir.join("hub.log"),
        &[
            "--kubeconfig",
            &kubeconfig,
            "--lease-namespace",
            "kedge-system",
            "--dsj-enabled",
            "true",
        ],
    );
    let first = enrollment_uid(&fleet, "member-1");
    let stopped = bound_agent(&fleet, "member-1", &first, "member-1.log");
    let _other = fleet.start_agent("member-2", None, "member-2.log");
    wait_for_states(fleet.ports, &["member-1", "member-2"], "Connected", LIMIT).await;
    let every_member = dsj_yaml("queue").replace(
        "  memberClusters:\n  - {name: member-1, weight: 2}\n  - {name: member-2, weight: 3}\n",
        "",
    );
    assert!(!every_member.contains("memberClusters"), "{every_member}");
    apply(&fleet, &every_member, "work.yaml").await;
    let dsj = || fleet.hub_object("kedge.dev/v1alpha1", "DistributedScaledJob", "work");
    wait_for(LIMIT, "both members Ready for the DSJ", || async {
        let s = dsj()?["status"]["memberClusterStatuses"].clone();
        (s["member-1"]["state"] == "Ready" && s["member-2"]["state"] == "Ready").then_some(())
    })
    .await;

    // member-1's agent stops: the DSJ hands it creates it never carries out.
    stopped.signal("STOP");
    set_queue(&fleet, 4).await;
    let held = wait_for(LIMIT, "creates held for member-1", || async {
        let s = dsj()?["status"]["memberClusterStatuses"]["member-1"].clone();
        let pending = s["pendingJobs"].as_i64()?;
        (pending > 0).then_some(pending)
    })
    .await;
    // Deleted: its session is revoked, and the DSJ places its share on member-2.
    fleet.kubectl(&["delete", "mc", "member-1"]).await;
    wait_for(LIMIT, "all 4 Jobs on member-2", || async {
        (work_jobs(&fleet, "member-2").await == 4).then_some(())
    })
    .await;
    stopped.signal("KILL");

    // Enrolled again (a new MemberCluster uid, a new certificate).
    fleet.register("member-1").await;
    let second = enrollment_uid(&fleet, "member-1");
    assert_ne!(second, first);
    // Until its agent connects, the new member is one that never connected: the revoked
    // session of the one before is neither listed nor shown in its status.
    wait_for(
        LIMIT,
        "the earlier enrollment's session forgotten",
        || async {
            let listed = sessions(fleet.ports).await?;
            state_of(&listed, "member-1").is_none().then_some(())
        },
    )
    .await;
    let status = wait_for(LIMIT, "the new MemberCluster Pending", || async {
        let mc = fleet.sim.cluster("hub")?.object(
            "kedge.dev/v1alpha1",
            "MemberCluster",
            "",
            "member-1",
        )?;
        (mc["status"]["state"] == "Pending").then(|| mc["status"].clone())
    })
    .await;
    assert!(status.get("agentVersion").is_none(), "{status}");
    assert!(!status.to_string().contains("revoked"), "{status}");
    let _again = bound_agent(&fleet, "member-1", &second, "member-1-again.log");
    wait_for(LIMIT, "member-1 Ready again", || async {
        let s = dsj()?["status"]["memberClusterStatuses"].clone();
        (s["member-1"]["state"] == "Ready").then_some(())
    })
    .await;
    // Three polls: none of the {held} creates held for the deleted member reaches the new one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        [
            work_jobs(&fleet, "member-1").await,
            work_jobs(&fleet, "member-2").await
        ],
        [0, 4],
        "{held} creates were held for the deleted member-1"
    );
}

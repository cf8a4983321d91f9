//! The hub's own least privilege, with the real parts: the RBAC rendered by
//! `kedge_hub::install::hub_rbac`, applied with the real `kubectl` to a simulated hub
//! cluster that enforces RBAC for bearer tokens; the real `kedge-hub` running as that
//! ServiceAccount (token from a TokenRequest) with both controllers; a real agent. The hub
//! does its whole job — Lease, admission and MemberCluster status, child ScaledObject, DSO
//! status, Events, replicas in the member, and with its external scaler its Secret, KEDA's
//! client Secret and the ClusterTriggerAuthentication, the member's ClusterProfile — and is
//! never forbidden anything, while the same token cannot read other Secrets, touch
//! workloads or create or delete members in the hub cluster.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kedge_hub::install::{HubInstall, ScalerInstall, hub_rbac};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use support::dso::*;
use support::*;

fn expect_forbidden<T: std::fmt::Debug>(r: Result<T, kube::Error>, what: &str) {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: expected 403 Forbidden, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_does_its_job_with_only_its_rendered_rbac() {
    let (_dir, fleet) = start(&["member-1"]).await;
    deployment(&fleet.sim, "member-1", "web", 1).await;
    let hub_cluster = fleet.sim.cluster("hub").unwrap();

    // KEDA in the hub cluster: its namespace (where the scaler's Role goes) and the
    // ClusterTriggerAuthentication CRD (the ScaledObject CRD is there already).
    apply(
        &fleet,
        "{apiVersion: v1, kind: Namespace, metadata: {name: keda}}",
        "keda-namespace.yaml",
    )
    .await;
    let cta_crd = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../sim/assets/clustertriggerauthentication-crd.yaml"
    );
    fleet.kubectl(&["apply", "-f", cta_crd]).await;

    let objects = hub_rbac(&HubInstall {
        namespace: "kedge-system".into(),
        lease_name: "kedge-hub".into(),
        dsj_enabled: true,
        // The hub below runs with certificate files.
        enrollment: false,
        scaler: Some(ScalerInstall::default()),
        cluster_profiles: true,
        cluster_profile_namespace: None,
    });
    let yaml: Vec<String> = objects
        .iter()
        .map(|o| serde_yaml::to_string(o).unwrap())
        .collect();
    apply(&fleet, &yaml.join("---\n"), "hub-rbac.yaml").await;
    let token = fleet
        .kubectl(&["create", "token", "kedge-hub", "-n", "kedge-system"])
        .await;
    let token = token.trim();
    let sa_kubeconfig = fleet.dir.join("hub-sa.kubeconfig");
    std::fs::write(&sa_kubeconfig, hub_cluster.kubeconfig_with_token(token)).unwrap();

    let sa = sa_kubeconfig.display().to_string();
    let log = fleet.dir.join("hub.log");
    let scaler = format!("127.0.0.1:{}", free_tcp_port());
    let mut hub = start_hub_with(
        &fleet.pki,
        fleet.ports,
        HEARTBEAT,
        log.clone(),
        &[
            "--kubeconfig",
            &sa,
            "--lease-namespace",
            "kedge-system",
            "--dsj-enabled",
            "true",
            "--namespace",
            "kedge-system",
            "--scaler-listen",
            &scaler,
            "--scaler-address",
            &scaler,
        ],
    );
    let _agent = fleet.start_agent("member-1", Some("default"), "member-1.log");
    wait_for_states(fleet.ports, &["member-1"], "Connected", LIMIT).await;

    hub_cluster.set_metric("default", "web", "0", 15.0);
    apply(
        &fleet,
        &dso_yaml(
            "web",
            "  memberClusters:\n  - {name: member-1}",
            "web-metric",
        ),
        "web.yaml",
    )
    .await;
    // ceil(15 / 5) = 3 replicas in the member: planned, sent and applied.
    fleet
        .wait_split("web", &["member-1"], &[3], "3 in member-1")
        .await;
    // The child ScaledObject was created by server-side apply, the status written, Events
    // published, the MemberCluster's status written and the Lease taken, all as the
    // ServiceAccount.
    assert!(
        fleet
            .hub_object("keda.sh/v1alpha1", "ScaledObject", "web")
            .is_some()
    );
    wait_for(LIMIT, "the DSO status", || async {
        fleet.dso("web")["status"]["memberClusterStatuses"]["member-1"]
            .is_object()
            .then_some(())
    })
    .await;
    wait_for(LIMIT, "an Event", || async {
        (!fleet.events("web").is_empty()).then_some(())
    })
    .await;
    wait_for(LIMIT, "the MemberCluster's status", || async {
        hub_cluster
            .object("kedge.dev/v1alpha1", "MemberCluster", "", "member-1")
            .filter(|m| m["status"]["state"] == "Ready")
            .map(|_| ())
    })
    .await;
    // The member's ClusterProfile, applied with its status in the hub's namespace.
    wait_for(LIMIT, "the member's ClusterProfile", || async {
        hub_cluster
            .object(
                "multicluster.x-k8s.io/v1alpha1",
                "ClusterProfile",
                "kedge-system",
                "member-1",
            )
            .filter(|p| {
                condition(&p["status"], "ControlPlaneHealthy")
                    .is_some_and(|c| c["status"] == "True")
            })
            .map(|_| ())
    })
    .await;
    // The external scaler's certificates: its Secret created in the hub's namespace, KEDA's
    // copy applied in KEDA's namespace and the ClusterTriggerAuthentication naming it.
    wait_for(LIMIT, "the scaler's Secret", || async {
        hub_cluster
            .object("v1", "Secret", "kedge-system", "kedge-scaler-tls")
            .map(|_| ())
    })
    .await;
    let client = wait_for(LIMIT, "KEDA's client Secret", || async {
        hub_cluster.object("v1", "Secret", "keda", "kedge-scaler-client")
    })
    .await;
    let mut keys: Vec<&String> = client["data"].as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(
        keys,
        ["ca.crt", "tls.crt", "tls.key"],
        "no CA or server key"
    );
    let auth = wait_for(LIMIT, "the ClusterTriggerAuthentication", || async {
        hub_cluster.object(
            "keda.sh/v1alpha1",
            "ClusterTriggerAuthentication",
            "",
            "kedge-scaler",
        )
    })
    .await;
    assert_eq!(
        auth["spec"]["secretTargetRef"][0]["name"], "kedge-scaler-client",
        "{auth}"
    );
    let lease = hub_cluster
        .object(
            "coordination.k8s.io/v1",
            "Lease",
            "kedge-system",
            "kedge-hub",
        )
        .expect("the hub's Lease");
    assert!(lease["spec"]["holderIdentity"].is_string(), "{lease}");
    assert!(hub.is_running(), "the hub stopped: {}", hub.log_text());
    let text = std::fs::read_to_string(&log).unwrap().to_lowercase();
    assert!(
        !text.contains("forbidden"),
        "the rendered RBAC denied the hub something: {text}"
    );

    // The same token, outside its Role.
    let as_hub = hub_cluster.client_with_token(token).await.unwrap();
    expect_forbidden(
        Api::<Secret>::namespaced(as_hub.clone(), "kedge-system")
            .list(&ListParams::default())
            .await,
        "listing Secrets in its own namespace",
    );
    // ClusterProfiles only in their namespace.
    let profiles = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("multicluster.x-k8s.io", "v1alpha1", "ClusterProfile"),
        "clusterprofiles",
    );
    expect_forbidden(
        Api::<kube::api::DynamicObject>::namespaced_with(as_hub.clone(), "default", &profiles)
            .list(&ListParams::default())
            .await,
        "listing ClusterProfiles in another namespace",
    );
    // In KEDA's namespace, only its client Secret; no other ClusterTriggerAuthentication.
    let keda_secrets = Api::<Secret>::namespaced(as_hub.clone(), "keda");
    expect_forbidden(
        keda_secrets.list(&ListParams::default()).await,
        "listing Secrets in KEDA's namespace",
    );
    expect_forbidden(
        keda_secrets.get("keda-operator-certs").await,
        "reading another Secret of KEDA's",
    );
    let ctas = Api::<kube::api::DynamicObject>::all_with(
        as_hub.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(
                "keda.sh",
                "v1alpha1",
                "ClusterTriggerAuthentication",
            ),
            "clustertriggerauthentications",
        ),
    );
    expect_forbidden(
        ctas.patch(
            "another",
            &PatchParams::apply("kedge-hub").force(),
            &Patch::Apply(json!({"apiVersion": "keda.sh/v1alpha1",
                "kind": "ClusterTriggerAuthentication", "metadata": {"name": "another"},
                "spec": {}})),
        )
        .await,
        "applying another ClusterTriggerAuthentication",
    );
    expect_forbidden(
        ctas.get("kedge-scaler").await,
        "reading the ClusterTriggerAuthentication (applied, never read)",
    );
    expect_forbidden(
        Api::<Deployment>::namespaced(as_hub.clone(), "default")
            .patch_scale(
                "anything",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 0}})),
            )
            .await,
        "scaling a Deployment in the hub cluster",
    );
    expect_forbidden(
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(as_hub.clone(), "kube-system")
            .get("kube-controller-manager")
            .await,
        "reading another Lease",
    );
    expect_forbidden(
        Api::<kedge_core::crd::DistributedScaledObject>::namespaced(as_hub.clone(), "default")
            .delete("web", &Default::default())
            .await,
        "deleting a DSO",
    );
    let members = Api::<kedge_core::crd::MemberCluster>::all(as_hub);
    expect_forbidden(
        members
            .create(
                &Default::default(),
                &kedge_core::crd::MemberCluster::new("intruder", Default::default()),
            )
            .await,
        "creating a member (only enrollment does)",
    );
    expect_forbidden(
        members.delete("member-1", &Default::default()).await,
        "deleting a member",
    );
}

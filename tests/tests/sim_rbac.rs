//! Bearer tokens and RBAC enforcement.

mod sim_support;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kedge_sim::Sim;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use sim_support::{fast, kubectl_ok};

const RBAC: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: agent, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: agent, namespace: default}
rules:
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [get, patch, update]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: agent, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: agent}
subjects:
- {kind: ServiceAccount, name: agent, namespace: default}
"#;

fn expect_code<T: std::fmt::Debug>(r: Result<T, kube::Error>, code: u16) -> String {
    match r {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, code, "{s:?}");
            s.message
        }
        other => panic!("expected {code}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_tokens_are_authorized_by_rbac() {
    let (sim, kc): (Sim, _) = sim_support::start("rbac", fast()).await;
    let cluster = &sim.clusters()[0];
    let dir = kc.parent().expect("dir").to_path_buf();
    let manifest = dir.join("rbac.yaml");
    std::fs::write(&manifest, RBAC).expect("write");
    kubectl_ok(&kc, &["apply", "-f", manifest.to_str().unwrap_or_default()]).await;
    let admin = cluster.client().expect("client");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "w"}},
            "template": {"metadata": {"labels": {"app": "w"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}},
    }))
    .expect("deployment");
    Api::<Deployment>::default_namespaced(admin.clone())
        .create(&PostParams::default(), &d)
        .await
        .expect("create");

    let token = cluster.service_account_token("default", "agent");
    let agent = cluster
        .client_with_token(&token)
        .await
        .expect("agent client");
    let deploys: Api<Deployment> = Api::default_namespaced(agent.clone());
    let scale = deploys
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("scale is allowed");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(3));
    Api::<Pod>::default_namespaced(agent.clone())
        .list(&ListParams::default())
        .await
        .expect("pods are readable");

    let msg = expect_code(deploys.get("web").await, 403);
    assert_eq!(
        msg,
        "deployments.apps \"web\" is forbidden: User \"system:serviceaccount:default:agent\" cannot get resource \"deployments\" in API group \"apps\" in the namespace \"default\""
    );
    expect_code(
        Api::<Secret>::default_namespaced(agent.clone())
            .list(&ListParams::default())
            .await,
        403,
    );
    expect_code(
        Api::<Pod>::namespaced(agent.clone(), "kube-system")
            .list(&ListParams::default())
            .await,
        403,
    );

    // Unknown tokens are 401; kubectl with a token from `kubectl create token`.
    let stranger = cluster
        .client_with_token("not-a-token")
        .await
        .expect("client");
    expect_code(
        Api::<Pod>::default_namespaced(stranger)
            .list(&ListParams::default())
            .await,
        401,
    );
    // `kubectl create token` issues a usable token. (kubectl itself never sends
    // credentials to a plain-http server, so RBAC is exercised through kube-rs.)
    let token = kubectl_ok(&kc, &["create", "token", "agent"]).await;
    let agent_kc = dir.join("agent.kubeconfig");
    std::fs::write(&agent_kc, cluster.kubeconfig_with_token(token.trim())).expect("write");
    let kubeconfig = kube::config::Kubeconfig::read_from(&agent_kc).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    let agent = kube::Client::try_from(config).expect("client");
    Api::<Pod>::default_namespaced(agent.clone())
        .list(&ListParams::default())
        .await
        .expect("pods are readable");
    expect_code(
        Api::<Secret>::default_namespaced(agent)
            .list(&ListParams::default())
            .await,
        403,
    );
    sim.shutdown().await;
}

/// Server-side apply is a `patch`, but an apply that creates the object is authorized as a
/// `create` too, as kube-apiserver does: `patch` alone cannot bring objects into existence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_that_creates_needs_create() {
    let (sim, kc): (Sim, _) = sim_support::start("rbac-apply", fast()).await;
    let cluster = &sim.clusters()[0];
    let manifest = kc.parent().expect("dir").join("patch-only.yaml");
    std::fs::write(
        &manifest,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: patcher, namespace: default}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: patcher, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: patcher}
subjects:
- {kind: ServiceAccount, name: patcher, namespace: default}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: existing, namespace: default}
data: {a: "1"}
"#,
    )
    .expect("write");
    kubectl_ok(&kc, &["apply", "-f", manifest.to_str().unwrap_or_default()]).await;
    let token = cluster.service_account_token("default", "patcher");
    let patcher = cluster.client_with_token(&token).await.expect("client");
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::default_namespaced(patcher);
    let apply = |name: &str| {
        Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name}, "data": {"a": "2"}}))
    };
    let params = PatchParams::apply("test").force();
    maps.patch("existing", &params, &apply("existing"))
        .await
        .expect("applying to an existing object is a patch");
    let msg = expect_code(maps.patch("new", &params, &apply("new")).await, 403);
    assert!(
        msg.contains("cannot create resource \"configmaps\""),
        "{msg}"
    );
    sim.shutdown().await;
}

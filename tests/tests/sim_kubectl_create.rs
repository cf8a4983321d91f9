//! Every object the real kubectl's generators build (`kubectl create …`, `run`, `expose`,
//! `autoscale`) reaches kedge-sim as protobuf; each must be accepted and read back.

mod sim_support;

use futures::StreamExt;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, WatchEvent, WatchParams};
use sim_support::{fast, kubectl, kubectl_ok, start};

async fn get(kc: &std::path::Path, what: &[&str], jsonpath: &str) -> String {
    let path = format!("jsonpath={jsonpath}");
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    args.extend_from_slice(&["-o", &path]);
    kubectl_ok(kc, &args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_run_expose_autoscale() {
    let (sim, kc) = start("create", fast()).await;
    let creates: &[&[&str]] = &[
        &["create", "namespace", "shop"],
        &["create", "serviceaccount", "robot"],
        &["create", "configmap", "cfg", "--from-literal=a=b"],
        &[
            "create",
            "secret",
            "generic",
            "creds",
            "--from-literal=u=admin",
        ],
        &[
            "create",
            "secret",
            "docker-registry",
            "pull",
            "--docker-server=r.io",
            "--docker-username=u",
            "--docker-password=p",
        ],
        &[
            "create",
            "role",
            "reader",
            "--verb=get,list",
            "--resource=pods",
        ],
        &[
            "create",
            "rolebinding",
            "robot-reads",
            "--role=reader",
            "--serviceaccount=default:robot",
        ],
        &[
            "create",
            "clusterrole",
            "viewer",
            "--verb=get",
            "--resource=nodes",
        ],
        &[
            "create",
            "clusterrolebinding",
            "robot-views",
            "--clusterrole=viewer",
            "--user=alice",
        ],
        &["create", "deployment", "web", "--image=nginx", "--port=80"],
        &[
            "create",
            "job",
            "once",
            "--image=busybox",
            "--",
            "echo",
            "hi",
        ],
        &[
            "create",
            "cronjob",
            "tick",
            "--image=busybox",
            "--schedule=*/5 * * * *",
            "--",
            "date",
        ],
        &["create", "service", "clusterip", "db", "--tcp=5432:5432"],
        &["create", "service", "nodeport", "np", "--tcp=80:8080"],
        &[
            "run",
            "shell",
            "--image=busybox",
            "--labels=app=shell",
            "--env=A=1",
            "--port=8080",
            "--",
            "sleep",
            "3600",
        ],
        &[
            "expose",
            "deployment",
            "web",
            "--port=8080",
            "--target-port=80",
        ],
        &[
            "autoscale",
            "deployment",
            "web",
            "--min=1",
            "--max=3",
            "--cpu-percent=50",
        ],
    ];
    for args in creates {
        let out = kubectl(&kc, args).await;
        assert!(
            out.ok,
            "kubectl {args:?} failed:\n{}\n{}",
            out.stdout, out.stderr
        );
        assert!(
            ["created", "exposed", "autoscaled"]
                .iter()
                .any(|w| out.stdout.contains(w)),
            "kubectl {args:?}: {}",
            out.stdout
        );
    }

    let rb = get(
        &kc,
        &["rolebinding", "robot-reads"],
        "{.roleRef.name} {.subjects[0].kind}:{.subjects[0].namespace}/{.subjects[0].name}",
    )
    .await;
    assert_eq!(rb, "reader ServiceAccount:default/robot");
    let role = get(
        &kc,
        &["role", "reader"],
        "{.rules[0].verbs} {.rules[0].resources}",
    )
    .await;
    assert_eq!(role, r#"["get","list"] ["pods"]"#);
    let cj = get(
        &kc,
        &["cronjob", "tick"],
        "{.spec.schedule} {.spec.jobTemplate.spec.template.spec.containers[0].command}",
    )
    .await;
    assert_eq!(cj, r#"*/5 * * * * ["date"]"#);
    let svc = get(
        &kc,
        &["service", "db"],
        "{.spec.type} {.spec.ports[0].port} {.spec.ports[0].targetPort} {.spec.selector.app}",
    )
    .await;
    assert_eq!(svc, "ClusterIP 5432 5432 db");
    let svc = get(
        &kc,
        &["service", "web"],
        "{.spec.ports[0].port} {.spec.ports[0].targetPort} {.spec.selector.app}",
    )
    .await;
    assert_eq!(svc, "8080 80 web");
    let pod = get(&kc, &["pod", "shell"], "{.metadata.labels.app} {.spec.containers[0].env[0].value} {.spec.containers[0].ports[0].containerPort} {.spec.containers[0].args}").await;
    assert_eq!(pod, r#"shell 1 8080 ["sleep","3600"]"#);
    let pull = get(&kc, &["secret", "pull"], "{.type}").await;
    assert_eq!(pull, "kubernetes.io/dockerconfigjson");

    // The autoscaler kubectl wrote in autoscaling/v1 is one object, read in either version.
    let v1 = get(&kc, &["horizontalpodautoscalers.v1.autoscaling", "web"], "{.apiVersion} {.spec.minReplicas}-{.spec.maxReplicas} {.spec.targetCPUUtilizationPercentage}").await;
    assert_eq!(v1, "autoscaling/v1 1-3 50");
    let v2 = get(&kc, &["horizontalpodautoscalers.v2.autoscaling", "web"], "{.apiVersion} {.spec.metrics[0].resource.name} {.spec.metrics[0].resource.target.averageUtilization}").await;
    assert_eq!(v2, "autoscaling/v2 cpu 50");
    kubectl_ok(
        &kc,
        &[
            "patch",
            "horizontalpodautoscalers.v1.autoscaling",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"targetCPUUtilizationPercentage":70}}"#,
        ],
    )
    .await;
    let v2 = get(
        &kc,
        &["hpa", "web"],
        "{.spec.metrics[0].resource.target.averageUtilization}",
    )
    .await;
    assert_eq!(v2, "70");

    // A watch in autoscaling/v1 streams the v1 view of the stored object.
    let client = sim
        .cluster("create")
        .expect("cluster")
        .client()
        .expect("client");
    let v1 = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("autoscaling", "v1", "HorizontalPodAutoscaler"),
        "horizontalpodautoscalers",
    );
    let hpas: Api<DynamicObject> = Api::namespaced_with(client, "default", &v1);
    let mut events = hpas
        .watch(&WatchParams::default().timeout(5), "0")
        .await
        .expect("watch")
        .boxed();
    let Some(Ok(WatchEvent::Added(hpa))) = events.next().await else {
        panic!("no ADDED event");
    };
    assert_eq!(hpa.types.expect("types").api_version, "autoscaling/v1");
    assert_eq!(hpa.data["spec"]["targetCPUUtilizationPercentage"], 70);
    assert!(hpa.data["spec"].get("metrics").is_none(), "{:?}", hpa.data);
    sim.shutdown().await;
}

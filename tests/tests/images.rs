//! The container images' Dockerfiles agree with what runs them: no container engine is
//! available here to build them, so these checks are what keeps them honest. Each runtime
//! stage runs as the user the rendered Deployments (and so the charts, tested equal to them)
//! require, starts the binary its build stage compiles, and is published under the name the
//! installs pull.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kedge_hub::install::agent::DEFAULT_IMAGE as AGENT_IMAGE;
use kedge_hub::install::hub_deployment::DEFAULT_HUB_IMAGE;
use kedge_hub::install::{
    AgentInstall, AgentNamespaces, Credentials, HubDeployment, agent_manifests, hub_manifests,
};
use serde_json::Value;

fn dockerfile(binary: &str) -> String {
    let path = format!(
        "{}/../deploy/images/{binary}.Dockerfile",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The lines of the last stage (what the image runs).
fn runtime_stage(text: &str) -> Vec<&str> {
    let start = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with("FROM "))
        .map(|(i, _)| i)
        .last()
        .expect("a FROM line");
    text.lines().skip(start).collect()
}

fn run_as_user(objects: &[Value]) -> i64 {
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
        .as_i64()
        .expect("runAsUser")
}

/// `profile`: the Cargo profile the image's build stage compiles with.
fn check(binary: &str, image: &str, user: i64, profile: &str) {
    let text = dockerfile(binary);
    let stage = runtime_stage(&text);
    assert!(stage[0].contains("distroless"), "{binary}: {}", stage[0]);
    assert!(
        stage.contains(&format!("USER {user}:{user}").as_str()),
        "{binary} must run as {user}, the Deployment's runAsUser: {stage:?}"
    );
    let entrypoint = format!("ENTRYPOINT [\"/usr/local/bin/{binary}\"]");
    assert!(stage.contains(&entrypoint.as_str()), "{binary}: {stage:?}");
    let flag = match profile {
        "release" => "--release".to_owned(),
        other => format!("--profile {other}"),
    };
    assert!(
        text.contains(&format!(
            "cargo build {flag} --locked -p {binary} --bin {binary}"
        )),
        "{binary}: the build stage must compile {binary} with the {profile} profile"
    );
    assert!(
        text.contains(&format!("cp target/{profile}/{binary} /{binary}")),
        "{binary}: the image must take the binary of the {profile} profile"
    );
    let manifest = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml"),
    )
    .unwrap();
    assert!(
        profile == "release" || manifest.contains(&format!("[profile.{profile}]")),
        "the workspace defines no profile {profile}"
    );
    assert!(
        text.contains(&format!("-t {image}:")),
        "{binary}: published as {image}, what the installs pull"
    );
}

#[test]
fn the_agent_image_runs_what_its_deployment_expects() {
    let install = AgentInstall::new(
        vec!["hub.example:7443".into()],
        "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n".into(),
        Credentials::Bootstrap {
            token: "edge-1.t".into(),
        },
        AgentNamespaces::Only(vec!["apps".into()]),
    );
    check(
        "kedge-agent",
        AGENT_IMAGE,
        run_as_user(&agent_manifests(&install)),
        "agent",
    );
}

#[test]
fn the_hub_image_runs_what_its_deployment_expects() {
    let objects = hub_manifests(&HubDeployment::default());
    check(
        "kedge-hub",
        DEFAULT_HUB_IMAGE,
        run_as_user(&objects),
        "release",
    );
}

//! The committed CRDs are exactly what the Rust types generate.

use std::path::Path;
use std::process::Command;

#[test]
fn committed_crds_match_the_types() {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-kedge"))
        .arg("crds")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated = String::from_utf8(out.stdout).unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds/kedge.dev.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        generated == committed,
        "{} is out of date with the Rust types: run `make crds` and commit the result",
        path.display()
    );
    for kind in [
        "DistributedScaledObject",
        "DistributedScaledJob",
        "MemberCluster",
    ] {
        assert!(
            generated.contains(&format!("kind: {kind}")),
            "{kind} missing"
        );
    }
}

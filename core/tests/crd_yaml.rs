//! The CRD YAML shipped in `deploy/crds/` is exactly what the Rust types generate; CI fails
//! on drift. Regenerate with `KEDGE_UPDATE_CRDS=1 cargo test -p kedge-core --test crd_yaml`.

use std::path::PathBuf;

fn rendered() -> Vec<(String, String)> {
    kedge_core::crd::shipped_crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml = serde_yaml::to_string(&crd).expect("CRDs serialize");
            (
                format!("{name}.yaml"),
                format!("# Generated from kedge-core's Rust types; do not edit.\n{yaml}"),
            )
        })
        .collect()
}

#[test]
fn shipped_crds_match_the_types() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    let update = std::env::var_os("KEDGE_UPDATE_CRDS").is_some();
    if update {
        std::fs::create_dir_all(&dir).expect("create deploy/crds");
    }
    for (file, yaml) in rendered() {
        let path = dir.join(&file);
        if update {
            std::fs::write(&path, &yaml).expect("write CRD");
            continue;
        }
        let shipped = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            shipped == yaml,
            "deploy/crds/{file} is out of date: run KEDGE_UPDATE_CRDS=1 cargo test -p kedge-core --test crd_yaml"
        );
    }
}

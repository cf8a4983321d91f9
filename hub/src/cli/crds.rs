//! `kubectl kedge crds`: the CustomResourceDefinitions of kedge, generated from the Rust types
//! (the same documents as `deploy/crds/`, whose drift test lives in kedge-core).

use super::Result;

/// The CRDs as one multi-document YAML stream.
pub fn render() -> Result<String> {
    let mut out = String::new();
    for crd in kedge_core::crd::shipped_crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}

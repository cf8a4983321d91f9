//! The one way hub and agent build a Kubernetes client, so both read kubeconfigs alike.

use std::path::Path;

use crate::{Error, Result};

/// A client for the cluster in `kubeconfig`; without one: in-cluster (ServiceAccount), then
/// `$KUBECONFIG`, then `~/.kube/config`.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| Error::KubeConfig(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| Error::KubeConfig(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            Error::KubeConfig(format!(
                "{e}; run in a pod with a ServiceAccount or pass --kubeconfig"
            ))
        })?,
    };
    kube::Client::try_from(config).map_err(|e| Error::KubeConfig(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_kubeconfig_names_the_file() {
        let Err(err) = client(Some(Path::new("/nonexistent/kubeconfig"))).await else {
            panic!("a client from a file that does not exist");
        };
        assert!(err.to_string().contains("/nonexistent/kubeconfig"), "{err}");
    }
}

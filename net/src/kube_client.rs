//! The one way hub and agent build a Kubernetes client, so both read kubeconfigs alike.

use std::path::Path;

use crate::{Error, Result};

/// A client for the cluster in `kubeconfig`; without one: in-cluster (ServiceAccount), then
/// `$KUBECONFIG`, then `~/.kube/config`.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client> {
    client_in(kubeconfig, None).await
}

/// A client for `context` of `kubeconfig` (`$KUBECONFIG`, then `~/.kube/config`, without
/// one), as `kubectl --context` picks it; no context: as [`client`].
pub async fn client_in(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<kube::Client> {
    let config = config(kubeconfig, context).await?;
    kube::Client::try_from(config).map_err(|e| Error::KubeConfig(e.to_string()))
}

async fn config(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<kube::Config> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let named = |e: &dyn std::fmt::Display| match context {
        Some(c) => format!("context {c:?}: {e}"),
        None => e.to_string(),
    };
    Ok(match (kubeconfig, context) {
        (Some(path), _) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| Error::KubeConfig(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| Error::KubeConfig(format!("{}: {}", path.display(), named(&e))))?
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| Error::KubeConfig(named(&e)))?,
        (None, None) => kube::Config::infer().await.map_err(|e| {
            Error::KubeConfig(format!(
                "{e}; run in a pod with a ServiceAccount or pass --kubeconfig"
            ))
        })?,
    })
}

/// Objects a paged list reads a request ([`list_paged`]): kubectl's `--chunk-size`.
pub const LIST_PAGE: u32 = 500;

/// Every object `params` selects, read `page` objects a request (each page's continue token
/// to the next request), each kept as `keep` makes it: a large list is never one response
/// in memory at once, and nothing `keep` drops outlives its page.
pub async fn list_paged<K, T>(
    api: &kube::Api<K>,
    params: &kube::api::ListParams,
    page: u32,
    mut keep: impl FnMut(K) -> T,
) -> std::result::Result<Vec<T>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = params.clone().limit(page.max(1));
    let mut kept = Vec::new();
    loop {
        let list = api.list(&params).await?;
        kept.extend(list.items.into_iter().map(&mut keep));
        match list.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(kept),
        }
    }
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

    #[tokio::test]
    async fn a_context_picks_its_cluster_and_an_unknown_one_is_named() {
        let dir = std::env::temp_dir().join(format!("kedge-kube-client-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kubeconfig");
        let yaml = "apiVersion: v1\nkind: Config\nclusters:\n\
            - {name: a, cluster: {server: 'http://127.0.0.1:1001'}}\n\
            - {name: b, cluster: {server: 'http://127.0.0.1:1002'}}\n\
            contexts:\n\
            - {name: a, context: {cluster: a, user: u}}\n\
            - {name: b, context: {cluster: b, user: u}}\n\
            current-context: a\nusers:\n- {name: u, user: {}}\n";
        std::fs::write(&path, yaml).unwrap();
        let url = |c: kube::Config| c.cluster_url.to_string();
        let current = config(Some(&path), None).await.unwrap();
        assert_eq!(url(current), "http://127.0.0.1:1001/");
        let b = config(Some(&path), Some("b")).await.unwrap();
        assert_eq!(url(b), "http://127.0.0.1:1002/");
        let Err(err) = config(Some(&path), Some("nope")).await else {
            panic!("a context the kubeconfig does not have");
        };
        assert!(err.to_string().contains("context \"nope\""), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! Reading Kubernetes objects cheaply: kinds decoded with only the fields the agent reads
//! (a pod's or node's full object is many times larger), and lists read a page at a time, so
//! that what one list holds in memory does not grow with the cluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::ListParams;
use serde::de::DeserializeOwned;

/// Objects per page of a list or a watch's list.
pub const LIST_PAGE: u32 = 100;

/// Implements `kube::Resource` for a type decoded with only some fields of a kind:
/// `lite_resource!(Type, "group", "version", "Kind", "plural", Scope)`.
macro_rules! lite_resource {
    ($lite:ty, $group:literal, $version:literal, $kind:literal, $plural:literal, $scope:ty) => {
        impl kube::Resource for $lite {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($kind)
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($group)
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($version)
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($plural)
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use lite_resource;

/// Decodes a pod's metadata without its annotations and managed fields, which no use of a
/// pod reads: an annotation may hold a copy of the whole object (`kubectl apply`'s
/// `last-applied-configuration`, environment values included), and the agent keeps nothing
/// of a pod it does not need. Use as `#[serde(deserialize_with = "slim_meta")]`.
pub fn slim_meta<'de, D>(deserializer: D) -> Result<ObjectMeta, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let mut meta = <ObjectMeta as serde::Deserialize>::deserialize(deserializer)?;
    meta.annotations = None;
    meta.managed_fields = None;
    Ok(meta)
}

/// Lists what `api` and `params` select [`LIST_PAGE`] objects at a time, handing each page
/// to `each`: only one page is held at once.
pub async fn for_each_page<K>(
    api: &Api<K>,
    params: ListParams,
    mut each: impl FnMut(Vec<K>),
) -> kube::Result<()>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut params = params.limit(LIST_PAGE);
    loop {
        let page = api.list(&params).await?;
        let next = page.metadata.continue_.filter(|token| !token.is_empty());
        each(page.items);
        match next {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pod_keeps_no_annotation_or_managed_field() {
        let pod: crate::observe::PodUsage = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "p", "namespace": "apps", "labels": {"app": "web"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration":
                    "{\"spec\":{\"containers\":[{\"env\":[{\"name\":\"PASSWORD\",\"value\":\"hunter2\"}]}]}}"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]
            },
            "spec": {"nodeName": "n", "containers": [{"name": "c",
                "env": [{"name": "PASSWORD", "value": "hunter2"}],
                "resources": {"requests": {"cpu": "1"}}}]}
        }))
        .unwrap();
        assert_eq!(pod.metadata.annotations, None);
        assert_eq!(pod.metadata.managed_fields, None);
        assert_eq!(pod.metadata.labels.unwrap()["app"], "web");
        assert!(!format!("{:?}", pod.spec).contains("hunter2"));
    }
}

//! Pod names for the exporter's labels. A region's directory names only
//! the pod's UID (`{podUID}_{container}`); HAMi's dashboards group by
//! namespace and pod name, which the Kubernetes API's pod list gives.
//!
//! In a cluster (`KUBERNETES_SERVICE_HOST` set) the list is read over
//! HTTPS with the pod's service-account token and CA, limited to this node
//! when `NODE_NAME` is set (the DaemonSet passes it); `--api-server URL`
//! names another server instead (`kubectl proxy`, tests), without a token.
//! The list is refreshed at every rescan; when it cannot be read the last
//! names stay, and a region whose pod is not listed keeps its UID as its
//! pod's name and an empty namespace.

use std::collections::HashMap;
use std::io::Read;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::snapshot::Owner;

const ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The most a pod list may take, and may weigh.
const TIMEOUT: Duration = Duration::from_secs(5);
const MAX_BYTES: u64 = 64 << 20;

/// Where the pod list comes from.
pub struct Source {
    url: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl Source {
    /// `--api-server`, else the cluster the exporter runs in, else none.
    pub fn find(api_server: Option<&str>) -> Result<Option<Source>, String> {
        let node = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty());
        let query = match &node {
            Some(n) => format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{n}"),
            None => "/api/v1/pods".to_string(),
        };
        if let Some(base) = api_server {
            return Ok(Some(Source {
                url: format!("{}{query}", base.trim_end_matches('/')),
                token: None,
                agent: agent(None),
            }));
        }
        let (Ok(host), Ok(port)) = (
            std::env::var("KUBERNETES_SERVICE_HOST"),
            std::env::var("KUBERNETES_SERVICE_PORT"),
        ) else {
            return Ok(None);
        };
        let token = std::fs::read_to_string(format!("{ACCOUNT}/token"))
            .map_err(|e| format!("{ACCOUNT}/token: {e}"))?;
        let ca = std::fs::read(format!("{ACCOUNT}/ca.crt"))
            .map_err(|e| format!("{ACCOUNT}/ca.crt: {e}"))?;
        let certs: Vec<_> = ureq::tls::parse_pem(&ca)
            .filter_map(|item| match item {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c.to_owned()),
                _ => None,
            })
            .collect();
        if certs.is_empty() {
            return Err(format!("{ACCOUNT}/ca.crt holds no certificate"));
        }
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        Ok(Some(Source {
            url: format!("https://{host}:{port}{query}"),
            token: Some(token.trim().to_string()),
            agent: agent(Some(certs)),
        }))
    }

    /// UID -> (namespace, name) of every pod listed.
    fn list(&self) -> Result<HashMap<String, (String, String)>, String> {
        let mut req = self.agent.get(&self.url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", &format!("Bearer {t}"));
        }
        let mut resp = req.call().map_err(|e| format!("{}: {e}", self.url))?;
        let mut body = String::new();
        resp.body_mut()
            .as_reader()
            .take(MAX_BYTES)
            .read_to_string(&mut body)
            .map_err(|e| format!("{}: {e}", self.url))?;
        parse_pod_list(&body).map_err(|e| format!("{}: {e}", self.url))
    }
}

fn agent(roots: Option<Vec<ureq::tls::Certificate<'static>>>) -> ureq::Agent {
    let mut config = ureq::Agent::config_builder().timeout_global(Some(TIMEOUT));
    if let Some(certs) = roots {
        config = config.tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)))
                .build(),
        );
    }
    config.build().into()
}

/// UID -> (namespace, name) from a `PodList` (the API's JSON).
pub fn parse_pod_list(json: &str) -> Result<HashMap<String, (String, String)>, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("not a pod list: {e}"))?;
    let items = v
        .get("items")
        .and_then(|i| i.as_array())
        .ok_or("not a pod list: no items")?;
    Ok(items
        .iter()
        .filter_map(|pod| {
            let m = pod.get("metadata")?;
            let field = |k: &str| m.get(k)?.as_str().map(str::to_string);
            Some((field("uid")?, (field("namespace")?, field("name")?)))
        })
        .collect())
}

/// The names learnt so far, shared by the rescan thread and scrapes.
#[derive(Clone, Default)]
pub struct PodNames {
    by_uid: Arc<Mutex<HashMap<String, (String, String)>>>,
}

impl PodNames {
    /// Reads the list again; on failure keeps the last one (Err says why).
    pub fn refresh(&self, source: &Source) -> Result<(), String> {
        let list = source.list()?;
        *self.by_uid.lock().unwrap_or_else(PoisonError::into_inner) = list;
        Ok(())
    }

    /// Gives `owner` its pod's namespace and name, when listed.
    pub fn name(&self, owner: &mut Owner) {
        let names = self.by_uid.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((namespace, name)) = names.get(&owner.pod_uid) {
            owner.namespace.clone_from(namespace);
            owner.pod.clone_from(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_list_gives_namespaces_and_names_by_uid() {
        let json = r#"{"kind":"PodList","items":[
            {"metadata":{"uid":"u1","namespace":"ml","name":"trainer-0"}},
            {"metadata":{"uid":"u2","namespace":"default"}},
            {"spec":{}}]}"#;
        let list = parse_pod_list(json).unwrap();
        assert_eq!(list.len(), 1);
        let names = PodNames::default();
        *names.by_uid.lock().unwrap() = list;
        let mut o = crate::scan::owner_of("u1_main").unwrap();
        names.name(&mut o);
        assert_eq!((o.namespace.as_str(), o.pod.as_str()), ("ml", "trainer-0"));
        let mut unknown = crate::scan::owner_of("u9_main").unwrap();
        names.name(&mut unknown);
        assert_eq!(
            (unknown.namespace.as_str(), unknown.pod.as_str()),
            ("", "u9")
        );
        assert!(parse_pod_list("{\"kind\":\"Status\"}").is_err());
        assert!(parse_pod_list("<html>").is_err());
    }
}

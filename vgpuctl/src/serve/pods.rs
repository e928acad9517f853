//! Pod names for the exporter's labels. A region's directory names only
//! the pod's UID (`{podUID}_{container}`); HAMi's dashboards group by
//! namespace and pod name, which the Kubernetes API's pod list gives.
//!
//! In a cluster (`KUBERNETES_SERVICE_HOST` set) the list is read over
//! HTTPS with the pod's service-account token and CA, limited to this node
//! when `NODE_NAME` is set (the DaemonSet passes it); `--api-server URL`
//! names another server instead (`kubectl proxy`, tests), with the token in
//! `$VGPU_API_TOKEN_FILE` if set, else none.
//! The token file is read again for every request (the kubelet rotates
//! it). `podwatch` keeps the names current with one LIST and then a WATCH
//! from its resourceVersion; when the list cannot be read the last names
//! stay, and a region whose pod is not listed keeps its UID as its pod's
//! name and an empty namespace.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::snapshot::Owner;

const ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The most a pod list may take, and may weigh.
const TIMEOUT: Duration = Duration::from_secs(5);
const MAX_BYTES: u64 = 64 << 20;

/// UID -> (namespace, name).
pub type Names = HashMap<String, (String, String)>;

/// Where the pod list comes from.
pub struct Source {
    /// `https://host:port` (or `--api-server`).
    base: String,
    /// The node's field selector, URL-encoded, or empty.
    selector: String,
    /// The service-account token file, read for every request.
    token: Option<PathBuf>,
    agent: ureq::Agent,
    /// For watches: no global timeout (the server ends them).
    stream_agent: ureq::Agent,
}

impl Source {
    /// `--api-server`, else the cluster the exporter runs in, else none.
    pub fn find(api_server: Option<&str>) -> Result<Option<Source>, String> {
        let node = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty());
        let selector = match &node {
            Some(n) => format!("fieldSelector=spec.nodeName%3D{n}"),
            None => String::new(),
        };
        if let Some(base) = api_server {
            // A token for it, if any, from $VGPU_API_TOKEN_FILE.
            let token = std::env::var_os("VGPU_API_TOKEN_FILE")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from);
            return Ok(Some(Source {
                base: base.trim_end_matches('/').to_string(),
                selector,
                token,
                agent: agent(None, Some(TIMEOUT)),
                stream_agent: agent(None, None),
            }));
        }
        let (Ok(host), Ok(port)) = (
            std::env::var("KUBERNETES_SERVICE_HOST"),
            std::env::var("KUBERNETES_SERVICE_PORT"),
        ) else {
            return Ok(None);
        };
        let token = PathBuf::from(format!("{ACCOUNT}/token"));
        std::fs::read_to_string(&token).map_err(|e| format!("{}: {e}", token.display()))?;
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
            base: format!("https://{host}:{port}"),
            selector,
            token: Some(token),
            agent: agent(Some(certs.clone()), Some(TIMEOUT)),
            stream_agent: agent(Some(certs), None),
        }))
    }

    /// The pods URL with `extra` query parameters (`&`-joined).
    pub fn url(&self, extra: &str) -> String {
        let q: Vec<&str> = [self.selector.as_str(), extra]
            .into_iter()
            .filter(|p| !p.is_empty())
            .collect();
        match q.is_empty() {
            true => format!("{}/api/v1/pods", self.base),
            false => format!("{}/api/v1/pods?{}", self.base, q.join("&")),
        }
    }

    /// A GET of `url`, with the token as it is now on disk.
    pub fn get(&self, url: &str, stream: bool) -> Result<ureq::http::Response<ureq::Body>, String> {
        let agent = if stream {
            &self.stream_agent
        } else {
            &self.agent
        };
        let mut req = agent.get(url);
        if let Some(path) = &self.token {
            let t =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            req = req.header("Authorization", &format!("Bearer {}", t.trim()));
        }
        req.call().map_err(|e| format!("{url}: {e}"))
    }

    /// Every pod listed, and the list's resourceVersion.
    pub fn list(&self) -> Result<(Names, String), String> {
        let url = self.url("");
        let mut resp = self.get(&url, false)?;
        let mut body = String::new();
        resp.body_mut()
            .as_reader()
            .take(MAX_BYTES)
            .read_to_string(&mut body)
            .map_err(|e| format!("{url}: {e}"))?;
        let names = parse_pod_list(&body).map_err(|e| format!("{url}: {e}"))?;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let rv = v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        Ok((names, rv))
    }
}

fn agent(
    roots: Option<Vec<ureq::tls::Certificate<'static>>>,
    timeout: Option<Duration>,
) -> ureq::Agent {
    let mut config = ureq::Agent::config_builder().timeout_global(timeout);
    if let Some(certs) = roots {
        config = config.tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)))
                .build(),
        );
    }
    config.build().into()
}

/// (UID, (namespace, name)) of one pod object, if it has them.
pub fn pod_entry(pod: &serde_json::Value) -> Option<(String, (String, String))> {
    let m = pod.get("metadata")?;
    let field = |k: &str| m.get(k)?.as_str().map(str::to_string);
    Some((field("uid")?, (field("namespace")?, field("name")?)))
}

/// UID -> (namespace, name) from a `PodList` (the API's JSON).
pub fn parse_pod_list(json: &str) -> Result<Names, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("not a pod list: {e}"))?;
    let items = v
        .get("items")
        .and_then(|i| i.as_array())
        .ok_or("not a pod list: no items")?;
    Ok(items.iter().filter_map(pod_entry).collect())
}

#[derive(Default)]
struct State {
    by_uid: Names,
    /// When the names last were known to be complete (a LIST, or a watch
    /// event or its end); None while they are not.
    synced: Option<Instant>,
}

/// The names learnt so far, shared by the pod watcher and scrapes.
#[derive(Clone, Default)]
pub struct PodNames {
    state: Arc<Mutex<State>>,
}

impl PodNames {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the list again; on failure keeps the last one (Err says why).
    /// Returns the list's resourceVersion.
    pub fn refresh(&self, source: &Source) -> Result<String, String> {
        let (list, rv) = source.list()?;
        let mut s = self.lock();
        s.by_uid = list;
        s.synced = Some(Instant::now());
        Ok(rv)
    }

    /// A pod added or changed (`Some`) or deleted (`None`).
    pub fn apply(&self, uid: String, entry: Option<(String, String)>) {
        let mut s = self.lock();
        match entry {
            Some(e) => s.by_uid.insert(uid, e),
            None => s.by_uid.remove(&uid),
        };
    }

    /// The watch is current (`true`) or broken (`false`).
    pub fn set_synced(&self, yes: bool) {
        self.lock().synced = yes.then(Instant::now);
    }

    /// Whether pod `uid` is listed, None unless the names were complete
    /// within `fresh`.
    pub fn listed(&self, uid: &str, fresh: Duration) -> Option<bool> {
        let s = self.lock();
        s.synced
            .filter(|t| t.elapsed() <= fresh)
            .map(|_| s.by_uid.contains_key(uid))
    }

    /// Gives `owner` its pod's namespace and name, when listed.
    pub fn name(&self, owner: &mut Owner) {
        let names = self.lock();
        if let Some((namespace, name)) = names.by_uid.get(&owner.pod_uid) {
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
        names.lock().by_uid = list;
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
